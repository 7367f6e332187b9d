#include "wire/half.h"

#include <cstring>

namespace driftkv {

uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value = mant * 2^-24.
    if (abs < 0x33000000u) return sign;  // below half of the smallest subnormal
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14..24 for exp in 102..112
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped bits.
  uint32_t h = ((abs >> 13) - (112u << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into exp
  return sign | static_cast<uint16_t>(h);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // Subnormal: mant * 2^-24, exact in float.
    const float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

namespace {

using U32x8 = uint32_t __attribute__((vector_size(32)));
using U16x8 = uint16_t __attribute__((vector_size(16)));

// FloatToBf16 on eight lanes: the same integer steps, so the same bits.
__attribute__((target("avx2"))) void FloatsToBf16Avx2(const float* x, size_t count, uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    U32x8 u;
    std::memcpy(&u, x + i, sizeof(u));
    const U32x8 nan = (u & 0x7fffffffu) > 0x7f800000u;
    const U32x8 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const U32x8 r = nan ? ((u >> 16) | 0x40u) : rounded;
    const U16x8 h = __builtin_convertvector(r, U16x8);
    std::memcpy(out + i, &h, sizeof(h));
  }
  for (; i < count; ++i) out[i] = FloatToBf16(x[i]);
}

__attribute__((target("avx2"))) void Bf16ToFloatsAvx2(const uint16_t* b, size_t count, float* out) {
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    U16x8 h;
    std::memcpy(&h, b + i, sizeof(h));
    const U32x8 u = __builtin_convertvector(h, U32x8) << 16;
    std::memcpy(out + i, &u, sizeof(u));
  }
  for (; i < count; ++i) out[i] = Bf16ToFloat(b[i]);
}

bool HasAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

}  // namespace

void FloatsToBf16(const float* x, size_t count, uint16_t* out) {
  if (HasAvx2()) return FloatsToBf16Avx2(x, count, out);
  for (size_t i = 0; i < count; ++i) out[i] = FloatToBf16(x[i]);
}

void Bf16ToFloats(const uint16_t* b, size_t count, float* out) {
  if (HasAvx2()) return Bf16ToFloatsAvx2(b, count, out);
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(b[i]);
}

}  // namespace driftkv
