// The promotion's form of an rANS decode table (codec/rans.h), one 32-bit
// entry per z = x mod 256:
//   [7:0] f   [15:8] the level m   [23:16] bias = z - c   [31:24] zero
// so that the next state f (x >> 8) + bias is one multiply-add of a shift
// of x by a mask and a shift of the entry (no sign extension, no 64-bit
// addend: a multiply-high with its add costs ptxas two more moves to
// build the register pair it adds, measured in the kernel's SASS), and
// the level is a whole byte for a byte permute.
#ifndef DRIFTKV_KERNELS_PROMOTE_TABLE_H_
#define DRIFTKV_KERNELS_PROMOTE_TABLE_H_

#include <cstdint>

#include "codec/host_device.h"

namespace driftkv {
namespace gpu {

// The bytes of an entry that hold the level and the bias.
constexpr int kPromoteLevelByte = 1;
constexpr int kPromoteBiasByte = 2;

// The entry of a slot z of a symbol m of frequency f (1..255) whose
// interval starts bias below z (bias = z - c, 0 <= bias < f).
constexpr uint32_t PromoteTableEntry(uint32_t f, uint32_t bias, uint32_t m) {
  return (f & 0xffu) | ((m & 0xffu) << (8 * kPromoteLevelByte)) | ((bias & 0xffu) << (8 * kPromoteBiasByte));
}

// The state after decoding the symbol of `entry` from state x.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteStateStep(uint32_t x, uint32_t entry) {
  static_assert(kPromoteBiasByte == 2, "the bias is the entry shifted, its top byte zero");
  return (entry & 0xffu) * (x >> 8) + (entry >> (8 * kPromoteBiasByte));
}

// The level of `entry` (its byte kPromoteLevelByte, nothing else in it).
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t PromoteEntryLevel(uint32_t entry) {
  return (entry >> (8 * kPromoteLevelByte)) & 0xffu;
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_PROMOTE_TABLE_H_
