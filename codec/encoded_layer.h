// One layer of one sequence as any KvCodec stores it: the oldest tokens in
// fixed-stride records (blocks of block_tokens() sharing a side record), the
// newest `window` tokens raw in bf16. This is the unit the pool file and the
// evaluation tools work on; the service keeps the same pieces in pages.
#ifndef DRIFTKV_CODEC_ENCODED_LAYER_H_
#define DRIFTKV_CODEC_ENCODED_LAYER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "codec/kv_codec.h"

namespace driftkv {

struct EncodedLayer {
  int64_t compressed = 0;              // tokens [0, compressed) are in records
  int64_t window = 0;                  // tokens [compressed, compressed + window) are bf16
  std::vector<uint8_t> key_records;    // compressed * key_stride
  std::vector<uint8_t> value_records;  // compressed * value_stride
  std::vector<uint8_t> side;           // blocks * side_stride
  std::vector<uint16_t> window_keys;   // window * n bf16
  std::vector<uint16_t> window_values;

  int64_t blocks(int block_tokens) const { return (compressed + block_tokens - 1) / block_tokens; }
  // Bytes stored for keys / values, side records counted with keys.
  int64_t key_bytes() const { return key_records.size() + side.size() + 2 * window_keys.size(); }
  int64_t value_bytes() const { return value_records.size() + 2 * window_values.size(); }
};

// Encodes tokens [0, tokens - window) and keeps the rest in bf16.
// keys/values: [tokens][kv_heads][head_dim]. `threads` > 1 encodes blocks in
// parallel; the result does not depend on it.
absl::Status EncodeLayer(const KvCodec& codec, const float* keys, const float* values, int64_t tokens, int64_t window,
                         int threads, EncodedLayer* out, CodecStats* stats);

// Reconstructs all tokens into [tokens][kv_heads][head_dim] floats.
absl::Status DecodeLayer(const KvCodec& codec, const EncodedLayer& layer, float* keys, float* values);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_ENCODED_LAYER_H_
