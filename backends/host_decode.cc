#include "backends/host_decode.h"

#include "absl/strings/str_cat.h"

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

}  // namespace driftkv
