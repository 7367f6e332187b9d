#include "codec/baselines/tokenwise_codec.h"

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"

namespace driftkv {
namespace baselines {
namespace {

void Count(size_t stride, int n, int count, StreamStats* s) {
  s->streams += count;
  s->symbols += static_cast<int64_t>(count) * n;
  s->bytes_used += static_cast<int64_t>(count) * stride;
  s->bytes_budget += static_cast<int64_t>(count) * stride;
}

}  // namespace

absl::Status TokenwiseCodec::EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                                         uint8_t* value_records, uint8_t* /*side*/, CodecScratch* scratch,
                                         CodecStats* stats) const {
  if (count < 1 || count > block_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block of ", count, " tokens out of range [1, ", block_tokens(), "]"));
  }
  const int n = this->n();
  absl::Status st = CheckInput(keys, count, n, fp16_metadata_, "key");
  if (st.ok()) st = CheckInput(values, count, n, fp16_metadata_, "value");
  if (!st.ok()) return st;
  for (int t = 0; t < count; ++t) {
    EncodeStream(true, keys + static_cast<size_t>(t) * n, key_records + t * key_stride(), scratch);
    EncodeStream(false, values + static_cast<size_t>(t) * n, value_records + t * value_stride(), scratch);
  }
  if (stats != nullptr) {
    Count(key_stride(), n, count, &stats->keys);
    Count(value_stride(), n, count, &stats->values);
  }
  return absl::OkStatus();
}

absl::Status TokenwiseCodec::DecodeBlock(const uint8_t* key_records, const uint8_t* value_records,
                                         const uint8_t* /*side*/, int count, float* keys, float* values,
                                         CodecScratch* scratch) const {
  absl::Status result;
  const size_t n = static_cast<size_t>(this->n());
  for (int t = 0; t < count; ++t) {
    result.Update(DecodeStream(true, key_records + t * key_stride(), keys + t * n, scratch));
    result.Update(DecodeStream(false, value_records + t * value_stride(), values + t * n, scratch));
  }
  return result;
}

}  // namespace baselines
}  // namespace driftkv
