// Shared prefix namespaces (config prefix_namespaces; docs/prefix_cache.md,
// "Shared prefix namespaces"): tenants listed under one name find each
// other's indexed pages. Elsewhere a tenant's page keys live in a
// namespace of its own, so tenants never share by default.
#ifndef DRIFTKV_SERVICE_PREFIX_NAMESPACES_H_
#define DRIFTKV_SERVICE_PREFIX_NAMESPACES_H_

#include "absl/status/status.h"
#include "proto/config.pb.h"
#include "service/config.h"

namespace driftkv {

// Sets o->prefix_namespace_of from c.prefix_namespaces(). InvalidArgument
// naming the namespace and the value when: there is no tokens_file (one
// tenant only), a name is not a valid tenant-style name or repeats, a
// namespace lists fewer than two tenants, a tenant is not in tokens_file
// or is listed twice. REQUIRES: o->tokens and o->tokens_file resolved.
absl::Status ResolvePrefixNamespaces(const v1::ServerConfig& c, ServiceOptions* o);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PREFIX_NAMESPACES_H_
