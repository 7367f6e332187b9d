// bf16 paged decode attention: the in-project baseline and the kernel of the
// bf16 codec. One block of 128 threads per (split, KV head, item) walks
// 64-token tiles of its pages; K and V tiles stream through shared memory with
// cp.async, double-buffered, and the G query heads of the KV head share each
// tile (GQA). Split states are merged by the merge kernel (not rotated).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 64;
constexpr int kPad = 8;  // bf16 per row: 16 bytes, keeps LDS.128 rows conflict-free

struct KernelArgs {
  Bf16AttentionParams p;
  PartialLayout part;
  Workspace ws;
  int pages_per_split;
};

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int D>
constexpr size_t SmemBytes() {
  return 2 * 2 * static_cast<size_t>(kTile) * (D + kPad) * sizeof(uint16_t);
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads) Bf16AttentionKernel(KernelArgs args) {
  const Bf16AttentionParams& p = args.p;
  constexpr int kRow = D + kPad;
  constexpr int kHpt = G / 2;             // heads per thread in the score pass
  constexpr int kDpt = D * G / kThreads;  // channels per thread in the value pass
  extern __shared__ uint4 smem_raw[];
  uint16_t* kbuf = reinterpret_cast<uint16_t*>(smem_raw);  // [2][kTile][kRow]
  uint16_t* vbuf = kbuf + 2 * kTile * kRow;
  __shared__ float q[G][D];
  __shared__ float w[G][kTile];
  __shared__ float mrun[G], lrun[G], fac[G];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.x, g = blockIdx.y, item = blockIdx.z;
  const int n = p.kv_heads * D;
  const int tokens = p.tokens_dev[item];
  const int pages = (tokens + kPageTokens - 1) / kPageTokens;
  const int pg_begin = split * args.pages_per_split;
  const int pg_end = min(pages, pg_begin + args.pages_per_split);
  const int tiles = max(0, pg_end - pg_begin) * (kPageTokens / kTile);
  const int32_t* pt = p.page_table_dev + p.page_start_dev[item];

  for (int i = tid; i < G * D; i += kThreads) {
    q[i / D][i % D] = p.query_dev[(static_cast<size_t>(item) * p.q_heads + g * G) * D + i];
  }
  if (tid < G) {
    mrun[tid] = kNegInf;
    lrun[tid] = 0.0f;
  }
  // A split with no tiles skips the loop and its barriers: without this one
  // its epilogue could read mrun/lrun before they are set (racecheck found it).
  __syncthreads();

  auto tile_tokens = [&](int j) {
    const int first = (pg_begin + j / 2) * kPageTokens + (j % 2) * kTile;
    return max(0, min(kTile, tokens - first));
  };
  auto load_tile = [&](int j, int buf) {
    const uint8_t* page = p.pool_dev + static_cast<size_t>(pt[pg_begin + j / 2]) * (4 * kPageTokens) * n;
    const uint16_t* kg = reinterpret_cast<const uint16_t*>(page) + static_cast<size_t>((j % 2) * kTile) * n + g * D;
    const uint16_t* vg = kg + static_cast<size_t>(kPageTokens) * n;
    constexpr int kChunks = kTile * D / 8;
    for (int c = tid; c < kChunks; c += kThreads) {
      const int t = c / (D / 8), o = (c % (D / 8)) * 8;
      CpAsync16(kbuf + (buf * kTile + t) * kRow + o, kg + static_cast<size_t>(t) * n + o);
      CpAsync16(vbuf + (buf * kTile + t) * kRow + o, vg + static_cast<size_t>(t) * n + o);
    }
  };

  float acc[kDpt] = {};
  const int vh = tid / (kThreads / G), d0 = (tid % (kThreads / G)) * kDpt;
  if (tiles > 0) load_tile(0, 0);
  CpAsyncCommit();
  for (int j = 0; j < tiles; ++j) {
    const int buf = j & 1;
    if (j + 1 < tiles) load_tile(j + 1, buf ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int valid = tile_tokens(j);
    // Scores: thread = (token, kHpt heads).
    {
      const int t = tid % kTile, h0 = (tid / kTile) * kHpt;
      float dot[kHpt] = {};
      const uint16_t* kr = kbuf + (buf * kTile + t) * kRow;
#pragma unroll 4
      for (int o = 0; o < D; o += 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(kr + o);
        const uint32_t wv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float k0 = __uint_as_float(wv[e] << 16), k1 = __uint_as_float(wv[e] & 0xffff0000u);
#pragma unroll
          for (int hh = 0; hh < kHpt; ++hh) {
            dot[hh] += q[h0 + hh][o + 2 * e] * k0 + q[h0 + hh][o + 2 * e + 1] * k1;
          }
        }
      }
#pragma unroll
      for (int hh = 0; hh < kHpt; ++hh) w[h0 + hh][t] = t < valid ? p.softmax_scale * dot[hh] : kNegInf;
    }
    __syncthreads();
    if (warp < G) {
      const float s0 = w[warp][lane], s1 = w[warp][lane + 32];
      const float m_old = mrun[warp];
      const float m_new = fmaxf(m_old, WarpMax(fmaxf(s0, s1)));
      const float e0 = s0 == kNegInf ? 0.0f : __expf(s0 - m_new);
      const float e1 = s1 == kNegInf ? 0.0f : __expf(s1 - m_new);
      w[warp][lane] = e0;
      w[warp][lane + 32] = e1;
      const float sum = WarpSum(e0 + e1);
      if (lane == 0) {
        const float f = m_old == kNegInf ? 0.0f : __expf(m_old - m_new);
        fac[warp] = f;
        lrun[warp] = lrun[warp] * f + sum;
        mrun[warp] = m_new;
      }
    }
    __syncthreads();
    {
      const float f = fac[vh];
#pragma unroll
      for (int e = 0; e < kDpt; ++e) acc[e] *= f;
      // kDpt consecutive bf16 per thread in one load (2, 4 or 8 bytes).
      for (int t = 0; t < valid; ++t) {
        const float a = w[vh][t];
        const uint16_t* vr = vbuf + (buf * kTile + t) * kRow + d0;
        if constexpr (kDpt == 4) {
          const uint2 v = *reinterpret_cast<const uint2*>(vr);
          acc[0] += a * __uint_as_float(v.x << 16);
          acc[1] += a * __uint_as_float(v.x & 0xffff0000u);
          acc[2] += a * __uint_as_float(v.y << 16);
          acc[3] += a * __uint_as_float(v.y & 0xffff0000u);
        } else if constexpr (kDpt == 2) {
          const uint32_t v = *reinterpret_cast<const uint32_t*>(vr);
          acc[0] += a * __uint_as_float(v << 16);
          acc[1] += a * __uint_as_float(v & 0xffff0000u);
        } else {
#pragma unroll
          for (int e = 0; e < kDpt; ++e) acc[e] += a * Bf16ToFloatDev(vr[e]);
        }
      }
    }
    __syncthreads();
  }
  CpAsyncWait<0>();
  const size_t mi = args.part.ml_index(item, split, g * G + vh);
  if (tid % (kThreads / G) == 0) {
    args.ws.m[mi] = mrun[vh];
    args.ws.l[mi] = lrun[vh];
  }
#pragma unroll
  for (int e = 0; e < kDpt; ++e) args.ws.acc[mi * D + d0 + e] = acc[e];
}

}  // namespace

absl::Status LaunchBf16Attention(const Bf16AttentionParams& p, cudaStream_t stream) {
  if (p.items < 1) return absl::InvalidArgumentError(absl::StrCat("items ", p.items, " < 1"));
  if (p.kv_heads < 1 || p.q_heads % p.kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_heads ", p.q_heads, " is not a multiple of kv_heads ", p.kv_heads));
  }
  // About four waves of blocks (one per item, KV head and split), at least
  // two pages per split.
  const int pages = std::max(1, p.max_pages);
  const SplitPlan plan = PlanSplits(pages, p.splits, p.items * p.kv_heads, 4, 2);
  KernelArgs args;
  args.p = p;
  args.pages_per_split = plan.units_per_split;
  args.part = PartialLayout{p.items, plan.splits, p.q_heads, p.head_dim};
  args.ws = CarveWorkspace(p.workspace_dev, args.part);
  const dim3 grid(plan.splits, p.kv_heads, p.items);
  const int group = p.q_heads / p.kv_heads;
  absl::Status st = DispatchHeadDimGroup(p.head_dim, group, "bf16", [&](auto d, auto g) {
    constexpr int kD = decltype(d)::value, kG = decltype(g)::value;
    return LaunchKernel(Bf16AttentionKernel<kD, kG>, grid, kThreads, SmemBytes<kD>(), stream, "bf16 attention", args);
  });
  if (!st.ok()) return st;
  return LaunchMerge(MergeFor(args.part, args.ws, p.kv_heads, p.query_dev, p.softmax_scale, p.out_dev, p.lse_dev),
                     stream);
}

}  // namespace gpu
}  // namespace driftkv
