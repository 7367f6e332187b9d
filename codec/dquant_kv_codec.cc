#include "codec/dquant_kv_codec.h"

namespace driftkv {

absl::Status DQuantKvCodec::DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side,
                                        int count, float* keys, float* values, CodecScratch* scratch) const {
  absl::Status result;
  const size_t n = static_cast<size_t>(this->n());
  for (int t = 0; t < count; ++t) {
    result.Update(codec_.DecodeKey(key_records + t * key_stride(), side, keys + t * n, scratch));
    result.Update(codec_.DecodeValue(value_records + t * value_stride(), values + t * n, scratch));
  }
  return result;
}

}  // namespace driftkv
