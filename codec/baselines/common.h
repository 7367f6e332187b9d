// Pieces shared by the baseline codecs: input checks, fp16/fp32 fields,
// fixed-width bit packing and the fp16 affine grid.
//
// Every baseline record is a plain byte array, little-endian, no alignment
// padding: the stride is exactly what the codec charges, so
// KvCodec::key_bits_per_value() is the codec's true storage.
#ifndef DRIFTKV_CODEC_BASELINES_COMMON_H_
#define DRIFTKV_CODEC_BASELINES_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace driftkv {
namespace baselines {

// InvalidArgument naming the token and channel of the first value that is
// not finite, or (when `fp16_range`) whose magnitude exceeds 65504: codecs
// with fp16 metadata cannot represent such a grid.
absl::Status CheckInput(const float* x, int count, int n, bool fp16_range, const char* what);

void StoreU16(uint8_t* p, uint16_t v);
uint16_t LoadU16(const uint8_t* p);
void StoreF32(uint8_t* p, float v);
float LoadF32(const uint8_t* p);

// Bytes holding `count` codes of `bits` (1..8) bits each.
inline size_t PackedBytes(int count, int bits) {
  return (static_cast<size_t>(count) * bits + 7) / 8;
}

// Code i occupies bits [i * bits, (i + 1) * bits) of `out`, least significant
// bit first. Writes exactly PackedBytes(count, bits) bytes (tail bits zero).
void PackBits(const uint8_t* codes, int count, int bits, uint8_t* out);
void UnpackBits(const uint8_t* in, int count, int bits, uint8_t* codes);

// An asymmetric min-max grid with `levels` levels whose step and origin are
// fp16 values: x ~ zero + scale * m, m in [0, levels). Quantize() rounds to
// the nearest level of the stored (fp16) grid, so the decoder sees exactly
// the grid the encoder rounded to. For x in the range [lo, hi] the grid was
// made from, |x - xhat| <= s / 2 + |lo| 2^-11 + (levels - 1) s 2^-11 (half
// a step, plus the fp16 rounding of the origin and of the step accumulated
// over the levels); tests/baseline_codecs_test.cc checks this bound.
struct HalfGrid {
  float scale = 0.0f;  // 0 for a constant group: every level decodes to zero
  float zero = 0.0f;
  int levels = 2;

  static HalfGrid FromRange(float lo, float hi, int levels);
  uint8_t Quantize(float x) const;
  float Dequantize(uint8_t m) const { return zero + scale * static_cast<float>(m); }
  void Store(uint8_t* p) const;  // 4 bytes: scale fp16, zero fp16
  // DataLoss if a stored field is not finite or the scale is negative.
  static absl::Status Load(const uint8_t* p, int levels, HalfGrid* grid);
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_COMMON_H_
