// The split-KV merge kernel: one launch after each attention kernel merges
// the splits' partial states, maps the output back to the model domain and
// folds in the bf16 window.
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/lse_merge.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"
#include "kernels/merge_common.cuh"
#include "wire/half.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kMergeThreads = 128;

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

  float mh[1], lh[1], acch[1];
  MergeSplits<1>(p, item, h, p.part.splits, tid, mh, lh, acch);
  float m = mh[0], l = lh[0], acc = acch[0];
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
    float one[1] = {acc};
    RotateBack<1>(one, a, d_count, tid, kMergeThreads);
    acc = one[0];
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
  StoreAnswer(p, item, h, tid, l > 0.0f ? acc / l : 0.0f, l > 0.0f ? m + logf(l) : kNegInf);
}

// The same for the G query heads of one KV head (one block per (item, KV
// head); no WUSH transform): every window token's key row and value column
// is loaded once for the group instead of once per head. Each head's
// arithmetic is MergeKernel's, in the same order, so the outputs are the
// same bits. At 64 x 8K with GQA 32/8 MergeKernel read each window 4 times
// through L2 (~150 MB for a 146-token window) and took 77 us on the H200.
template <int G>
__global__ void __launch_bounds__(kMergeThreads) MergeGroupKernel(MergeParams p) {
  const int item = blockIdx.y, g = blockIdx.x, tid = threadIdx.x;
  const int d_count = p.part.head_dim, h0 = g * G;
  __shared__ float a[G * kMergeThreads];
  __shared__ float red[kMergeThreads / 32];
  __shared__ float score[G][kMaxWindow];
  __shared__ float q[G][kMergeThreads];

  float m[G], l[G], acc[G];
  MergeSplits<G>(p, item, h0, p.part.splits, tid, m, l, acc);
  if (p.rotated) RotateBack<G>(acc, a, d_count, tid, kMergeThreads);

  const int w = p.window_tokens_dev != nullptr ? p.window_tokens_dev[item] : 0;
  if (w > 0) {
    const int q_heads = p.part.q_heads;
    const int n = p.kv_heads * d_count;
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
      if (tid < d_count) q[hh][tid] = p.query_dev[(static_cast<size_t>(item) * q_heads + h0 + hh) * d_count + tid];
    }
    __syncthreads();
    const size_t first = p.window_start_dev != nullptr ? static_cast<size_t>(p.window_start_dev[item])
                                                       : static_cast<size_t>(item) * kMaxWindow;
    const uint16_t* wk = p.window_k_dev + first * n + g * d_count;
    const uint16_t* wv = p.window_v_dev + first * n + g * d_count;
    for (int t = tid; t < w; t += kMergeThreads) {
      const uint4* row = reinterpret_cast<const uint4*>(wk + static_cast<size_t>(t) * n);
      float dot[G] = {};
      for (int j = 0; j < d_count / 8; ++j) {
        const uint4 v = row[j];
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float lo = __uint_as_float(u[k] << 16), hi = __uint_as_float(u[k] & 0xffff0000u);
#pragma unroll
          for (int hh = 0; hh < G; ++hh) {
            dot[hh] += q[hh][8 * j + 2 * k] * lo;
            dot[hh] += q[hh][8 * j + 2 * k + 1] * hi;
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < G; ++hh) score[hh][t] = p.softmax_scale * dot[hh];
    }
    __syncthreads();
#pragma unroll
    for (int hh = 0; hh < G; ++hh) {
      float s = kNegInf;
      for (int t = tid; t < w; t += kMergeThreads) s = fmaxf(s, score[hh][t]);
      const float m2 = fmaxf(m[hh], BlockReduceMax(s, red));
      const float f = LseWeight<float>(m[hh], m2, FastExp());
      float e = 0.0f;
      for (int t = tid; t < w; t += kMergeThreads) {
        score[hh][t] = __expf(score[hh][t] - m2);
        e += score[hh][t];
      }
      l[hh] = l[hh] * f + BlockReduceSum(e, red);  // (syncs make score[] visible)
      acc[hh] *= f;
      m[hh] = m2;
    }
    if (tid < d_count) {
      constexpr int kInFlight = 8;
      float sum[G][kInFlight] = {};
      const uint16_t* col = wv + tid;
      int t = 0;
      for (; t + kInFlight <= w; t += kInFlight) {
        float v[kInFlight];
#pragma unroll
        for (int k = 0; k < kInFlight; ++k) v[k] = Bf16ToFloatDev(col[static_cast<size_t>(t + k) * n]);
#pragma unroll
        for (int hh = 0; hh < G; ++hh) {
#pragma unroll
          for (int k = 0; k < kInFlight; ++k) sum[hh][k] += score[hh][t + k] * v[k];
        }
      }
      for (; t < w; ++t) {
        const float v = Bf16ToFloatDev(col[static_cast<size_t>(t) * n]);
#pragma unroll
        for (int hh = 0; hh < G; ++hh) sum[hh][0] += score[hh][t] * v;
      }
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        const float* x = sum[hh];
        acc[hh] += ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
      }
    }
  }
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
    StoreAnswer(p, item, h0 + hh, tid, l[hh] > 0.0f ? acc[hh] / l[hh] : 0.0f,
                l[hh] > 0.0f ? m[hh] + logf(l[hh]) : kNegInf);
  }
}

}  // namespace

absl::Status LaunchMerge(const MergeParams& p, cudaStream_t stream) {
  if (p.part.head_dim > kMergeThreads) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.part.head_dim, " exceeds ", kMergeThreads));
  }
  const int group = p.kv_heads > 0 ? p.part.q_heads / p.kv_heads : 0;
  if (!p.per_head && p.out_transform_dev == nullptr && group * p.kv_heads == p.part.q_heads &&
      (group == 2 || group == 4)) {
    if (group == 4) {
      MergeGroupKernel<4><<<dim3(p.kv_heads, p.part.items), kMergeThreads, 0, stream>>>(p);
    } else {
      MergeGroupKernel<2><<<dim3(p.kv_heads, p.part.items), kMergeThreads, 0, stream>>>(p);
    }
  } else {
    MergeKernel<<<dim3(p.part.q_heads, p.part.items), kMergeThreads, 0, stream>>>(p);
  }
  return CudaStatus(cudaGetLastError(), "merge kernel launch");
}

absl::StatusOr<int64_t> MergeKernelsDiffer(int items, int q_heads, int kv_heads, int head_dim, int splits, bool rotated,
                                           MergeTargets targets_in) {
  PartialLayout part{items, splits, q_heads, head_dim};
  const size_t ml = static_cast<size_t>(items) * splits * q_heads, accs = ml * head_dim;
  const size_t n = static_cast<size_t>(kv_heads) * head_dim, wtokens = static_cast<size_t>(items) * kMaxWindow;
  const size_t qsz = static_cast<size_t>(items) * q_heads * head_dim, outs = qsz + static_cast<size_t>(items) * q_heads;
  std::vector<float> m(ml), l(ml), acc(accs), query(qsz);
  std::vector<uint16_t> wk(wtokens * n), wv(wtokens * n);
  std::vector<int32_t> wt(items);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&x] {  // xorshift64*, uniform in [-1, 1)
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return static_cast<float>(static_cast<double>((x * 0x2545f4914f6cdd1dull) >> 11) / 4503599627370496.0 - 1.0);
  };
  for (size_t i = 0; i < ml; ++i) {
    m[i] = i % 7 == 3 ? kNegInf : 4.0f * next();  // some empty splits
    l[i] = m[i] == kNegInf ? 0.0f : 1.0f + 8.0f * (next() + 1.0f);
  }
  for (float& v : acc) v = 10.0f * next();
  for (float& v : query) v = next();
  for (size_t i = 0; i < wk.size(); ++i) {
    const float k = 2.0f * next(), v = 2.0f * next();
    uint32_t kb, vb;
    std::memcpy(&kb, &k, 4);
    std::memcpy(&vb, &v, 4);
    wk[i] = static_cast<uint16_t>(kb >> 16);
    wv[i] = static_cast<uint16_t>(vb >> 16);
  }
  for (int i = 0; i < items; ++i) wt[i] = static_cast<int32_t>((static_cast<int64_t>(i) * 97) % kMaxWindow);
  float *dm = nullptr, *dl = nullptr, *dacc = nullptr, *dq = nullptr, *dout = nullptr;
  uint16_t *dwk = nullptr, *dwv = nullptr;
  int32_t* dwt = nullptr;
  cudaError_t e = cudaSuccess;
  auto alloc = [&e](auto** p, size_t bytes) {
    if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(p), bytes);
  };
  alloc(&dm, ml * 4);
  alloc(&dl, ml * 4);
  alloc(&dacc, accs * 4);
  alloc(&dq, qsz * 4);
  alloc(&dout, 3 * outs * 4);
  alloc(&dwk, wk.size() * 2);
  alloc(&dwv, wv.size() * 2);
  alloc(&dwt, items * 4);
  auto up = [&e](void* dst, const void* src, size_t bytes) {
    if (e == cudaSuccess) e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  };
  up(dm, m.data(), ml * 4);
  up(dl, l.data(), ml * 4);
  up(dacc, acc.data(), accs * 4);
  up(dq, query.data(), qsz * 4);
  up(dwk, wk.data(), wk.size() * 2);
  up(dwv, wv.data(), wv.size() * 2);
  up(dwt, wt.data(), items * 4);
  absl::Status st = CudaStatus(e, "merge self-test setup");
  // Output targets: item i % 3 == 0 f32 with its lse, 1 bf16 without, 2
  // none (its rows); in device or pinned host memory.
  const size_t row_floats = static_cast<size_t>(q_heads) * head_dim;
  std::vector<OutputTarget> targets(items);
  uint8_t* target_mem = nullptr;
  const size_t item_bytes = (row_floats + q_heads) * 4;
  OutputTarget* dtargets = nullptr;
  if (st.ok() && targets_in != kMergeTargetsNone) {
    e = targets_in == kMergeTargetsHost ? cudaMallocHost(reinterpret_cast<void**>(&target_mem), items * item_bytes)
                                        : cudaMalloc(reinterpret_cast<void**>(&target_mem), items * item_bytes);
    if (e == cudaSuccess) e = cudaMemset(target_mem, 0xff, items * item_bytes);  // NaN bits: untouched
    for (int i = 0; i < items; ++i) {
      if (i % 3 == 2) continue;
      targets[i].out = target_mem + i * item_bytes;
      targets[i].out_dtype = i % 3 == 0 ? 3 : 1;
      targets[i].lse = i % 3 == 0 ? reinterpret_cast<float*>(target_mem + i * item_bytes + row_floats * 4) : nullptr;
    }
    alloc(&dtargets, items * sizeof(OutputTarget));
    up(dtargets, targets.data(), items * sizeof(OutputTarget));
    st = CudaStatus(e, "merge self-test targets");
  }
  // Way 0: a block per head, rows; way 1: a block per group; way 2 (with
  // targets): a block per head again.
  const int ways = targets_in == kMergeTargetsNone ? 2 : 3;
  std::vector<float> out(3 * outs);
  std::vector<uint8_t> first;  // way 1's targets
  if (st.ok()) st = CudaStatus(cudaMemset(dout, 0xff, 3 * outs * 4), "merge self-test");
  for (int way = 0; st.ok() && way < ways; ++way) {
    MergeParams p{};
    p.part = part;
    p.m_dev = dm;
    p.l_dev = dl;
    p.acc_dev = dacc;
    p.rotated = rotated;
    p.kv_heads = kv_heads;
    p.window_k_dev = dwk;
    p.window_v_dev = dwv;
    p.window_tokens_dev = dwt;
    p.query_dev = dq;
    p.softmax_scale = 0.088f;
    p.out_dev = dout + way * outs;
    p.lse_dev = dout + way * outs + qsz;
    p.per_head = way != 1;
    if (way > 0) p.targets_dev = dtargets;
    st = LaunchMerge(p, nullptr);
    if (st.ok() && way == 1 && ways == 3) st = CudaStatus(cudaDeviceSynchronize(), "merge self-test");
    if (st.ok() && way == 1 && ways == 3) {
      // Way 2 writes the same targets: clear them so that its own writes
      // are what is compared.
      first.resize(items * item_bytes);
      st = CudaStatus(cudaMemcpy(first.data(), target_mem, first.size(), cudaMemcpyDefault), "merge self-test");
      if (st.ok()) st = CudaStatus(cudaMemset(target_mem, 0xff, items * item_bytes), "merge self-test");
    }
  }
  if (st.ok()) st = CudaStatus(cudaMemcpy(out.data(), dout, 3 * outs * 4, cudaMemcpyDeviceToHost), "merge self-test");
  std::vector<uint8_t> second;
  if (st.ok() && ways == 3) {
    second.resize(items * item_bytes);
    st = CudaStatus(cudaMemcpy(second.data(), target_mem, second.size(), cudaMemcpyDefault), "merge self-test");
  }
  for (void* p : {static_cast<void*>(dm), static_cast<void*>(dl), static_cast<void*>(dacc), static_cast<void*>(dq),
                  static_cast<void*>(dout), static_cast<void*>(dwk), static_cast<void*>(dwv), static_cast<void*>(dwt),
                  static_cast<void*>(dtargets)}) {
    cudaFree(p);
  }
  if (target_mem != nullptr) targets_in == kMergeTargetsHost ? cudaFreeHost(target_mem) : cudaFree(target_mem);
  if (!st.ok()) return st;
  auto same = [](float a, float b) { return std::memcmp(&a, &b, 4) == 0; };
  float untouched;
  const uint32_t ones = 0xffffffffu;
  std::memcpy(&untouched, &ones, 4);
  int64_t differ = 0;
  for (int way = 1; way < ways; ++way) {
    const float* got = out.data() + way * outs;
    const std::vector<uint8_t>& t = way == 1 ? first : second;
    for (int i = 0; i < items; ++i) {
      const size_t o = static_cast<size_t>(i) * row_floats, lo = qsz + static_cast<size_t>(i) * q_heads;
      const bool targeted = ways == 3 && i % 3 != 2;
      for (size_t k = 0; k < row_floats; ++k) {
        const float want = out[o + k];
        if (!targeted) {
          differ += !same(got[o + k], want);
          continue;
        }
        differ += !same(got[o + k], untouched);  // rows of a targeted item stay as they were
        if (i % 3 == 0) {
          float f;
          std::memcpy(&f, t.data() + i * item_bytes + k * 4, 4);
          differ += !same(f, want);
        } else {
          uint16_t b;
          std::memcpy(&b, t.data() + i * item_bytes + k * 2, 2);
          differ += b != FloatToBf16(want);
        }
      }
      for (int h = 0; h < q_heads; ++h) {
        const float want = out[lo + h];
        if (!targeted) {
          differ += !same(got[lo + h], want);
          continue;
        }
        differ += !same(got[lo + h], untouched);
        float f;
        std::memcpy(&f, t.data() + i * item_bytes + (row_floats + h) * 4, 4);
        differ += !same(f, i % 3 == 0 ? want : untouched);
      }
    }
  }
  return differ;
}

}  // namespace gpu
}  // namespace driftkv
