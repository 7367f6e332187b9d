// The per-tenant quotas a server runs with (docs/security.md, "Quotas"):
// config tenant_max_* are every tenant's defaults and the tokens file's
// max_*= lines override them for their tenant. With tokens, two rules
// keep one tenant from starving the others:
//   - sequences are a guarantee: every tenant's max_sequences is finite
//     and they add up to at most max_sequences, so a tenant below its own
//     limit always finds room in the table. Unset, tenant_max_sequences is
//     an equal share of what max_sequences leaves after the lines that set
//     their own (floor; none left is an error);
//   - NCCL channels are a cap: unset, tenant_max_nccl_channels is
//     nccl_max_channels divided by the file's tenants (at least 1).
// Bytes and pages have no default (0: unlimited); the sample configs set
// them.
#ifndef DRIFTKV_SERVICE_TENANT_QUOTAS_H_
#define DRIFTKV_SERVICE_TENANT_QUOTAS_H_

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "service/config.h"

namespace driftkv {

// Every tenant's default quotas from `settings` by the rules above, for
// the tenants of `tokens` (null: no tokens; the settings as written, 0 for
// unset); InvalidArgument naming the fields and their values when the
// rules cannot hold. `tokens_file` names the file in messages.
absl::StatusOr<TenantQuota> ResolveTenantDefaults(const TenantQuotaSettings& settings, const TokenTable* tokens,
                                                  const std::string& tokens_file, uint64_t max_sequences,
                                                  uint32_t nccl_max_channels);

// Sets o->tenant_settings from `c` and o->tenant_defaults by
// ResolveTenantDefaults for o->tokens. REQUIRES: o->tokens (null without
// tokens), o->tokens_file, o->max_sequences and o->nccl_max_channels
// resolved.
absl::Status ResolveTenantQuotas(const v1::ServerConfig& c, ServiceOptions* o);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TENANT_QUOTAS_H_
