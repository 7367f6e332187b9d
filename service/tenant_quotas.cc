#include "service/tenant_quotas.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

// Each tenant's max_sequences add up to at most max_sequences.
absl::Status CheckGuarantee(const TokenTable& tokens, const TenantQuota& d, uint64_t max_sequences,
                            const std::string& file) {
  uint64_t sum = 0;
  std::string each;
  int listed = 0;
  for (const auto& [tenant, lines] : tokens.Tenants()) {
    const uint64_t q = lines.max_sequences.value_or(d.max_sequences);
    sum = SaturatingAdd(sum, q);
    if (++listed <= 8) absl::StrAppend(&each, listed > 1 ? ", " : "", tenant, " ", q);
  }
  if (listed > 8) absl::StrAppend(&each, ", and ", listed - 8, " more");
  if (sum <= max_sequences) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the max_sequences of the tenants of ", file, " add up to ", sum, " (", each, "; tenant_max_sequences ",
      d.max_sequences, " where no max_sequences= line is given) but max_sequences is ", max_sequences,
      ": with tokens every tenant is guaranteed its own max_sequences, so together they may not exceed "
      "max_sequences; lower tenant_max_sequences or the lines' max_sequences=, or raise max_sequences"));
}

}  // namespace

absl::StatusOr<TenantQuota> ResolveTenantDefaults(const TenantQuotaSettings& settings, const TokenTable* tokens,
                                                  const std::string& tokens_file, uint64_t max_sequences,
                                                  uint32_t nccl_max_channels) {
  TenantQuota d;
  d.max_pages = settings.max_pages.value_or(0);
  d.max_sequences = settings.max_sequences.value_or(0);
  d.max_bytes = settings.max_bytes.value_or(0);
  d.max_nccl_channels = settings.max_nccl_channels.value_or(0);
  if (tokens == nullptr) return d;
  const std::string file = absl::StrCat("tokens_file \"", tokens_file, "\"");
  const auto tenants = tokens->Tenants();
  const uint64_t count = std::max<uint64_t>(1, tenants.size());
  if (!settings.max_nccl_channels.has_value() && nccl_max_channels > 0) {
    d.max_nccl_channels = std::max<uint64_t>(1, static_cast<uint64_t>(nccl_max_channels) / count);
  }
  if (settings.max_sequences.has_value() && *settings.max_sequences == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant_max_sequences 0 (unlimited) with ", file, ": one tenant could hold all max_sequences ", max_sequences,
        " and no other could create a sequence; leave tenant_max_sequences unset for an equal "
        "share of max_sequences, or set a limit"));
  }
  uint64_t given = 0;  // by the lines that set their own
  uint64_t without = 0;
  for (const auto& [tenant, lines] : tenants) {
    if (!lines.max_sequences.has_value()) {
      ++without;
    } else if (*lines.max_sequences == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": tenant \"", tenant, "\" max_sequences=0 (unlimited): it could hold all max_sequences ",
                       max_sequences, " and no other tenant could create a sequence; give it a limit"));
    } else {
      given = SaturatingAdd(given, *lines.max_sequences);
    }
  }
  if (!settings.max_sequences.has_value() && without > 0) {
    const uint64_t left = given < max_sequences ? max_sequences - given : 0;
    d.max_sequences = left / without;
    if (d.max_sequences == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "max_sequences ", max_sequences, " leaves no share for the ", without, " tenants of ", file,
          " without a max_sequences= line (", left, " after the lines' ", given, ", divided among ", without,
          "): raise max_sequences, or set tenant_max_sequences and max_sequences= lines that add up to at most "
          "max_sequences"));
    }
  }
  if (absl::Status st = CheckGuarantee(*tokens, d, max_sequences, file); !st.ok()) return st;
  return d;
}

absl::Status ResolveTenantQuotas(const v1::ServerConfig& c, ServiceOptions* o) {
  TenantQuotaSettings& t = o->tenant_settings;
  t = TenantQuotaSettings();
  if (c.has_tenant_max_pages()) t.max_pages = c.tenant_max_pages();
  if (c.has_tenant_max_sequences()) t.max_sequences = c.tenant_max_sequences();
  if (c.has_tenant_max_bytes()) t.max_bytes = c.tenant_max_bytes();
  if (c.has_tenant_max_nccl_channels()) t.max_nccl_channels = c.tenant_max_nccl_channels();
  absl::StatusOr<TenantQuota> d =
      ResolveTenantDefaults(t, o->tokens.get(), o->tokens_file, o->max_sequences, o->nccl_max_channels);
  if (!d.ok()) return d.status();
  o->tenant_defaults = *d;
  return absl::OkStatus();
}

}  // namespace driftkv
