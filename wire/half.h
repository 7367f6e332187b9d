// IEEE binary16 (fp16) and bfloat16 conversions, round-to-nearest-even.
//
// The container stores each stream's scale and offset as fp16 and the bf16
// window stores raw bf16, so these conversions are part of the format: they
// must give the same bits on every backend. They are written with integer
// operations only (no F16C intrinsics) so that the CUDA backend can mirror them.
#ifndef DRIFTKV_WIRE_HALF_H_
#define DRIFTKV_WIRE_HALF_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace driftkv {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Largest finite fp16 value.
constexpr float kHalfMax = 65504.0f;

// float -> fp16 bits, round to nearest even; overflow gives +-inf, NaN stays
// NaN (quiet).
uint16_t FloatToHalf(float f);

// fp16 bits -> float (exact).
float HalfToFloat(uint16_t h);

// Rounds f to the nearest fp16 value and returns it as a float.
inline float RoundToHalf(float f) {
  return HalfToFloat(FloatToHalf(f));
}

// float -> bf16 bits, round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// bf16 bits -> float (exact).
inline float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// The same over arrays, bit for bit (AVX2 where the CPU has it): a decode
// step converts every item's query, key and value on each Attend.
void FloatsToBf16(const float* x, size_t count, uint16_t* out);
void Bf16ToFloats(const uint16_t* b, size_t count, float* out);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_HALF_H_
