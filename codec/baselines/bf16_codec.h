// `bf16`: no compression; every value is rounded to bfloat16 (nearest even,
// half.h). The reference cost of a KV cache: 16 bits per value.
// Record (keys and values), stride = 2n: n bf16 values, little-endian.
#ifndef DRIFTKV_CODEC_BASELINES_BF16_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_BF16_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/baselines/tokenwise_codec.h"

namespace driftkv {
namespace baselines {

class Bf16Codec : public TokenwiseCodec {
 public:
  static absl::StatusOr<std::unique_ptr<KvCodec>> Create(int kv_heads, int head_dim);

  size_t key_stride() const override { return 2 * static_cast<size_t>(n()); }
  size_t value_stride() const override { return 2 * static_cast<size_t>(n()); }

 protected:
  void EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const override;
  // DataLoss on a NaN or infinite bf16 (the encoder never writes one).
  absl::Status DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const override;

 private:
  Bf16Codec(int kv_heads, int head_dim) : TokenwiseCodec("bf16", kv_heads, head_dim, /*fp16_metadata=*/false) {}
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_BF16_CODEC_H_
