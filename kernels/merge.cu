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
      acc = TransformedChannel(TransformMatrixAt(p.out_transform_dev, p.layer_dev[item], kv, 3, p.kv_heads, d_count), a,
                               tid, d_count);
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
    // Scores: a thread per token, reading the token's key row with 16-byte
    // loads (all of them independent) and summing in channel order; no
    // shuffles. Then a thread per channel sums the values with 8 loads in
    // flight. (Warps per token with shuffle reductions, and a value loop of 4
    // loads in flight: 33 us for the merge at (32, 8K) with a 128-token
    // window on the H200, ncu.)
    for (int t = tid; t < w; t += kMergeThreads) {
      const uint4* row = reinterpret_cast<const uint4*>(wk + static_cast<size_t>(t) * n);
      float dot = 0.0f;
      for (int j = 0; j < d_count / 8; ++j) {
        const uint4 v = row[j];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          dot += q[8 * j + 2 * k] * __uint_as_float(u[k] << 16);
          dot += q[8 * j + 2 * k + 1] * __uint_as_float(u[k] & 0xffff0000u);
        }
      }
      score[t] = p.softmax_scale * dot;
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
      constexpr int kInFlight = 8;
      float a[kInFlight] = {};
      const uint16_t* col = wv + tid;
      int t = 0;
      for (; t + kInFlight <= w; t += kInFlight) {
        float v[kInFlight];
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) v[k] = Bf16ToFloatDev(col[static_cast<size_t>(t + k) * n]);
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) a[k] += score[t + k] * v[k];
      }
      for (; t < w; ++t) a[0] += score[t] * Bf16ToFloatDev(col[static_cast<size_t>(t) * n]);
      acc += ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
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
