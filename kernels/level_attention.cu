// Decode attention on level pages (codec/level_page.h): the hot tier.
//
// One block of 4 warps per (split, KV head, item). Each warp owns every 4th
// page of the split and runs its own online softmax; the warps' states are
// combined in warp order at the end, so the sum order is fixed. Per page:
//  0. One lane starts bulk copies (cp.async.bulk, completion on an mbarrier)
//     of the page's headers and mean, and of the KV head's key and value
//     blocks, into one of the warp's two shared-memory stages; the next
//     page's copy runs while this one is computed.
//  1. Keys. Each lane reads its 3-bit levels as uint4 words already in
//     mma.m16n8k16 A-fragment order; a shift and a LOP3 put two levels into
//     the mantissas of fp16 1024 + m, one f16x2 subtract makes them exact
//     fp16 levels. The B operand is the rotated query split into fp16 hi and
//     lo halves (columns 0..G-1 hi, G..2G-1 lo), so the product of exact
//     integers with hi + lo is fp32-accurate. Score = scale * (s_t * dot +
//     o_t * sum q' + q' . mu), as on cold pages.
//  2. Online softmax per head in registers; the weights times each token's
//     value scale go through the key area of the stage (already consumed)
//     to be transposed into B fragments, again as fp16 hi/lo.
//  3. Values. Base-6 triples are decoded two at a time with packed 16-bit
//     SIMD arithmetic (multiply-shift division by 36 and 6), three fp16 level
//     pairs per triple, straight into A fragments of values transposed;
//     the offsets enter as sum_t w_t o_t.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"
#include "kernels/level_attention.h"
#include "kernels/transform.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 2;
constexpr int kHdrBytes = kLevelMeanLevelsOffset;  // headers + mean scale: [0, 1040)
constexpr uint32_t kMagic = 0x64006400u;           // fp16 1024 in both halves

static_assert(kLevelPageTokens == 128, "8 m-tiles of 16 tokens per page");
static_assert(kHdrBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

__host__ __device__ constexpr size_t StageBytes(int d, size_t head_bytes) {
  return (kHdrBytes + d + head_bytes + 127) / 128 * 128;
}

// ---- mbarrier and bulk copy (PTX ISA 8.0, sm_90) ----
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}\n" ::"r"(SmemAddr(bar)),
      "r"(phase)
      : "memory");
}
// Orders this thread's earlier generic-proxy accesses of shared memory
// before later bulk copies (async proxy) into it.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- dequantisation ----
// Two levels at bits [0, 3) and [16, 19) of v (other bits zero) -> exact
// fp16 pair: (v | 1024 1024) - (1024 1024).
__device__ __forceinline__ uint32_t LevelPairToHalf2(uint32_t v) {
  uint32_t r;
  asm("sub.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(v | kMagic), "r"(kMagic));
  return r;
}
__device__ __forceinline__ uint32_t KeyPair(uint32_t w, int sub) {
  return LevelPairToHalf2((w >> (3 * sub)) & 0x00070007u);
}
// Pair 15 of a key group: bit b of each level in bit 15 / 31 of word b.
__device__ __forceinline__ uint32_t KeyPair15(uint32_t w0, uint32_t w1, uint32_t w2) {
  const uint32_t v = ((w0 >> 15) & 0x00010001u) | ((w1 >> 14) & 0x00020002u) | ((w2 >> 13) & 0x00040004u);
  return LevelPairToHalf2(v);
}
// The three base-6 digits of the two bytes at bits [0, 8) and [16, 24) of
// v, as fp16 pairs (digit 0 first).
__device__ __forceinline__ void Triple(uint32_t v, uint32_t& d0, uint32_t& d1, uint32_t& d2) {
  const uint32_t l2 = ((v * 57u) >> 11) & 0x00070007u;
  const uint32_t r = v - 36u * l2;
  const uint32_t l1 = ((r * 43u) >> 8) & 0x00070007u;
  const uint32_t l0 = r - 6u * l1;
  d0 = LevelPairToHalf2(l0);
  d1 = LevelPairToHalf2(l1);
  d2 = LevelPairToHalf2(l2);
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int k) {
  return k == 0 ? v.x : (k == 1 ? v.y : (k == 2 ? v.z : v.w));
}

struct KernelArgs {
  LevelAttentionParams p;
  PartialLayout part;
  Workspace ws;
};

// Value k-step group GR of a page: decodes its triples into fp16 pairs in
// fragment order and multiplies each complete A fragment (4 pairs) with the
// weights of its k-step.
template <int D, int GR>
__device__ __forceinline__ void ValueGroup(const uint4* vb, int lane, const uint32_t (&pb)[8][2],
                                           float (&acc)[D / 16][4]) {
  constexpr int MT = D / 16;
  constexpr int kPairs = (GR < 2 ? 3 : 2) * MT * 4;
  constexpr int kFirstPair = GR * 3 * MT * 4;
  constexpr int kTriples = (kPairs + 2) / 3;
  constexpr int kWords = (kTriples + 1) / 2;
  constexpr int kVec0 = GR == 0 ? 0 : (GR == 1 ? 1 : 2) * ((((3 * MT * 4 + 2) / 3 + 1) / 2 + 3) / 4);
  constexpr int kVecs = (kWords + 3) / 4;
  uint4 raw[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) raw[i] = vb[(kVec0 + i) * 32 + lane];
  uint32_t pr[kTriples * 3 + 3];
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const uint32_t word = Word(raw[w / 4], w % 4);
    const uint32_t x = __byte_perm(word, 0u, 0x4240);
    const uint32_t y = __byte_perm(word, 0u, 0x4341);
    Triple(x, pr[6 * w], pr[6 * w + 1], pr[6 * w + 2]);
    if (2 * w + 1 < kTriples) Triple(y, pr[6 * w + 3], pr[6 * w + 4], pr[6 * w + 5]);
    // Fragments completed by this word.
#pragma unroll
    for (int f = 0; f < kPairs / 4; ++f) {
      const int last = 4 * f + 3;
      if (last >= 6 * w && last < 6 * w + 6) {
        const int P = kFirstPair + 4 * f;
        const int ks = P / (4 * MT), mt = (P / 4) % MT;
        const uint32_t a[4] = {pr[4 * f], pr[4 * f + 1], pr[4 * f + 2], pr[4 * f + 3]};
        Mma16816(acc[mt], a, pb[ks][0], pb[ks][1]);
      }
    }
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads, 2) LevelAttentionKernel(KernelArgs args) {
  constexpr int MT = D / 16;   // value m-tiles (16 channels each)
  constexpr int KS = D / 16;   // key k-steps
  constexpr int kGroupsPerMt = D / 64;
  static_assert(G == 2 || G == 4, "GQA group");
  const LevelAttentionParams& p = args.p;
  const LevelPageLayout& lay = p.layout;
  const size_t head_bytes = lay.key_block_bytes + lay.value_block_bytes;  // (host-only helpers of the layout)
  const size_t stage_bytes = StageBytes(D, head_bytes);

  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);              // [warp][stage]
  float* qs = reinterpret_cast<float*>(smem + 128);                 // [G][D] rotated query
  float* qsum = qs + G * D;                                         // [G]
  uint8_t* stages = smem + 128 + (G * D + 4) * 4;
  stages = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(stages) + 127) & ~uintptr_t{127});

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x, kvh = blockIdx.y, item = blockIdx.z;
  const int tokens = p.tokens_dev[item];
  const int pages = (tokens + kLevelPageTokens - 1) / kLevelPageTokens;
  const int pps = LevelPagesPerSplit(pages);
  const int first = split * pps;
  const int last = min(pages, first + pps);

  auto write_empty = [&](int hl, bool with_acc) {
    const int qh = kvh * G + hl;
    const size_t mi = args.part.ml_index(item, split, qh);
    if (with_acc) {
      for (int d = lane; d < D; d += 32) args.ws.acc[args.part.acc_index(item, split, qh) + d] = 0.0f;
    }
    if (lane == 0) {
      args.ws.m[mi] = kNegInf;
      args.ws.l[mi] = 0.0f;
    }
  };
  if (first >= last) {
    if (warp < G) write_empty(warp, true);
    return;
  }

  // This warp's pages: first + warp + kWarps * k.
  const int my_pages = first + warp < last ? (last - first - warp + kWarps - 1) / kWarps : 0;
  const int32_t* pt = p.page_table_dev + p.page_start_dev[item];
  uint64_t* my_bars = bars + warp * kStages;
  uint8_t* my_stages = stages + static_cast<size_t>(warp) * kStages * stage_bytes;
  auto issue = [&](int k) {
    const int page = first + warp + kWarps * k;
    const uint8_t* src = p.pool_dev + static_cast<size_t>(pt[page]) * lay.page_bytes;
    uint8_t* dst = my_stages + static_cast<size_t>(k % kStages) * stage_bytes;
    uint64_t* bar = my_bars + k % kStages;
    MbarExpect(bar, static_cast<uint32_t>(kHdrBytes + D + head_bytes));
    BulkCopy(dst, src, kHdrBytes, bar);
    BulkCopy(dst + kHdrBytes, src + kLevelMeanLevelsOffset + kvh * D, D, bar);
    BulkCopy(dst + kHdrBytes + D, src + lay.blocks_offset + kvh * head_bytes, static_cast<uint32_t>(head_bytes), bar);
  };
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) MbarInit(my_bars + s);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int k = 0; k < min(kStages, my_pages); ++k) issue(k);
  }

  // Prologue: the KV head's G query heads, rotated (Hadamard, as the keys).
  {
    const float* q = p.query_dev + (static_cast<size_t>(item) * p.q_heads + kvh * G) * D;
    for (int i = tid; i < G * D; i += kThreads) qs[i] = q[i];
    for (int len = 1; len < D; len <<= 1) {
      __syncthreads();
      for (int i = tid; i < G * D / 2; i += kThreads) {
        const int h = i / (D / 2), r = i % (D / 2);
        const int j = (r / len) * 2 * len + (r % len);
        float* x = qs + h * D;
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
    __syncthreads();
    const float norm = rsqrtf(static_cast<float>(D));
    for (int i = tid; i < G * D; i += kThreads) qs[i] *= norm;
    __syncthreads();
    if (warp < G) {
      float s = 0.0f;
      for (int d = lane; d < D; d += 32) s += qs[warp * D + d];
      s = WarpSum(s);
      if (lane == 0) qsum[warp] = s;
    }
    __syncthreads();
  }
  // B fragments of the keys: column g is head g (hi) or g - G (lo), or zero.
  uint32_t qf[KS][2];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int reg = 0; reg < 2; ++reg) {
      uint16_t h2[2] = {0, 0};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (g < 2 * G) {
          uint16_t hi, lo;
          SplitHalf(qs[(g % G) * D + 16 * ks + 2 * t + 8 * reg + e], &hi, &lo);
          h2[e] = g < G ? hi : lo;
        }
      }
      qf[ks][reg] = h2[0] | (static_cast<uint32_t>(h2[1]) << 16);
    }
  }
  const int hp = 2 * (t & (G / 2 - 1));  // this lane's two heads (local)
  const bool owner = t < G / 2;          // writes weights and the final state
  const float qsum0 = qsum[hp], qsum1 = qsum[hp + 1];
  const float scale = p.softmax_scale;
  const int head_sel = g % G;
  const uint32_t half_sel = g < G ? 0x5410u : 0x7632u;
  const bool col_used = g < 2 * G;

  float m_run0 = kNegInf, m_run1 = kNegInf, l_run0 = 0.0f, l_run1 = 0.0f, o_run0 = 0.0f, o_run1 = 0.0f;
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int k = 0; k < my_pages; ++k) {
    MbarWait(my_bars + k % kStages, (k / kStages) & 1);
    const uint8_t* st = my_stages + static_cast<size_t>(k % kStages) * stage_bytes;
    const int page = first + warp + kWarps * k;
    const int valid = min(kLevelPageTokens, tokens - page * kLevelPageTokens);

    // q' . mu of this lane's two heads.
    float qmu0 = 0.0f, qmu1 = 0.0f;
    {
      const float mscale = *reinterpret_cast<const float*>(st + kLevelMeanOffset);
      const int8_t* q8 = reinterpret_cast<const int8_t*>(st + kHdrBytes);
#pragma unroll
      for (int hh = 0; hh < G; ++hh) {
        float s = 0.0f;
#pragma unroll
        for (int d = lane; d < D; d += 32) s += qs[hh * D + d] * static_cast<float>(q8[d]);
        s = WarpSum(s) * mscale;
        if (hh == hp) qmu0 = s;
        if (hh == hp + 1) qmu1 = s;
      }
    }

    // ---- 1. keys: dot[mt][r] for tokens 16 mt + g (+8), columns 2t, 2t+1 ----
    float dacc[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) dacc[i][0] = dacc[i][1] = dacc[i][2] = dacc[i][3] = 0.0f;
    {
      const uint4* kb = reinterpret_cast<const uint4*>(st + kHdrBytes + D);
      constexpr int kUnits = D / 32;  // 12 words (3 uint4) each: 4 groups of 3 words
#pragma unroll
      for (int u = 0; u < kUnits; ++u) {
        const uint4 r0 = kb[(3 * u) * 32 + lane], r1 = kb[(3 * u + 1) * 32 + lane], r2 = kb[(3 * u + 2) * 32 + lane];
        const uint32_t w[12] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w, r2.x, r2.y, r2.z, r2.w};
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) {
          const int gidx = 4 * u + gi;  // group index in the lane's order
          const int mt = gidx / kGroupsPerMt, grp = gidx % kGroupsPerMt;
          const uint32_t w0 = w[3 * gi], w1 = w[3 * gi + 1], w2 = w[3 * gi + 2];
#pragma unroll
          for (int f = 0; f < 4; ++f) {
            uint32_t a[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int e = 4 * f + r;
              const uint32_t ww = e / 5 == 0 ? w0 : (e / 5 == 1 ? w1 : w2);
              a[r] = e < 15 ? KeyPair(ww, e % 5) : KeyPair15(w0, w1, w2);
            }
            const int ks = grp * 4 + f;
            Mma16816(dacc[mt], a, qf[ks][0], qf[ks][1]);
          }
        }
      }
    }

    // ---- 2. scores and online softmax ----
    float mx0 = kNegInf, mx1 = kNegInf;
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int tok = 16 * mt + g + 8 * hr;
        const float d0 = dacc[mt][2 * hr] + __shfl_xor_sync(0xffffffffu, dacc[mt][2 * hr], G / 2);
        const float d1 = dacc[mt][2 * hr + 1] + __shfl_xor_sync(0xffffffffu, dacc[mt][2 * hr + 1], G / 2);
        const uint32_t hdr = *reinterpret_cast<const uint32_t*>(st + 4 * tok);
        const float ks = HalfBitsToFloat(hdr & 0xffff), ko = HalfBitsToFloat(hdr >> 16);
        const bool ok = tok < valid;
        const float s0 = ok ? scale * (ks * d0 + ko * qsum0 + qmu0) : kNegInf;
        const float s1 = ok ? scale * (ks * d1 + ko * qsum1 + qmu1) : kNegInf;
        dacc[mt][2 * hr] = s0;
        dacc[mt][2 * hr + 1] = s1;
        mx0 = fmaxf(mx0, s0);
        mx1 = fmaxf(mx1, s1);
      }
    }
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
    }
    const float mn0 = fmaxf(m_run0, mx0), mn1 = fmaxf(m_run1, mx1);
    const float f0 = m_run0 == kNegInf ? (mn0 == kNegInf ? 1.0f : 0.0f) : __expf(m_run0 - mn0);
    const float f1 = m_run1 == kNegInf ? (mn1 == kNegInf ? 1.0f : 0.0f) : __expf(m_run1 - mn1);
    m_run0 = mn0;
    m_run1 = mn1;
    l_run0 *= f0;
    l_run1 *= f1;
    o_run0 *= f0;
    o_run1 *= f1;
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      acc[i][0] *= f0;
      acc[i][1] *= f1;
      acc[i][2] *= f0;
      acc[i][3] *= f1;
    }
    // Weights w * s_v, split hi | lo << 16, into [head][token] words in the
    // stage's key area (read completely above).
    uint32_t* wbuf = reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(st) + kHdrBytes + D);
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int tok = 16 * mt + g + 8 * hr;
        const uint32_t hdr = *reinterpret_cast<const uint32_t*>(st + 512 + 4 * tok);
        const float vs = HalfBitsToFloat(hdr & 0xffff), vo = HalfBitsToFloat(hdr >> 16);
        const float s0 = dacc[mt][2 * hr], s1 = dacc[mt][2 * hr + 1];
        const float w0 = s0 == kNegInf ? 0.0f : __expf(s0 - mn0);
        const float w1 = s1 == kNegInf ? 0.0f : __expf(s1 - mn1);
        l_run0 += w0;
        l_run1 += w1;
        o_run0 += w0 * vo;
        o_run1 += w1 * vo;
        if (owner) {
          uint16_t hi, lo;
          SplitHalf(w0 * vs, &hi, &lo);
          wbuf[hp * kLevelPageTokens + tok] = hi | (static_cast<uint32_t>(lo) << 16);
          SplitHalf(w1 * vs, &hi, &lo);
          wbuf[(hp + 1) * kLevelPageTokens + tok] = hi | (static_cast<uint32_t>(lo) << 16);
        }
      }
    }
    __syncwarp();
    uint32_t pb[8][2];
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
      for (int reg = 0; reg < 2; ++reg) {
        uint32_t b = 0u;
        if (col_used) {
          const uint2 ww = *reinterpret_cast<const uint2*>(wbuf + head_sel * kLevelPageTokens + 16 * ks + 2 * t + 8 * reg);
          b = __byte_perm(ww.x, ww.y, half_sel);
        }
        pb[ks][reg] = b;
      }
    }

    // ---- 3. values ----
    {
      const uint4* vb = reinterpret_cast<const uint4*>(st + kHdrBytes + D + lay.key_block_bytes);
      ValueGroup<D, 0>(vb, lane, pb, acc);
      ValueGroup<D, 1>(vb, lane, pb, acc);
      ValueGroup<D, 2>(vb, lane, pb, acc);
    }
    __syncwarp();
    if (lane == 0 && k + kStages < my_pages) {
      FenceProxyAsync();
      issue(k + kStages);
    }
  }

  // Per lane sums over its tokens -> per warp (lanes of one t hold other tokens).
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    l_run0 += __shfl_xor_sync(0xffffffffu, l_run0, o);
    l_run1 += __shfl_xor_sync(0xffffffffu, l_run1, o);
    o_run0 += __shfl_xor_sync(0xffffffffu, o_run0, o);
    o_run1 += __shfl_xor_sync(0xffffffffu, o_run1, o);
  }
  // hi + lo columns of the accumulator.
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], G / 2);
  }

  // Combine the warps in warp order through shared memory (the stages are free).
  __syncthreads();
  float* cacc = reinterpret_cast<float*>(stages);       // [warp][G][D]
  float* cml = cacc + kWarps * G * D;                   // [warp][G][3]: m, l, o
  if (owner) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int c0 = 16 * i + g, c1 = c0 + 8;
      float* a0 = cacc + (warp * G + hp) * D;
      float* a1 = a0 + D;
      a0[c0] = acc[i][0];
      a1[c0] = acc[i][1];
      a0[c1] = acc[i][2];
      a1[c1] = acc[i][3];
    }
    if (g == 0) {
      float* ml = cml + (warp * G + hp) * 3;
      ml[0] = m_run0;
      ml[1] = l_run0;
      ml[2] = o_run0;
      ml[3] = m_run1;
      ml[4] = l_run1;
      ml[5] = o_run1;
    }
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int hl = i / D, d = i % D;
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, cml[(w * G + hl) * 3]);
    float l = 0.0f, o = 0.0f, a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = cml[(w * G + hl) * 3];
      if (mw == kNegInf) continue;
      const float f = __expf(mw - m);
      l += f * cml[(w * G + hl) * 3 + 1];
      o += f * cml[(w * G + hl) * 3 + 2];
      a += f * cacc[(w * G + hl) * D + d];
    }
    const int qh = kvh * G + hl;
    args.ws.acc[args.part.acc_index(item, split, qh) + d] = a + o;
    if (d == 0) {
      const size_t mi = args.part.ml_index(item, split, qh);
      args.ws.m[mi] = m;
      args.ws.l[mi] = l;
    }
  }
}

template <int D, int G>
absl::Status Launch(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  auto kernel = LevelAttentionKernel<D, G>;
  const size_t smem = 128 + (G * D + 4) * 4 + 128 + static_cast<size_t>(kWarps) * kStages *
                                                      StageBytes(D, args.p.layout.head_bytes());
  if (smem > 227 * 1024) return absl::InvalidArgumentError(absl::StrCat("level page too large: ", smem, " B of shared memory"));
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return CudaStatus(e, "cudaFuncSetAttribute(level attention)");
  kernel<<<grid, kThreads, smem, stream>>>(args);
  return CudaStatus(cudaGetLastError(), "level attention launch");
}

absl::Status Dispatch(int head_dim, int group, const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  switch (head_dim * 16 + group) {
    case 128 * 16 + 4: return Launch<128, 4>(args, grid, stream);
    case 128 * 16 + 2: return Launch<128, 2>(args, grid, stream);
    case 64 * 16 + 4: return Launch<64, 4>(args, grid, stream);
    case 64 * 16 + 2: return Launch<64, 2>(args, grid, stream);
    default:
      return absl::InvalidArgumentError(absl::StrCat("no level-page kernel for head_dim ", head_dim,
                                                     " and GQA group ", group, " (have 64/128 x 2/4)"));
  }
}

}  // namespace

size_t LevelAttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages) {
  return AttentionWorkspaceBytes(items, q_heads, head_dim, max_pages);
}

absl::Status LaunchLevelAttention(const LevelAttentionParams& p, cudaStream_t stream) {
  const LevelPageLayout& l = p.layout;
  if (p.items < 1) return absl::InvalidArgumentError(absl::StrCat("items ", p.items, " < 1"));
  if (l.kv_heads < 1 || p.q_heads % l.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", p.q_heads, " not a multiple of kv_heads ", l.kv_heads));
  }
  if (l.page_bytes % 16 != 0 || l.blocks_offset % 16 != 0 || l.head_bytes() % 16 != 0) {
    return absl::InvalidArgumentError("level page layout not aligned (use MakeLevelPageLayout)");
  }
  if (p.max_pages < 0) return absl::InvalidArgumentError(absl::StrCat("max_pages ", p.max_pages, " < 0"));
  const int splits = std::max(1, (p.max_pages + LevelPagesPerSplit(p.max_pages) - 1) / LevelPagesPerSplit(p.max_pages));
  KernelArgs args;
  args.p = p;
  args.part = PartialLayout{p.items, splits, p.q_heads, l.head_dim};
  args.ws = CarveWorkspace(p.workspace_dev, args.part);
  if (p.transforms_dev != nullptr) {
    if (p.layer_dev == nullptr || p.transform_layers < 1) {
      return absl::InvalidArgumentError("transforms_dev needs layer_dev and transform_layers >= 1");
    }
    // H q' = H T_K^-T q per item into the workspace after the partial
    // states; the kernel's own Hadamard then yields q'.
    float* q_pages = args.ws.acc + args.part.count() * l.head_dim;
    HeadTransformParams tp;
    tp.mats_dev = p.transforms_dev;
    tp.layers = p.transform_layers;
    tp.kv_heads = l.kv_heads;
    tp.head_dim = l.head_dim;
    tp.matrix = kTfQuery;
    tp.in_dev = p.query_dev;
    tp.out_dev = q_pages;
    tp.rows = p.items;
    tp.heads = p.q_heads;
    tp.layer_dev = p.layer_dev;
    absl::Status st = LaunchHeadTransform(tp, stream);
    if (!st.ok()) return st;
    args.p.query_dev = q_pages;
  }
  const dim3 grid(splits, l.kv_heads, p.items);
  absl::Status st = Dispatch(l.head_dim, p.q_heads / l.kv_heads, args, grid, stream);
  if (!st.ok()) return st;
  MergeParams m;
  m.part = args.part;
  m.m_dev = args.ws.m;
  m.l_dev = args.ws.l;
  m.acc_dev = args.ws.acc;
  m.rotated = p.transforms_dev == nullptr;
  if (p.transforms_dev != nullptr && !p.values_folded) {
    m.out_transform_dev = p.transforms_dev;
    m.layer_dev = p.layer_dev;
  }
  m.kv_heads = l.kv_heads;
  m.window_k_dev = p.window_k_dev;
  m.window_v_dev = p.window_v_dev;
  m.window_tokens_dev = p.window_tokens_dev;
  m.window_start_dev = p.window_start_dev;
  m.query_dev = p.query_dev;
  m.softmax_scale = p.softmax_scale;
  m.out_dev = p.out_dev;
  m.lse_dev = p.lse_dev;
  return LaunchMerge(m, stream);
}

}  // namespace gpu
}  // namespace driftkv
