#include "service/prefix_namespaces.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "service/quoted.h"
#include "wire/tenant_name.h"

namespace driftkv {

absl::Status ResolvePrefixNamespaces(const v1::ServerConfig& c, ServiceOptions* o) {
  o->prefix_namespace_of.clear();
  if (c.prefix_namespaces_size() == 0) return absl::OkStatus();
  if (o->tokens == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("prefix_namespaces ", Quoted(c.prefix_namespaces(0).name()),
                                                   " needs tokens_file: without tokens every call is the same tenant"));
  }
  std::set<std::string> known, names;
  for (const auto& [tenant, limits] : o->tokens->Tenants()) known.insert(tenant);
  for (const v1::PrefixNamespace& ns : c.prefix_namespaces()) {
    const std::string where = absl::StrCat("prefix_namespaces ", Quoted(ns.name()));
    if (absl::Status st = CheckTenantName(ns.name()); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the name must be 1 to 64 bytes of [A-Za-z0-9._-]"));
    }
    if (!names.insert(ns.name()).second) return absl::InvalidArgumentError(absl::StrCat(where, " is named twice"));
    if (ns.tenants_size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " lists ", ns.tenants_size(), " tenants; a shared namespace needs at least 2"));
    }
    for (const std::string& tenant : ns.tenants()) {
      if (known.count(tenant) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tenant ", Quoted(tenant),
                                                       " is not a tenant of tokens_file ", Quoted(o->tokens_file)));
      }
      auto [it, inserted] = o->prefix_namespace_of.emplace(tenant, ns.name());
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tenant ", Quoted(tenant),
                                                       " is already in prefix namespace ", Quoted(it->second),
                                                       " (a tenant shares with one namespace at most)"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace driftkv
