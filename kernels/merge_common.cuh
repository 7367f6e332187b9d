// What the merge kernels (kernels/merge.cu) and the window merge of the
// level kernel (kernels/window_merge.cuh) share (nvcc only): writing one
// head's answer where the item wants it, the exponential of the lse
// weights, the inverse Hadamard of a group's accumulators, and the merge of
// the splits' states in split order.
#ifndef DRIFTKV_KERNELS_MERGE_COMMON_CUH_
#define DRIFTKV_KERNELS_MERGE_COMMON_CUH_

#include <cstdint>

#include "codec/lse_merge.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {

// Head h's answer of item `item`: channel tid's value `o` (tid < head_dim)
// and, from thread 0, the lse, to the item's output target or its rows.
__device__ __forceinline__ void StoreAnswer(const MergeParams& p, int item, int h, int tid, float o, float lse) {
  const int d_count = p.part.head_dim;
  const size_t row = static_cast<size_t>(item) * p.part.q_heads + h;
  const OutputTarget* t = p.targets_dev != nullptr ? p.targets_dev + item : nullptr;
  if (t == nullptr || t->out == nullptr) {
    if (tid < d_count) p.out_dev[row * d_count + tid] = o;
    if (tid == 0) p.lse_dev[row] = lse;
    return;
  }
  const size_t at = static_cast<size_t>(h) * d_count + tid;
  if (tid < d_count) {
    if (t->out_dtype == 1) {
      static_cast<uint16_t*>(t->out)[at] = FloatToBf16Dev(o);
    } else {
      static_cast<float*>(t->out)[at] = o;
    }
  }
  if (tid == 0 && t->lse != nullptr) t->lse[h] = lse;
}

struct FastExp {
  __device__ float operator()(float x) const { return __expf(x); }
};

// The G heads' merged acc (channel tid of each) mapped back from the
// Hadamard domain by THE device Hadamard, through `scratch` (G x head_dim
// floats of shared memory); every thread of the block calls it.
template <int G>
__device__ __forceinline__ void RotateBack(float (&acc)[G], float* scratch, int head_dim, int tid, int threads) {
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
    if (tid < head_dim) scratch[hh * head_dim + tid] = acc[hh];
  }
  HadamardRows(scratch, G, head_dim, tid, threads, BlockSync());
#pragma unroll
  for (int hh = 0; hh < G; ++hh) acc[hh] = tid < head_dim ? scratch[hh * head_dim + tid] : 0.0f;
}

// The partial states of splits [0, splits) of heads h0 .. h0 + G - 1 of
// `item` merged in split order by codec/lse_merge.h: the running max m,
// sum l and, in thread tid < head_dim, channel tid's acc. The loads go
// kChunk splits at a time, through L2 (the states may have been written in
// the same launch by other blocks), rather than one dependent load after
// another; the arithmetic is the same, in the same order.
template <int G>
__device__ __forceinline__ void MergeSplits(const MergeParams& p, int item, int h0, int splits, int tid, float (&m)[G],
                                            float (&l)[G], float (&acc)[G]) {
  constexpr int kChunk = 8;
  const bool has_channel = tid < p.part.head_dim;
#pragma unroll
  for (int hh = 0; hh < G; ++hh) m[hh] = kNegInf, l[hh] = 0.0f, acc[hh] = 0.0f;
  for (int s0 = 0; s0 < splits; s0 += kChunk) {
    float mv[kChunk][G];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        mv[k][hh] = s0 + k < splits ? __ldcg(p.m_dev + p.part.ml_index(item, s0 + k, h0 + hh)) : kNegInf;
      }
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
#pragma unroll
      for (int hh = 0; hh < G; ++hh) m[hh] = fmaxf(m[hh], mv[k][hh]);
    }
  }
  for (int s0 = 0; s0 < splits; s0 += kChunk) {
    float mv[kChunk][G], lv[kChunk][G], av[kChunk][G];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      const bool in = s0 + k < splits;
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        const size_t mi = p.part.ml_index(item, in ? s0 + k : 0, h0 + hh);
        mv[k][hh] = in ? __ldcg(p.m_dev + mi) : kNegInf;
        lv[k][hh] = in ? __ldcg(p.l_dev + mi) : 0.0f;
        av[k][hh] = in && has_channel ? __ldcg(p.acc_dev + mi * p.part.head_dim + tid) : 0.0f;
      }
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        const float f = LseWeight<float>(mv[k][hh], m[hh], FastExp());
        if (f == 0.0f) continue;
        l[hh] += f * lv[k][hh];
        acc[hh] += f * av[k][hh];
      }
    }
  }
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_MERGE_COMMON_CUH_
