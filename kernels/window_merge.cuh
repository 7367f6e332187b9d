// The bf16 window and the split merge of an attention launch on compressed
// pages (nvcc only), for kernels whose blocks are (split, KV head, item)
// with 128 threads and G query heads a KV head, without a per-head WUSH
// output transform. The same device code runs in one of two places, so both
// give the same bits:
//  - in the attention kernel's own launch: one more split index per (item,
//    KV head), the last, is a block that attends the item's window
//    (WindowState) while the other blocks attend pages, leaving its state
//    in the model domain at that split of the workspace; every block, its
//    split's state written, counts itself in at the (item, KV head)'s
//    counter (ArriveLast), and the last one in merges (MergeTail): the page
//    splits in split order, rotated back, then the window's state. Which
//    block comes last varies from run to run; what it computes does not.
//    The counters start at zero and the last block sets its counter back
//    to zero, so a buffer zeroed once serves every later launch in stream
//    order;
//  - in a second launch, one block per (item, KV head) running WindowState
//    then MergeTail.
#ifndef DRIFTKV_KERNELS_WINDOW_MERGE_CUH_
#define DRIFTKV_KERNELS_WINDOW_MERGE_CUH_

#include <cstdint>

#include "codec/lse_merge.h"
#include "kernels/device_common.cuh"
#include "kernels/merge_common.cuh"

namespace driftkv {
namespace gpu {

constexpr int kWindowMergeThreads = 128;

// Floats of shared memory WindowState and MergeTail use at `scratch`.
template <int D, int G>
__host__ __device__ constexpr int WindowMergeScratchFloats() {
  return G * D + G * kMaxWindow + (kWindowMergeThreads / 32) * G * D + 2 * G;
}

// Every thread of the block calls it after the block's partial state is
// written; true in every thread of the block that came last of `total`.
// One thread fences for the block (fences are cumulative: the block's
// writes, ordered before it by the barrier, are released with its count),
// as a fence in every thread costs each of them a wait for its own writes.
__device__ __forceinline__ bool ArriveLast(uint32_t* counter, uint32_t total) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // the block's partial state before the count
    const uint32_t before = atomicAdd(counter, 1u);
    last = before + 1 == total;
    if (last) {
      atomicExch(counter, 0u);  // everyone is in: ready for the next launch
      __threadfence();          // the others' states after their counts
    }
  }
  __syncthreads();
  return last;
}

// The window block of (item, KV head kvh): scores of the G heads' model-
// domain queries against the window's keys, each head's max and sum by one
// warp, then the values with warp w taking a quarter of the tokens and lane
// l channels [C l, C l + C) (C = D / 32), the warps' sums added in warp
// order. The state goes to the last split of `ws`.
template <int D, int G>
__device__ void WindowState(const MergeParams& p, const Workspace& ws, int item, int kvh, float* scratch) {
  constexpr int kWarps = kWindowMergeThreads / 32, C = D / 32;
  static_assert(C == 2 || C == 4, "head_dim 64 or 128");
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = p.part.splits - 1, h0 = kvh * G;
  const int w = p.window_tokens_dev != nullptr ? p.window_tokens_dev[item] : 0;
  float* q = scratch;                    // [G][D]
  float* score = q + G * D;              // [G][kMaxWindow]
  float* part = score + G * kMaxWindow;  // [warp][G][D]
  float* ml = part + kWarps * G * D;     // [G][2]: max, sum
  if (w <= 0) {
    for (int i = tid; i < G * D; i += kWindowMergeThreads)
      ws.acc[p.part.acc_index(item, split, h0 + i / D) + i % D] = 0.0f;
    if (tid < G) {
      ws.m[p.part.ml_index(item, split, h0 + tid)] = kNegInf;
      ws.l[p.part.ml_index(item, split, h0 + tid)] = 0.0f;
    }
    return;
  }
  for (int i = tid; i < G * D; i += kWindowMergeThreads) {
    q[i] = p.query_dev[(static_cast<size_t>(item) * p.part.q_heads + h0) * D + i];
  }
  __syncthreads();
  const size_t n = static_cast<size_t>(p.kv_heads) * D;
  const size_t first = p.window_start_dev != nullptr ? static_cast<size_t>(p.window_start_dev[item])
                                                     : static_cast<size_t>(item) * kMaxWindow;
  const uint16_t* wk = p.window_k_dev + first * n + kvh * D;
  const uint16_t* wv = p.window_v_dev + first * n + kvh * D;
  for (int t = tid; t < w; t += kWindowMergeThreads) {
    const uint4* row = reinterpret_cast<const uint4*>(wk + t * n);
    float dot[G] = {};
    uint4 r[D / 8];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) r[j] = row[j];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      const uint4 v = r[j];
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = __uint_as_float(u[k] << 16), hi = __uint_as_float(u[k] & 0xffff0000u);
#pragma unroll
        for (int hh = 0; hh < G; ++hh) dot[hh] += q[hh * D + 8 * j + 2 * k] * lo + q[hh * D + 8 * j + 2 * k + 1] * hi;
      }
    }
#pragma unroll
    for (int hh = 0; hh < G; ++hh) score[hh * kMaxWindow + t] = p.softmax_scale * dot[hh];
  }
  __syncthreads();
  if (warp < G) {
    float* s = score + warp * kMaxWindow;
    float mx = kNegInf;
    for (int t = lane; t < w; t += 32) mx = fmaxf(mx, s[t]);
    mx = WarpMax(mx);
    float sum = 0.0f;
    for (int t = lane; t < w; t += 32) {
      s[t] = __expf(s[t] - mx);
      sum += s[t];
    }
    sum = WarpSum(sum);
    if (lane == 0) ml[2 * warp] = mx, ml[2 * warp + 1] = sum;
  }
  __syncthreads();
  {
    const int per = (w + kWarps - 1) / kWarps, t0 = warp * per, t1 = min(w, t0 + per);
    float acc[G][C] = {};
    int t = t0;
    constexpr int kInFlight = 8;
    for (; t + kInFlight <= t1; t += kInFlight) {
      uint32_t raw[kInFlight][C / 2];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const uint16_t* src = wv + (t + k) * n + C * lane;
        if constexpr (C == 4) {
          const uint2 v = *reinterpret_cast<const uint2*>(src);
          raw[k][0] = v.x;
          raw[k][1] = v.y;
        } else {
          raw[k][0] = *reinterpret_cast<const uint32_t*>(src);
        }
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const uint32_t u = raw[k][c / 2];
          const float v = __uint_as_float(c % 2 == 0 ? u << 16 : u & 0xffff0000u);
#pragma unroll
          for (int hh = 0; hh < G; ++hh) acc[hh][c] += score[hh * kMaxWindow + t + k] * v;
        }
      }
    }
    for (; t < t1; ++t) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const float v = Bf16ToFloatDev(wv[t * n + C * lane + c]);
#pragma unroll
        for (int hh = 0; hh < G; ++hh) acc[hh][c] += score[hh * kMaxWindow + t] * v;
      }
    }
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
#pragma unroll
      for (int c = 0; c < C; ++c) part[(warp * G + hh) * D + C * lane + c] = acc[hh][c];
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kWindowMergeThreads) {
    const int hh = i / D, d = i % D;
    float a = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarps; ++k) a += part[(k * G + hh) * D + d];
    ws.acc[p.part.acc_index(item, split, h0 + hh) + d] = a;
  }
  if (tid < G) {
    ws.m[p.part.ml_index(item, split, h0 + tid)] = ml[2 * tid];
    ws.l[p.part.ml_index(item, split, h0 + tid)] = ml[2 * tid + 1];
  }
}

// The last block of (item, KV head kvh): the page splits [0, splits - 1)
// merged in split order (loads through L2: other blocks wrote them in this
// launch), rotated back when p.rotated, then the window's state of the last
// split folded in; the answers stored as the merge kernel stores them.
template <int D, int G>
__device__ void MergeTail(const MergeParams& p, int item, int kvh, float* scratch) {
  const int tid = threadIdx.x, page_splits = p.part.splits - 1, h0 = kvh * G;
  float m[G], l[G], acc[G];
  MergeSplits<G>(p, item, h0, page_splits, tid, m, l, acc);
  if (p.rotated) RotateBack<G>(acc, scratch, D, tid, kWindowMergeThreads);
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
    const int h = h0 + hh;
    const float mw = __ldcg(p.m_dev + p.part.ml_index(item, page_splits, h));
    const float m2 = fmaxf(m[hh], mw);
    const float f = LseWeight<float>(m[hh], m2, FastExp()), fw = LseWeight<float>(mw, m2, FastExp());
    float lt = l[hh] * f, at = acc[hh] * f;
    if (fw != 0.0f) {
      lt += fw * __ldcg(p.l_dev + p.part.ml_index(item, page_splits, h));
      if (tid < D) at += fw * __ldcg(p.acc_dev + p.part.acc_index(item, page_splits, h) + tid);
    }
    StoreAnswer(p, item, h, tid, lt > 0.0f ? at / lt : 0.0f, lt > 0.0f ? m2 + logf(lt) : kNegInf);
  }
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_WINDOW_MERGE_CUH_
