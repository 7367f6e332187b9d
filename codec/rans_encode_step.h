// One rANS encoding step without a division (codec/rans.h), in arithmetic
// the host and a kernel can share (a 32-bit division is a long routine on
// a GPU). RansEncode codes with it.
//
// floor(x / f) is a multiply-high by a reciprocal and a shift, exact for
// every state x < 2^31 = kStateHigh and every frequency 1 <= f <= 256:
// with k = ceil(log2 f) and m = ceil(2^(31+k) / f) (< 2^32), the error
// e = m f - 2^(31+k) is below f, so x m / 2^(31+k) = x/f + x e / (f
// 2^(31+k)), whose second term is below 2^31 f / (f 2^(31+k)) = 2^-k <=
// 1/f; the fraction of x/f is at most (f-1)/f, so the floor does not move.
// Feeding 2x to the multiply-high makes f = 1 (k = 0, m = 2^31) exact too.
//
// With q = floor(x / f) known first, the renormalisation test x >= f 2^23
// is q >= 2^23, and after a byte leaves, (x >> 8) / f = q >> 8. Then
// x' = (q << kProbBits) + x - q f + c = x + q (2^kProbBits - f) + c.
#ifndef DRIFTKV_CODEC_RANS_ENCODE_STEP_H_
#define DRIFTKV_CODEC_RANS_ENCODE_STEP_H_

#include <cstdint>

#include "codec/format_constants.h"
#include "codec/host_device.h"

namespace driftkv {

// A symbol of frequency f and cumulative frequency c, as the step uses it.
struct RansEncodeEntry {
  uint32_t rcp = 0;    // m
  uint32_t shift = 0;  // k
  uint32_t cmpl = 0;   // 2^kProbBits - f
  uint32_t cum = 0;    // c
};

static_assert(kProbBits == 8 && kStateHigh == (1u << 31), "the reciprocal's bound assumes x < 2^31, f <= 256");

// f in [1, 256], cum in [0, 256).
inline RansEncodeEntry MakeRansEncodeEntry(uint32_t f, uint32_t cum) {
  RansEncodeEntry e;
  uint32_t k = 0;
  while ((1u << k) < f) ++k;
  e.rcp = static_cast<uint32_t>(((uint64_t{1} << (31 + k)) + f - 1) / f);
  e.shift = k;
  e.cmpl = kProbScale - f;
  e.cum = cum;
  return e;
}

DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t RansMulHi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

// floor(x / f) for x < 2^31.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t RansQuotient(uint32_t x, uint32_t rcp, uint32_t shift) {
  return RansMulHi(x + x, rcp) >> shift;
}

// x >= f 2^23 (codec/rans.cc's x_max) is q >= 2^23.
constexpr uint32_t kRansEmitQuotient = kStateLow >> kProbBits << 8;

// True when x must give a byte before coding a symbol whose quotient is q.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE bool RansMustEmit(uint32_t q) {
  return q >= kRansEmitQuotient;
}

// The coded state from x (after renormalisation) and q = floor(x / f).
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t RansCoded(uint32_t x, uint32_t q, uint32_t cmpl, uint32_t cum) {
  return x + q * cmpl + cum;
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_RANS_ENCODE_STEP_H_
