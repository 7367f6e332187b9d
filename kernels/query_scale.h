// The query's power of two for the attention kernels' fp16 hi/lo split of
// the rotated query (the tensor cores take fp16 operands). Both kernels on
// compressed pages scale the query by 2^e before the split and take 2^-e
// back in the scores; the host compiles the same arithmetic for its tests.
#ifndef DRIFTKV_KERNELS_QUERY_SCALE_H_
#define DRIFTKV_KERNELS_QUERY_SCALE_H_

#include <cstdint>
#include <cstring>

#include "codec/host_device.h"

namespace driftkv {
namespace gpu {

// 2^e as a float for e in [-126, 127] (a normal float), from its exponent
// bits: exact, no libm call. (memcpy is the bit cast both compilers turn
// into a register move.)
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE float Pow2(int e) {
  const uint32_t u = static_cast<uint32_t>(e + 127) << 23;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

constexpr int kQueryExponentLimit = 100;

// 2^e with m * 2^e in [256, 512) for the largest magnitude m of the
// query's rotated elements, so that every element times 2^e, and times
// the keys' factors up to 2^6, stays below fp16's largest finite value
// (65504) and its lo half rarely falls into fp16's subnormals. Split
// unscaled, a finite element of 65520 or more would become inf and -inf.
// e is kept in [-100, 100]: then 2^e, 2^-e and the kernels' products of
// them with their other factors of at most 2^+-24 are normal floats. So m
// in [2^-92, 2^109) gets [256, 512); a smaller m (a zero query included)
// gets e = 100 and smaller scaled elements; m of 2^110 or more would
// overflow the split again. m must be finite and >= 0: the service refuses
// non-finite queries and query elements above kQueryLimit (2^96,
// wire/tensor.h), which keeps m below 2^110.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE int QueryExponent(float m) {
  uint32_t u;
  memcpy(&u, &m, sizeof u);
  // floor(log2 m) for a normal m; -127 for zero and subnormals (then e is
  // clamped to 100 all the same)
  const int e = 8 - (static_cast<int>((u >> 23) & 0xffu) - 127);
  return e < -kQueryExponentLimit ? -kQueryExponentLimit : (e > kQueryExponentLimit ? kQueryExponentLimit : e);
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_QUERY_SCALE_H_
