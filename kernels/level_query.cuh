// The level attention kernel's query prologue (kernels/level_attention.cu,
// nvcc only): the KV head's query heads rotated as the keys are, their
// sums and largest magnitudes, and the fp16 hi | lo halves of the rotated
// elements times the query's power of two, the source of the tensor
// cores' B fragments.
#ifndef DRIFTKV_KERNELS_LEVEL_QUERY_CUH_
#define DRIFTKV_KERNELS_LEVEL_QUERY_CUH_

#include <cstdint>

#include "kernels/device_common.cuh"
#include "kernels/query_scale.h"

namespace driftkv {
namespace gpu {

// The query's power of two (QueryExponent) over the G heads' largest
// magnitudes.
template <int G>
__device__ __forceinline__ int QueryScale(const float* qmax) {
  float m = qmax[0];
#pragma unroll
  for (int h = 1; h < G; ++h) m = fmaxf(m, qmax[h]);
  return QueryExponent(m);
}

// Prologue: the KV head's G query heads from q, rotated (Hadamard, as the
// keys), into qs, their sums into qsum, their largest magnitudes into qmax,
// and the fp16 hi and lo halves of each rotated element times 2^e (e, the
// query's power of two, QueryScale, returned) into qhl ([G][D] words hi |
// lo << 16, the B fragments' source). Warp w rotates head w in registers:
// lane l holds channels 4l..4l+3 (D = 128; 2l, 2l+1 for 64), the
// butterflies of length < C inside the lane and the longer ones by
// shuffles, each pair (a, b) giving a + b and a - b as a butterfly over
// shared memory would. Warps 0..G-1 of the block rotate; every thread of
// the block calls it (two block barriers, the last at its end).
template <int D, int G>
__device__ __forceinline__ int PrepareQuery(const float* q, float* qs, float* qsum, float* qmax, uint32_t* qhl,
                                            int warp, int lane) {
  constexpr int C = D / 32;
  float x[C];
  if (warp < G) {
#pragma unroll
    for (int j = 0; j < C; ++j) x[j] = q[warp * D + C * lane + j];
#pragma unroll
    for (int len = 1; len < C; len <<= 1) {
#pragma unroll
      for (int j = 0; j < C; ++j) {
        if ((j & len) == 0) {
          const float a = x[j], b = x[j + len];
          x[j] = a + b;
          x[j + len] = a - b;
        }
      }
    }
#pragma unroll
    for (int len = C; len < D; len <<= 1) {
      const int o = len / C;  // the partner lane
      const bool upper = (lane & o) != 0;
#pragma unroll
      for (int j = 0; j < C; ++j) {
        const float y = __shfl_xor_sync(0xffffffffu, x[j], o);
        x[j] = upper ? y - x[j] : x[j] + y;
      }
    }
    const float norm = rsqrtf(static_cast<float>(D));
    float mx = 0.0f;
#pragma unroll
    for (int j = 0; j < C; ++j) {
      x[j] *= norm;
      mx = fmaxf(mx, fabsf(x[j]));
      qs[warp * D + C * lane + j] = x[j];
    }
    __syncwarp();
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += qs[warp * D + d];
    s = WarpSum(s);
    mx = WarpMax(mx);
    if (lane == 0) qsum[warp] = s, qmax[warp] = mx;
  }
  __syncthreads();
  const int e = QueryScale<G>(qmax);
  if (warp < G) {
    const float up = Pow2(e);
#pragma unroll
    for (int j = 0; j < C; ++j) {
      uint16_t hi, lo;
      SplitHalf(x[j] * up, &hi, &lo);
      qhl[warp * D + C * lane + j] = hi | (static_cast<uint32_t>(lo) << 16);
    }
  }
  __syncthreads();
  return e;
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_QUERY_CUH_
