// The split-KV merge kernel: one launch after each attention kernel merges
// the splits' partial states, maps the output back to the model domain and
// folds in the bf16 window.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/lse_merge.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kMergeThreads = 128;

struct FastExp {
  __device__ float operator()(float x) const { return __expf(x); }
};
static_assert(kMaxWindow % kMergeThreads == 0, "window tokens are scored kMergeThreads at a time");

__device__ float BlockReduceMax(float v, float* red) {
  v = WarpMax(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int i = 1; i < kMergeThreads / 32; ++i) r = fmaxf(r, red[i]);
  return r;
}

__device__ float BlockReduceSum(float v, float* red) {
  v = WarpSum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = 0.0f;
  for (int i = 0; i < kMergeThreads / 32; ++i) r += red[i];
  return r;
}

// One block per (item, query head); thread d < head_dim owns channel d.
// 1. merge the splits' (m, l, acc); 2. if rotated, acc <- H acc (butterflies
// in the order of codec/hadamard.cc), or with a WUSH transform acc <- T_V^-1
// acc (kernels/transform.h); 3. fold in the bf16 window tokens in
// the model domain; 4. out = acc / l.
__global__ void __launch_bounds__(kMergeThreads) MergeKernel(MergeParams p) {
  const int item = blockIdx.y, h = blockIdx.x, tid = threadIdx.x;
  const int d_count = p.part.head_dim;
  __shared__ float a[kMergeThreads];
  __shared__ float red[kMergeThreads / 32];
  __shared__ float score[kMaxWindow];
  __shared__ float q[kMergeThreads];

  // The splits' states merge by codec/lse_merge.h.
  float m = kNegInf;
  for (int s = 0; s < p.part.splits; ++s) m = fmaxf(m, p.m_dev[p.part.ml_index(item, s, h)]);
  float l = 0.0f, acc = 0.0f;
  for (int s = 0; s < p.part.splits; ++s) {
    const float f = LseWeight<float>(p.m_dev[p.part.ml_index(item, s, h)], m, FastExp());
    if (f == 0.0f) continue;
    l += f * p.l_dev[p.part.ml_index(item, s, h)];
    if (tid < d_count) acc += f * p.acc_dev[p.part.acc_index(item, s, h) + tid];
  }
  if (p.out_transform_dev != nullptr) {
    // acc <- T_V^-1 acc of this head's (layer, KV head); linear, so it may
    // run before the division by l.
    a[tid] = tid < d_count ? acc : 0.0f;
    __syncthreads();
    if (tid < d_count) {
      const int kv = h / (p.part.q_heads / p.kv_heads);
      acc = TransformedChannel(TransformMatrixAt(p.out_transform_dev, p.layer_dev[item], kv, 3, p.kv_heads, d_count),
                               a, tid, d_count);
    }
    __syncthreads();
  } else if (p.rotated) {
    a[tid] = acc;
    HadamardRows(a, 1, d_count, tid, kMergeThreads, BlockSync());
    acc = a[tid];
  }

  const int w = p.window_tokens_dev != nullptr ? p.window_tokens_dev[item] : 0;
  if (w > 0) {
    const int q_heads = p.part.q_heads, group = q_heads / p.kv_heads, g = h / group;
    const int n = p.kv_heads * d_count;
    if (tid < d_count) q[tid] = p.query_dev[(static_cast<size_t>(item) * q_heads + h) * d_count + tid];
    __syncthreads();
    const size_t first = p.window_start_dev != nullptr ? static_cast<size_t>(p.window_start_dev[item])
                                                       : static_cast<size_t>(item) * kMaxWindow;
    const uint16_t* wk = p.window_k_dev + first * n + g * d_count;
    const uint16_t* wv = p.window_v_dev + first * n + g * d_count;
    // Scores: warp w takes tokens w, w + 4, ...; its lanes read a token's
    // key row together (coalesced) and reduce the dot product by shuffles.
    // (Thread-per-token rows, uncoalesced and serial, and a value loop that
    // waited on each load made this kernel 207 us at (32, 8K) with a
    // 256-token window; 64 us now, ncu on the H200.)
    constexpr int kWarps = kMergeThreads / 32;
    const int warp = tid >> 5, lane = tid & 31;
    float qr[kMergeThreads / 32];
#pragma unroll
    for (int k = 0; k < kMergeThreads / 32; ++k) qr[k] = lane + 32 * k < d_count ? q[lane + 32 * k] : 0.0f;
#pragma unroll 2
    for (int t = warp; t < w; t += kWarps) {
      const uint16_t* row = wk + static_cast<size_t>(t) * n;
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kMergeThreads / 32; ++k) {
        if (lane + 32 * k < d_count) dot += qr[k] * Bf16ToFloatDev(row[lane + 32 * k]);
      }
      dot = WarpSum(dot);
      if (lane == 0) score[t] = p.softmax_scale * dot;
    }
    __syncthreads();
    float s = kNegInf;
    for (int t = tid; t < w; t += kMergeThreads) s = fmaxf(s, score[t]);
    const float m2 = fmaxf(m, BlockReduceMax(s, red));
    const float f = LseWeight<float>(m, m2, FastExp());  // the splits' merged state, then the window
    float e = 0.0f;
    for (int t = tid; t < w; t += kMergeThreads) {
      score[t] = __expf(score[t] - m2);
      e += score[t];
    }
    l = l * f + BlockReduceSum(e, red);  // (syncs make score[] visible)
    acc *= f;
    if (tid < d_count) {
      // Four independent sums so that the loads of several tokens are in
      // flight at once (one dependent chain waited on each load).
      float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
      const uint16_t* col = wv + tid;
      int t = 0;
#pragma unroll 2
      for (; t + 4 <= w; t += 4) {
        const float v0 = Bf16ToFloatDev(col[static_cast<size_t>(t) * n]);
        const float v1 = Bf16ToFloatDev(col[static_cast<size_t>(t + 1) * n]);
        const float v2 = Bf16ToFloatDev(col[static_cast<size_t>(t + 2) * n]);
        const float v3 = Bf16ToFloatDev(col[static_cast<size_t>(t + 3) * n]);
        a0 += score[t] * v0;
        a1 += score[t + 1] * v1;
        a2 += score[t + 2] * v2;
        a3 += score[t + 3] * v3;
      }
      for (; t < w; ++t) a0 += score[t] * Bf16ToFloatDev(col[static_cast<size_t>(t) * n]);
      acc += (a0 + a1) + (a2 + a3);
    }
    m = m2;
  }
  if (tid < d_count) {
    p.out_dev[(static_cast<size_t>(item) * p.part.q_heads + h) * d_count + tid] = l > 0.0f ? acc / l : 0.0f;
  }
  if (tid == 0) p.lse_dev[static_cast<size_t>(item) * p.part.q_heads + h] = l > 0.0f ? m + logf(l) : kNegInf;
}

}  // namespace

absl::Status LaunchMerge(const MergeParams& p, cudaStream_t stream) {
  if (p.part.head_dim > kMergeThreads) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.part.head_dim, " exceeds ", kMergeThreads));
  }
  MergeKernel<<<dim3(p.part.q_heads, p.part.items), kMergeThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "merge kernel launch");
}

}  // namespace gpu
}  // namespace driftkv
