// What a caller of a server with tokens may see of Stats: its own
// tenant's figures and the pools' load, nothing that counts another
// tenant's activity (docs/api.md, "Info, Stats", lists each field's scope).
//
// The rule is a list of the fields kept, so a field added to
// StatsResponse later stays hidden from tenants until someone decides its
// scope. Without tokens there is one tenant and nothing to hide: the
// caller sees every field.
#ifndef DRIFTKV_SERVICE_STATS_SCOPE_H_
#define DRIFTKV_SERVICE_STATS_SCOPE_H_

#include "proto/driftkv.pb.h"

namespace driftkv {

// Clears every field of `stats` (filled for one tenant by the handler, the
// channels and the regions) except the caller's own figures (tenant,
// tenant_*, sequences, sequences_released, sequences_expired, tombstones)
// and the pools' capacity and use (pages and bytes, cold, hot and per
// device).
void KeepTenantScope(v1::StatsResponse* stats);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_STATS_SCOPE_H_
