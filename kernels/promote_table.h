// The promotion's form of an rANS decode table (codec/rans.h), one 32-bit
// entry per z = x mod 256:
//   [31:24] f   [23:16] the level m   [15:0] bias - floor(z f / 256), int16
// so that one lookup gives the next state in a multiply-high and an add,
// and the level as a whole byte for a byte permute. With x = 256 X + z,
// umulhi(x, f << 24) = floor(x f / 256) = X f + floor(z f / 256), so
//   x' = umulhi(x, f << 24) + (bias - floor(z f / 256)) = f (x >> 8) + bias
// exactly, for every 32-bit x (mod 2^32 the sum is the integer, which is
// below 2^32: X < 2^24, f <= 255). rans.h's entry needs two extractions
// and a shift besides its multiply-add; this one a mask and a sign
// extension, and the level needs no shift.
#ifndef DRIFTKV_KERNELS_PROMOTE_TABLE_H_
#define DRIFTKV_KERNELS_PROMOTE_TABLE_H_

#include <cstdint>

#include "codec/host_device.h"

namespace driftkv {
namespace gpu {

// The byte of an entry that holds the level.
constexpr int kPromoteLevelByte = 2;

// The entry for slot z of a symbol m of frequency f (1..255) whose
// interval starts bias below z (bias = z - c, 0 <= bias < f).
constexpr uint32_t PromoteTableEntry(uint32_t f, uint32_t bias, uint32_t m, uint32_t z) {
  return (f << 24) | ((m & 0xffu) << (8 * kPromoteLevelByte)) |
         (static_cast<uint32_t>(static_cast<int32_t>(bias) - static_cast<int32_t>((z * f) >> 8)) & 0xffffu);
}

// The state after decoding the symbol of `entry` from state x.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteStateStep(uint32_t x, uint32_t entry) {
  const uint32_t bias = static_cast<uint32_t>(static_cast<int32_t>(static_cast<int16_t>(entry & 0xffffu)));
#if defined(__CUDA_ARCH__)
  return __umulhi(x, entry & 0xff000000u) + bias;
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(x) * (entry & 0xff000000u)) >> 32) + bias;
#endif
}

// The level of `entry` (its byte kPromoteLevelByte, nothing else in it).
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteEntryLevel(uint32_t entry) {
  return (entry >> (8 * kPromoteLevelByte)) & 0xffu;
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_PROMOTE_TABLE_H_
