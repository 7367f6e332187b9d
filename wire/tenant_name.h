// The rule for tenant names, shared by the server's tokens file
// (service/tokens.h) and the CLI that writes its lines (token-hash).
#ifndef DRIFTKV_WIRE_TENANT_NAME_H_
#define DRIFTKV_WIRE_TENANT_NAME_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace driftkv {

// Tenant names: 1 to 64 bytes of [A-Za-z0-9._-] (so no NUL: table keys
// embed them, service/tenant.h). InvalidArgument naming the name otherwise.
absl::Status CheckTenantName(absl::string_view name);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_TENANT_NAME_H_
