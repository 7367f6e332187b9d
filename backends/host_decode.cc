#include "backends/host_decode.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "wire/half.h"

namespace driftkv {

absl::Status DecodePageTokens(const DQuantCodec& codec, const PagePool& pool, PageId page, int first, int count,
                              const LayerTransform* transform, bool values_folded, float* keys, float* values,
                              CodecScratch* scratch) {
  const PageLayout& layout = pool.layout();
  const int n = layout.n();
  const uint8_t* base = pool.key_records(page);
  const uint8_t* mean = base + layout.mean_offset;
  for (int t = 0; t < count; ++t) {
    const int i = first + t;
    absl::Status st = codec.DecodeKey(base + layout.key_record(i), mean, keys + static_cast<size_t>(t) * n, scratch);
    if (st.ok()) st = codec.DecodeValue(base + layout.value_record(i), values + static_cast<size_t>(t) * n, scratch);
    if (!st.ok()) return absl::DataLossError(absl::StrCat("page ", page, " token ", i, ": ", st.message()));
  }
  if (transform != nullptr) {
    transform->Apply(Mat::kKeyInverse, keys, count, keys);
    if (!values_folded) transform->Apply(Mat::kValueInverse, values, count, values);
  }
  return absl::OkStatus();
}

absl::Status DecodeLevelPageTokens(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* page,
                                   PageId id, int first, int count, const LayerTransform* transform, bool values_folded,
                                   float* keys, float* values, CodecScratch* scratch) {
  const int n = layout.n();
  std::vector<uint8_t> key_levels(static_cast<size_t>(kLevelPageTokens) * n), value_levels(key_levels.size());
  std::vector<uint32_t> key_headers(kLevelPageTokens), value_headers(kLevelPageTokens);
  std::vector<uint8_t> mean(static_cast<size_t>(4 + n));
  UnpackLevelPage(layout, page, key_levels.data(), value_levels.data(), key_headers.data(), value_headers.data(),
                  mean.data());
  const int key_m = codec.config().key_levels, value_m = codec.config().value_levels;
  for (int t = 0; t < count; ++t) {
    const int i = first + t;
    const uint8_t* kl = key_levels.data() + static_cast<size_t>(i) * n;
    const uint8_t* vl = value_levels.data() + static_cast<size_t>(i) * n;
    for (int j = 0; j < n; ++j) {
      if (kl[j] >= key_m || vl[j] >= value_m) {
        return absl::DataLossError(absl::StrCat("hot page ", id, " token ", i, ": level out of range at channel ", j));
      }
    }
    // The cold record's decoder refuses a non-finite grid; so does this.
    float ks, ko, vs, vo;
    if (!LevelHeaderGrid(key_headers[i], &ks, &ko) || !LevelHeaderGrid(value_headers[i], &vs, &vo)) {
      return absl::DataLossError(absl::StrCat("hot page ", id, " token ", i, ": grid (scale/offset) is not finite"));
    }
    codec.KeyFromSymbols(kl, ks, ko, mean.data(), keys + static_cast<size_t>(t) * n, scratch);
    codec.ValueFromSymbols(vl, vs, vo, values + static_cast<size_t>(t) * n);
  }
  if (transform != nullptr) {
    transform->Apply(Mat::kKeyInverse, keys, count, keys);
    if (!values_folded) transform->Apply(Mat::kValueInverse, values, count, values);
  }
  return absl::OkStatus();
}

}  // namespace driftkv
