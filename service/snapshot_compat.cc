#include "service/snapshot_compat.h"

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "codec/dquant_codec.h"
#include "service/snapshot_file.h"

namespace driftkv {
namespace {

std::map<std::string, std::string> IdentityFields(absl::string_view identity) {
  std::map<std::string, std::string> fields;
  for (absl::string_view line : absl::StrSplit(identity, '\n', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
    fields.insert(std::move(kv));
  }
  return fields;
}

// One stream: the config's size (0: unset) becomes the snapshot's when it
// is the legacy default and not today's; true if it did.
bool KeepStream(const std::map<std::string, std::string>& fields, const char* key, int n, int reference, int levels,
                double alpha, int* bytes) {
  int stored = 0;
  auto it = fields.find(key);
  if (*bytes != 0 || it == fields.end() || !absl::SimpleAtoi(it->second, &stored)) return false;
  const int legacy = LegacyDefaultPayloadBytes(n, reference, levels, alpha);
  if (stored != legacy || legacy == DefaultPayloadBytes(n, reference, levels, alpha)) return false;
  *bytes = stored;
  return true;
}

}  // namespace

std::string KeepSnapshotPayloads(absl::string_view identity, const std::string& path, ServiceOptions* options) {
  DQuantConfig& c = options->codec;
  if (options->codec_name != "dquant" || (c.key_bytes != 0 && c.value_bytes != 0)) return "";
  if (!c.Validate().ok()) return "";  // Handler::Create reports it
  const std::map<std::string, std::string> fields = IdentityFields(identity);
  const std::pair<const char*, std::string> same[] = {
      {"codec", "dquant"},
      {"kv_heads", absl::StrCat(c.kv_heads)},
      {"head_dim", absl::StrCat(c.head_dim)},
      {"key_levels", absl::StrCat(c.key_levels)},
      {"value_levels", absl::StrCat(c.value_levels)},
      {"alpha", absl::StrFormat("%.17g", c.alpha)},
  };
  for (const auto& [key, value] : same) {
    auto it = fields.find(key);
    if (it == fields.end() || it->second != value) return "";  // LoadSnapshot names the difference
  }
  const int n = c.n();
  const int new_key = DefaultPayloadBytes(n, kReferenceKeyBytes, c.key_levels, c.alpha);
  const int new_value = DefaultPayloadBytes(n, kReferenceValueBytes, c.value_levels, c.alpha);
  std::vector<std::string> kept, now;
  if (KeepStream(fields, "key_payload_bytes", n, kReferenceKeyBytes, c.key_levels, c.alpha, &c.key_bytes)) {
    kept.push_back(absl::StrCat("key_bytes ", c.key_bytes));
    now.push_back(absl::StrCat("key_bytes ", new_key));
  }
  if (KeepStream(fields, "value_payload_bytes", n, kReferenceValueBytes, c.value_levels, c.alpha, &c.value_bytes)) {
    kept.push_back(absl::StrCat("value_bytes ", c.value_bytes));
    now.push_back(absl::StrCat("value_bytes ", new_value));
  }
  if (kept.empty()) return "";
  return absl::StrCat(
      "snapshot ", path, " was written with the earlier default containers of kv_heads x head_dim = ", n, " (",
      absl::StrJoin(kept, ", "), "); keeping them so that it loads (unset, they are now ", absl::StrJoin(now, ", "),
      ": docs/api.md \"Default containers\"); set codec.key_bytes and codec.value_bytes, or move the "
      "snapshot away, to choose");
}

std::string KeepSnapshotPayloads(ServiceOptions* options) {
  if (options->snapshot_dir.empty() || options->codec_name != "dquant") return "";
  const std::string path = SnapshotPath(options->snapshot_dir);
  absl::StatusOr<std::unique_ptr<SnapshotReader>> reader = SnapshotReader::Open(path);
  if (!reader.ok()) return "";  // none, or LoadSnapshot reports why not
  return KeepSnapshotPayloads((*reader)->identity(), path, options);
}

}  // namespace driftkv
