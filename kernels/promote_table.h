// The promotion's form of an rANS decode table (codec/rans.h), one 64-bit
// entry per z = x mod 256:
//   low word:  [23:16] the level m, [15:8] f, the rest zero
//   high word: bias - floor(z f / 256), int32
// so that one lookup, one byte permute (F = f << 24) and one 32 x 32-bit
// multiply with the entry as its 64-bit addend give the next state, and
// the level is a whole byte for a byte permute. With x = 256 X + z,
//   x F = 2^32 (X f + floor(z f / 256)) + ((z f mod 256) << 24),
// and the low word (below 2^24) added to the product's low half, at most
// 255 << 24, never carries, so the high half of x F + entry is
//   X f + floor(z f / 256) + bias - floor(z f / 256) = f (x >> 8) + bias
// exactly, for every 32-bit x (mod 2^32 the sum is the integer, which is
// below 2^32: X < 2^24, f <= 255). One multiply-add, its addend the
// entry's two words as loaded: no mask, no sign extension, no add.
#ifndef DRIFTKV_KERNELS_PROMOTE_TABLE_H_
#define DRIFTKV_KERNELS_PROMOTE_TABLE_H_

#include <cstdint>

#include "codec/host_device.h"

namespace driftkv {
namespace gpu {

// The bytes of an entry's low word that hold the level and f.
constexpr int kPromoteLevelByte = 2;
constexpr int kPromoteFreqByte = 1;

// The entry for slot z of a symbol m of frequency f (1..255) whose
// interval starts bias below z (bias = z - c, 0 <= bias < f).
constexpr uint64_t PromoteTableEntry(uint32_t f, uint32_t bias, uint32_t m, uint32_t z) {
  const uint32_t low = ((m & 0xffu) << (8 * kPromoteLevelByte)) | ((f & 0xffu) << (8 * kPromoteFreqByte));
  const uint32_t high = static_cast<uint32_t>(static_cast<int32_t>(bias) - static_cast<int32_t>((z * f) >> 8));
  return (static_cast<uint64_t>(high) << 32) | low;
}

// F = f << 24 from an entry's low word.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteEntryScale(uint32_t low) {
  static_assert(kPromoteFreqByte == 1, "the permute's selector takes byte 1");
#if defined(__CUDA_ARCH__)
  return __byte_perm(low, 0u, 0x1444u);  // byte 3 from the low word's byte 1, the rest zero
#else
  return (low & 0xff00u) << 16;
#endif
}

// The state after decoding the symbol of `entry` from state x.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteStateStep(uint32_t x, uint64_t entry) {
  return static_cast<uint32_t>((static_cast<uint64_t>(x) * PromoteEntryScale(static_cast<uint32_t>(entry)) + entry) >>
                               32);
}

// The level of `entry` (its low word's byte kPromoteLevelByte, nothing
// else in it).
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteEntryLevel(uint64_t entry) {
  return (static_cast<uint32_t>(entry) >> (8 * kPromoteLevelByte)) & 0xffu;
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_PROMOTE_TABLE_H_
