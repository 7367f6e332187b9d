#include "wire/tenant_name.h"

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::Status CheckTenantName(absl::string_view name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant \"", name, "\" has ", name.size(), " bytes; it must have 1 to 64"));
  }
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat("tenant \"", name, "\" has a byte outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace driftkv
