// `fp8`: every token stream is scaled by one fp32 factor so its largest
// magnitude maps to 448, the largest finite FP8 E4M3 (OCP "E4M3FN": 1 sign,
// 4 exponent bits with bias 7, 3 mantissa bits, no infinities, S.1111.111
// is NaN) value, and each value is rounded to nearest-even E4M3.
// Record (keys and values), stride = 4 + n:
//   [0:4)    scale fp32 LE (0 for an all-zero stream)
//   [4:4+n)  E4M3 codes, value j = scale * E4M3(code j)
// Cost: 8 + 32 / n bits per value. Relative error <= 2^-4 above the
// subnormal range; absolute error <= scale * 2^-10 within it.
#ifndef DRIFTKV_CODEC_BASELINES_FP8_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_FP8_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/baselines/tokenwise_codec.h"

namespace driftkv {
namespace baselines {

constexpr float kE4M3Max = 448.0f;

// Exact value of an E4M3 code (NaN for the two NaN codes).
float E4M3ToFloat(uint8_t code);
// Nearest E4M3 code, ties to even, saturating at +-448; x finite.
uint8_t FloatToE4M3(float x);

class Fp8Codec : public TokenwiseCodec {
 public:
  static absl::StatusOr<std::unique_ptr<KvCodec>> Create(int kv_heads, int head_dim);

  size_t key_stride() const override { return 4 + static_cast<size_t>(n()); }
  size_t value_stride() const override { return 4 + static_cast<size_t>(n()); }

 protected:
  void EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const override;
  absl::Status DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const override;

 private:
  Fp8Codec(int kv_heads, int head_dim) : TokenwiseCodec("fp8", kv_heads, head_dim, /*fp16_metadata=*/false) {}
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_FP8_CODEC_H_
