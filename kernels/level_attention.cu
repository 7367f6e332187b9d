// Decode attention on level pages (codec/level_page.h): the hot tier.
//
// One block of 4 warps per (split, KV head, item), four blocks an SM. Each
// warp owns every 4th page of the split and runs its own online softmax; the
// warps' states are combined in warp order at the end, so the sum order is
// fixed. Before the pages, each warp rotates one query head in registers
// and the block shares the rotated heads (fp32, and fp16 hi | lo times the
// query's power of two). Per page:
//  0. One lane starts bulk copies (cp.async.bulk, completion on an mbarrier)
//     of the page's headers and mean, and of the KV head's key and value
//     blocks, into the warp's shared-memory stage.
//  1. Keys. Each lane reads its 3-bit levels as uint4 words already in
//     mma.m16n8k16 A-fragment order; a mask (after a shift for most
//     fields) makes each pair two fp16 subnormals, level * 2^(p - 24), p
//     the field's place (KeyGroupPairs). The B operand is the rotated
//     query split into fp16 hi and lo halves (columns 0..G-1 hi, G..2G-1
//     lo), times the powers of two that give every product one scale, so
//     the product of exact levels with hi + lo is fp32-accurate.
//     Score = scale * (s_t * dot + o_t * sum q' + q' . mu), as on cold
//     pages, kept in log2 units (scale times log2 e) so that each
//     weight is one ex2; the split's max goes out in natural-log units.
//  2. Online softmax per head in registers (a lane and its hi/lo partner
//     split the rows); the weights times each token's value scale go
//     through the key area of the stage (already consumed) to be transposed
//     into B fragments, again as fp16 hi/lo.
//  3. Values. Base-6 triples are decoded two bytes at a time in f16x2
//     arithmetic (Triple), three fp16 level pairs per triple, straight into A
//     fragments of the values transposed; the offsets enter as sum_t w_t o_t.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/attention.h"
#include "kernels/bulk_copy.cuh"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/level_attention.h"
#include "kernels/level_decode.cuh"
#include "kernels/level_query.cuh"
#include "kernels/window_merge.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kHdrBytes = kLevelMeanLevelsOffset;  // headers + mean scale: [0, 1040)
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

static_assert(kLevelPageTokens == 128, "8 m-tiles of 16 tokens per page");
static_assert(kHdrBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

__host__ __device__ constexpr size_t StageBytes(int d, size_t head_bytes) {
  return (kHdrBytes + d + head_bytes + 127) / 128 * 128;
}

struct KernelArgs {
  LevelAttentionParams p;
  PartialLayout part;
  Workspace ws;
  // The merge's parameters; part.splits counts the window's state after
  // the pages' when the window is attended by kernels/window_merge.cuh, and
  // with in_launch the window and the merge run in the attention kernel's
  // launch.
  MergeParams merge;
  bool in_launch = false;
};

// Value k-step group GR of a page: decodes its triples into fp16 pairs in
// fragment order and multiplies each complete A fragment (4 pairs) with the
// weights of its k-step.
template <int D, int GR>
__device__ __forceinline__ void ValueGroup(const uint4* vb, int lane, const DecodeConsts& dc,
                                           const uint32_t (&pb)[8][2], float (&acc)[D / 16][4]) {
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
    Triple<0x4240u>(word, dc, pr[6 * w], pr[6 * w + 1], pr[6 * w + 2]);
    if (2 * w + 1 < kTriples) Triple<0x4341u>(word, dc, pr[6 * w + 3], pr[6 * w + 4], pr[6 * w + 5]);
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

// This lane's place in the mma fragments: g = lane / 4 is the fragment row
// (token) of the A operand and the column of B, t = lane % 4 the k pair.
template <int G>
struct LaneRoles {
  int g, t;
  int hp;             // this lane's two heads (local): hp, hp + 1
  bool owner;         // writes the final state
  bool upper;         // owns rows g + 8 (else rows g) of the scores
  bool active;        // lanes of unused columns (G = 2) sit out
  int row;            // g or g + 8
  int head_sel;       // B column g reads the weights of head g % G ...
  uint32_t half_sel;  // ... its hi (g < G) or lo half
  bool col_used;      // column g < 2G
};

template <int G>
__device__ __forceinline__ LaneRoles<G> MakeLaneRoles(int lane) {
  LaneRoles<G> r;
  r.g = lane >> 2;
  r.t = lane & 3;
  r.hp = 2 * (r.t & (G / 2 - 1));
  r.owner = r.t < G / 2;
  r.upper = (r.t & (G / 2)) != 0;
  r.active = r.t < G;
  r.row = r.g + (r.upper ? 8 : 0);
  r.head_sel = r.g % G;
  r.half_sel = r.g < G ? 0x5410u : 0x7632u;
  r.col_used = r.g < 2 * G;
  return r;
}

// A lane's online-softmax state of its two heads: running max m, denominator
// l and sum of w_t o_t (the value offsets), over the tokens the lane scored.
// Empty: (-inf, 0, 0).
struct RunState {
  float m0 = kNegInf, m1 = kNegInf, l0 = 0.0f, l1 = 0.0f, o0 = 0.0f, o1 = 0.0f;
};

// The empty partial state of local head hl (a split with no pages).
template <int D, int G>
__device__ __forceinline__ void WriteEmptyState(const KernelArgs& args, int item, int split, int kvh, int hl,
                                                int lane) {
  const int qh = kvh * G + hl;
  const size_t mi = args.part.ml_index(item, split, qh);
  for (int d = lane; d < D; d += 32) args.ws.acc[args.part.acc_index(item, split, qh) + d] = 0.0f;
  if (lane == 0) {
    args.ws.m[mi] = kNegInf;
    args.ws.l[mi] = 0.0f;
  }
}

// Step 0 for one page (one lane): bulk copies of the page's headers and
// mean scale, the KV head's mean levels and its key and value blocks into
// `dst`, completing on `bar`.
template <int D>
__device__ __forceinline__ void IssuePage(const uint8_t* src, int kvh, size_t head_bytes, size_t blocks_offset,
                                          uint8_t* dst, uint64_t* bar) {
  MbarExpect(bar, static_cast<uint32_t>(kHdrBytes + D + head_bytes));
  BulkCopy(dst, src, kHdrBytes, bar);
  BulkCopy(dst + kHdrBytes, src + kLevelMeanLevelsOffset + kvh * D, D, bar);
  BulkCopy(dst + kHdrBytes + D, src + blocks_offset + kvh * head_bytes, static_cast<uint32_t>(head_bytes), bar);
}

// B fragments of the keys: column g is head g (hi) or g - G (lo), or zero,
// of the query times 2^e (qhl), times 2^(6 - p) for the scale p of the
// keys' registers they meet (kKeyPairPos: b0 meets pairs 4f, 4f + 1 of
// k-step f of a group, b1 pairs 4f + 2, 4f + 3). Powers of two at most
// 2^6 on halves below 2^9: hi + lo keep their bits, below 2^15.
template <int D, int G>
__device__ __forceinline__ void QueryFragments(const uint32_t* qhl, const LaneRoles<G>& lr, uint32_t (&qf)[D / 16][2]) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int reg = 0; reg < 2; ++reg) {
      uint32_t b = 0u;
      if (lr.col_used) {
        const uint2 w = *reinterpret_cast<const uint2*>(qhl + (lr.g % G) * D + 16 * ks + 2 * lr.t + 8 * reg);
        const uint32_t h = static_cast<uint32_t>(6 - kKeyPairPos[4 * (ks % 4) + 2 * reg] + 15) << 10;
        b = Hmul2(__byte_perm(w.x, w.y, lr.half_sel), h | (h << 16));
      }
      qf[ks][reg] = b;
    }
  }
}

// q' . mu of this lane's two heads hp, hp + 1 on the staged page, times
// `unit` (the softmax scale in log2 units). Lane l takes channels C l ..
// C l + C - 1 (C = D / 32) of every head, and the G partial sums meet in
// one butterfly that halves the heads a lane carries at each of the first
// steps (G = 4: heads by lane bit 0, then bit 1; G = 2: bit 0), so a page
// costs 7 (G = 4) or 6 (G = 2) shuffles instead of 5 a head, plus one
// that gives the lane the head its partner kept.
template <int D, int G>
__device__ __forceinline__ void MeanDots(const uint8_t* st, const float* qs, int lane, float unit, float& qmu0,
                                         float& qmu1) {
  constexpr int C = D / 32;
  static_assert(C == 2 || C == 4, "head_dim 64 or 128");
  const float mscale = *reinterpret_cast<const float*>(st + kLevelMeanOffset) * unit;
  const int8_t* q8 = reinterpret_cast<const int8_t*>(st + kHdrBytes) + C * lane;
  float mu[C];
  if constexpr (C == 4) {
    const char4 m4 = *reinterpret_cast<const char4*>(q8);
    mu[0] = m4.x, mu[1] = m4.y, mu[2] = m4.z, mu[3] = m4.w;
  } else {
    const char2 m2 = *reinterpret_cast<const char2*>(q8);
    mu[0] = m2.x, mu[1] = m2.y;
  }
  float part[G];
#pragma unroll
  for (int hh = 0; hh < G; ++hh) {
    const float* qh = qs + hh * D + C * lane;
    float q[C];
    if constexpr (C == 4) {
      const float4 v = *reinterpret_cast<const float4*>(qh);
      q[0] = v.x, q[1] = v.y, q[2] = v.z, q[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(qh);
      q[0] = v.x, q[1] = v.y;
    }
    float acc = q[0] * mu[0];
#pragma unroll
    for (int j = 1; j < C; ++j) acc = fmaf(q[j], mu[j], acc);
    part[hh] = acc;
  }
  const bool b0 = lane & 1;
  float k0, k1;  // G = 4: heads hp, hp + 1 (hp = 2 b0); G = 2: heads 0, 1
  if constexpr (G == 4) {
    k0 = (b0 ? part[2] : part[0]) + __shfl_xor_sync(0xffffffffu, b0 ? part[0] : part[2], 1);
    k1 = (b0 ? part[3] : part[1]) + __shfl_xor_sync(0xffffffffu, b0 ? part[1] : part[3], 1);
  } else {
    k0 = part[0];
    k1 = part[1];
  }
  // One of the two heads a lane: the first (bit s = 0) or the second.
  constexpr int s = G == 4 ? 2 : 1;
  const bool hb = (lane & s) != 0;
  float mine = (hb ? k1 : k0) + __shfl_xor_sync(0xffffffffu, hb ? k0 : k1, s);
#pragma unroll
  for (int o = 2 * s; o < 32; o <<= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
  const float other = __shfl_xor_sync(0xffffffffu, mine, s);
  qmu0 = (hb ? other : mine) * mscale;
  qmu1 = (hb ? mine : other) * mscale;
}

// ---- 1. keys: dot[mt][r] for tokens 16 mt + g (+8), columns 2t, 2t+1 ----
template <int D>
__device__ __forceinline__ void KeyDots(const uint4* kb, int lane, const uint32_t (&qf)[D / 16][2],
                                        float (&dacc)[8][4]) {
  constexpr int kGroupsPerMt = D / 64;
  constexpr int kUnits = D / 32;  // 12 words (3 uint4) each: 4 groups of 3 words
#pragma unroll
  for (int u = 0; u < kUnits; ++u) {
    const uint4 r0 = kb[(3 * u) * 32 + lane], r1 = kb[(3 * u + 1) * 32 + lane], r2 = kb[(3 * u + 2) * 32 + lane];
    const uint32_t w[12] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w, r2.x, r2.y, r2.z, r2.w};
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
      const int gidx = 4 * u + gi;  // group index in the lane's order
      const int mt = gidx / kGroupsPerMt, grp = gidx % kGroupsPerMt;
      uint32_t pr[16];
      KeyGroupPairs(w[3 * gi], w[3 * gi + 1], w[3 * gi + 2], pr);
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const uint32_t a[4] = {pr[4 * f], pr[4 * f + 1], pr[4 * f + 2], pr[4 * f + 3]};
        const int ks = grp * 4 + f;
        if (ks == 0) {
          Mma16816Zero(dacc[mt], a, qf[ks][0], qf[ks][1]);  // an m-tile's first k-step
        } else {
          Mma16816(dacc[mt], a, qf[ks][0], qf[ks][1]);
        }
      }
    }
  }
}

// ---- 2a. scores of the lane's rows and the page's max per head ----
// Scores are in log2 units (the softmax scale times log2 e, `unit`), so
// that a weight is one ex2. Lane and its partner (lane ^ G/2) hold the hi
// and lo columns of the same heads; the lower lane keeps row g of each
// m-tile, the upper row g + 8, and they swap the other halves (two shuffles
// per m-tile). a = unit * sum q', b = unit * q' . mu of the lane's heads;
// kunit = unit times the inverse of the keys' dot products' scale.
template <int G>
__device__ __forceinline__ void PageScores(const uint8_t* st, const float (&dacc)[8][4], const LaneRoles<G>& lr,
                                           int valid, float kunit, float a0, float a1, float b0, float b1,
                                           float (&sc)[8][2], float& mx0, float& mx1) {
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    const float r0 = __shfl_xor_sync(0xffffffffu, lr.upper ? dacc[mt][0] : dacc[mt][2], G / 2);
    const float r1 = __shfl_xor_sync(0xffffffffu, lr.upper ? dacc[mt][1] : dacc[mt][3], G / 2);
    const float d0 = (lr.upper ? dacc[mt][2] : dacc[mt][0]) + r0;
    const float d1 = (lr.upper ? dacc[mt][3] : dacc[mt][1]) + r1;
    const uint32_t hdr = *reinterpret_cast<const uint32_t*>(st + 4 * (16 * mt + lr.row));
    const float ks = HalfBitsToFloat(hdr & 0xffff) * kunit, ko = HalfBitsToFloat(hdr >> 16);
    sc[mt][0] = fmaf(ks, d0, fmaf(ko, a0, b0));
    sc[mt][1] = fmaf(ks, d1, fmaf(ko, a1, b1));
  }
  // Rows past the page's tokens (only a sequence's last page has them) and
  // the lanes of unused columns (G = 2) weigh nothing.
  if (!lr.active || valid < kLevelPageTokens) {
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      if (!lr.active || 16 * mt + lr.row >= valid) sc[mt][0] = sc[mt][1] = kNegInf;
    }
  }
  mx0 = sc[0][0];
  mx1 = sc[0][1];
#pragma unroll
  for (int mt = 1; mt < 8; ++mt) {
    mx0 = fmaxf(mx0, sc[mt][0]);
    mx1 = fmaxf(mx1, sc[mt][1]);
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, G / 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, G / 2));
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
  }
}

// 2^x (ex2.approx: 2^-inf = +0). Flushed to zero below 2^-126: a weight
// that small beside the page's largest (2^0) adds nothing to a float sum,
// and without .ftz each call is four instructions (a compare and two
// predicated multiplies around the MUFU) instead of one.
__device__ __forceinline__ float Ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// ---- 2b. online softmax: the running state and accumulator rescaled to
// the new max (mn0, mn1 on return). A page has at least one token, so the
// page's max and mn0, mn1 are finite, and a running max of -inf (no page
// yet) gives the factor 0. ----
template <int MT>
__device__ __forceinline__ void Rescale(float mx0, float mx1, RunState& rs, float (&acc)[MT][4], float& mn0,
                                        float& mn1) {
  mn0 = fmaxf(rs.m0, mx0);
  mn1 = fmaxf(rs.m1, mx1);
  // Where no head of the warp has a new max, every factor would be 2^0:
  // the multiplications are skipped.
  if (!__any_sync(0xffffffffu, mn0 != rs.m0 || mn1 != rs.m1)) return;
  const float f0 = Ex2(rs.m0 - mn0);
  const float f1 = Ex2(rs.m1 - mn1);
  rs.m0 = mn0;
  rs.m1 = mn1;
  rs.l0 *= f0;
  rs.l1 *= f1;
  rs.o0 *= f0;
  rs.o1 *= f1;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    acc[i][0] *= f0;
    acc[i][1] *= f1;
    acc[i][2] *= f0;
    acc[i][3] *= f1;
  }
}

// ---- 2c. weights: w = 2^(score - max) into the running sums (a masked
// score of -inf gives 0), and w * s_v split hi | lo << 16 into
// [head][token] words of wbuf (the stage's key area, read completely by
// KeyDots); then the B fragments of the values' mma, pb[k-step][reg] ----
template <int G>
__device__ __forceinline__ void PageWeights(const uint8_t* st, uint32_t* wbuf, const float (&sc)[8][2],
                                            const LaneRoles<G>& lr, float mn0, float mn1, RunState& rs,
                                            uint32_t (&pb)[8][2]) {
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    const int tok = 16 * mt + lr.row;
    const uint32_t hdr = *reinterpret_cast<const uint32_t*>(st + 512 + 4 * tok);
    const float vs = HalfBitsToFloat(hdr & 0xffff), vo = HalfBitsToFloat(hdr >> 16);
    const float w0 = Ex2(sc[mt][0] - mn0);
    const float w1 = Ex2(sc[mt][1] - mn1);
    rs.l0 += w0;
    rs.l1 += w1;
    rs.o0 = fmaf(w0, vo, rs.o0);
    rs.o1 = fmaf(w1, vo, rs.o1);
    if (lr.active) {
      // hi = fp16(x), lo = fp16(x - hi) of both heads, two at a time.
      const float x0 = w0 * vs, x1 = w1 * vs;
      const __half2 hi = __floats2half2_rn(x0, x1);
      const float2 hf = __half22float2(hi);
      const __half2 lo = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
      const uint32_t hb = *reinterpret_cast<const uint32_t*>(&hi), lb = *reinterpret_cast<const uint32_t*>(&lo);
      wbuf[lr.hp * kLevelPageTokens + tok] = __byte_perm(hb, lb, 0x5410);
      wbuf[(lr.hp + 1) * kLevelPageTokens + tok] = __byte_perm(hb, lb, 0x7632);
    }
  }
  __syncwarp();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks) {
#pragma unroll
    for (int reg = 0; reg < 2; ++reg) {
      uint32_t b = 0u;
      if (lr.col_used) {
        const uint2 ww =
            *reinterpret_cast<const uint2*>(wbuf + lr.head_sel * kLevelPageTokens + 16 * ks + 2 * lr.t + 8 * reg);
        b = __byte_perm(ww.x, ww.y, lr.half_sel);
      }
      pb[ks][reg] = b;
    }
  }
}

// The lane's sums over its tokens -> per warp (lanes of the same heads: the
// partner and the other g hold other tokens), and the hi + lo columns of
// the accumulator.
template <int G, int MT>
__device__ __forceinline__ void ReduceLanes(RunState& rs, float (&acc)[MT][4]) {
  rs.l0 += __shfl_xor_sync(0xffffffffu, rs.l0, G / 2);
  rs.l1 += __shfl_xor_sync(0xffffffffu, rs.l1, G / 2);
  rs.o0 += __shfl_xor_sync(0xffffffffu, rs.o0, G / 2);
  rs.o1 += __shfl_xor_sync(0xffffffffu, rs.o1, G / 2);
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    rs.l0 += __shfl_xor_sync(0xffffffffu, rs.l0, o);
    rs.l1 += __shfl_xor_sync(0xffffffffu, rs.l1, o);
    rs.o0 += __shfl_xor_sync(0xffffffffu, rs.o0, o);
    rs.o1 += __shfl_xor_sync(0xffffffffu, rs.o1, o);
  }
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[i][r] += __shfl_xor_sync(0xffffffffu, acc[i][r], G / 2);
  }
}

// The warps' states combined in warp order through shared memory at `free`
// (the stages, no longer needed) into the split's partial state of the KV
// head's G query heads. Every thread of the block calls it.
template <int D, int G, int MT>
__device__ __forceinline__ void CombineWarps(const KernelArgs& args, int item, int split, int kvh, int tid, int warp,
                                             const LaneRoles<G>& lr, const RunState& rs, const float (&acc)[MT][4],
                                             uint8_t* free) {
  __syncthreads();
  float* cacc = reinterpret_cast<float*>(free);  // [warp][G][D]
  float* cml = cacc + kWarps * G * D;            // [warp][G][3]: m, l, o
  if (lr.owner) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int c0 = 16 * i + lr.g, c1 = c0 + 8;
      float* a0 = cacc + (warp * G + lr.hp) * D;
      float* a1 = a0 + D;
      a0[c0] = acc[i][0];
      a1[c0] = acc[i][1];
      a0[c1] = acc[i][2];
      a1[c1] = acc[i][3];
    }
    if (lr.g == 0) {
      float* ml = cml + (warp * G + lr.hp) * 3;
      ml[0] = rs.m0;
      ml[1] = rs.l0;
      ml[2] = rs.o0;
      ml[3] = rs.m1;
      ml[4] = rs.l1;
      ml[5] = rs.o1;
    }
  }
  __syncthreads();
  // Per head, once: the warps' factors 2^(m_w - m) (0 for an empty warp),
  // then m, l and o, into cf[head][kWarps + 3].
  constexpr int kF = kWarps + 3;
  float* cf = cml + kWarps * G * 3;
  if (tid < G) {
    const int hl = tid;
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, cml[(w * G + hl) * 3]);
    float l = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = cml[(w * G + hl) * 3];
      const float f = mw == kNegInf ? 0.0f : Ex2(mw - m);
      cf[hl * kF + w] = f;
      l += f * cml[(w * G + hl) * 3 + 1];
      o += f * cml[(w * G + hl) * 3 + 2];
    }
    cf[hl * kF + kWarps] = m;
    cf[hl * kF + kWarps + 1] = l;
    cf[hl * kF + kWarps + 2] = o;
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    const int hl = i / D, d = i % D;
    const float* f = cf + hl * kF;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) a += f[w] * cacc[(w * G + hl) * D + d];
    const int qh = kvh * G + hl;
    args.ws.acc[args.part.acc_index(item, split, qh) + d] = a + f[kWarps + 2];
    if (d == 0) {
      const size_t mi = args.part.ml_index(item, split, qh);
      args.ws.m[mi] = f[kWarps] * kLn2;  // the merges' natural-log units
      args.ws.l[mi] = f[kWarps + 1];
    }
  }
}

// Bytes before the stages: the barriers, the rotated query, its sums and
// largest magnitudes, and its hi | lo words.
template <int D, int G>
__host__ __device__ constexpr size_t QueryBytes() {
  return 128 + (G * D + 8) * 4 + G * D * 4;
}

// Where the warps' stages start: after the barriers and the query. (The
// merge in the launch reuses them as scratch.)
// The offset is applied to `smem` itself (not through an integer address),
// so the compiler still knows the stages are shared memory: 32-bit LDS with
// immediate offsets instead of generic 64-bit loads.
template <int D, int G>
__device__ __forceinline__ float* StagesOf(uint8_t* smem) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t after = base + static_cast<uint32_t>(QueryBytes<D, G>());
  return reinterpret_cast<float*>(smem + (((after + 127u) & ~127u) - base));
}

// The pages of split blockIdx.x of (item blockIdx.z, KV head blockIdx.y), into the split's
// partial state.
template <int D, int G, int kStages>
__device__ __forceinline__ void PageSplit(const KernelArgs& args, uint8_t* smem) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int split = blockIdx.x, kvh = blockIdx.y, item = blockIdx.z;
  uint8_t* stages = reinterpret_cast<uint8_t*>(StagesOf<D, G>(smem));
  constexpr int MT = D / 16;  // value m-tiles (16 channels each)
  constexpr int KS = D / 16;  // key k-steps
  const LevelAttentionParams& p = args.p;
  const AttentionBatch& batch = p.batch;
  const LevelPageLayout& lay = p.layout;
  const size_t head_bytes = lay.key_block_bytes + lay.value_block_bytes;
  const size_t stage_bytes = StageBytes(D, head_bytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem);     // [warp][stage]
  float* qs = reinterpret_cast<float*>(smem + 128);       // [G][D] rotated query
  float* qsum = qs + G * D;                               // [G]
  float* qmax = qsum + 4;                                 // [G]
  uint32_t* qhl = reinterpret_cast<uint32_t*>(qsum + 8);  // [G][D] hi | lo << 16
  const int tokens = batch.tokens_dev[item];
  const int pages = (tokens + kLevelPageTokens - 1) / kLevelPageTokens;
  const int pps = LevelPagesPerSplit(pages);
  const int first = split * pps;
  const int last = min(pages, first + pps);

  if (first >= last) {
    if (warp < G) WriteEmptyState<D, G>(args, item, split, kvh, warp, lane);
    return;
  }

  // This warp's pages: first + warp + kWarps * k.
  const int my_pages = first + warp < last ? (last - first - warp + kWarps - 1) / kWarps : 0;
  const int32_t* pt = batch.page_table_dev + batch.page_start_dev[item];
  uint64_t* my_bars = bars + warp * kStages;
  uint8_t* my_stages = stages + static_cast<size_t>(warp) * kStages * stage_bytes;
  auto issue = [&](int k) {
    const int page = first + warp + kWarps * k;
    IssuePage<D>(p.pool_dev + static_cast<size_t>(pt[page]) * lay.page_bytes, kvh, head_bytes, lay.blocks_offset,
                 my_stages + static_cast<size_t>(k % kStages) * stage_bytes, my_bars + k % kStages);
  };
  DecodeConsts* dc_smem = reinterpret_cast<DecodeConsts*>(smem + 96);  // after the barriers
  if (tid == 0) *dc_smem = MakeDecodeConsts();
  if (lane == 0) {
    for (int s = 0; s < kStages; ++s) MbarInit(my_bars + s);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int k = 0; k < min(kStages, my_pages); ++k) issue(k);
  }

  static_assert(G <= kWarps, "a warp per query head (PrepareQuery)");
  const int qe = PrepareQuery<D, G>(batch.query_dev + (static_cast<size_t>(item) * batch.q_heads + kvh * G) * D, qs,
                                    qsum, qmax, qhl, warp, lane);
  const LaneRoles<G> lr = MakeLaneRoles<G>(lane);
  const DecodeConsts dc = *dc_smem;  // written before PrepareQuery's barrier
  uint32_t qf[KS][2];
  QueryFragments<D, G>(qhl, lr, qf);
  // Scores in log2 units: the softmax scale times log2 e. The keys' dot
  // products come times 2^(qe - 18) (QueryFragments); kunit undoes it.
  const float unit = batch.softmax_scale * kLog2e;
  const float kunit = unit * Pow2(18 - qe);
  const float a0 = unit * qsum[lr.hp], a1 = unit * qsum[lr.hp + 1];

  RunState rs;
  float acc[MT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;

  for (int k = 0; k < my_pages; ++k) {
    MbarWait(my_bars + k % kStages, (k / kStages) & 1);
    const uint8_t* st = my_stages + static_cast<size_t>(k % kStages) * stage_bytes;
    const int page = first + warp + kWarps * k;
    const int valid = min(kLevelPageTokens, tokens - page * kLevelPageTokens);

    float qmu0 = 0.0f, qmu1 = 0.0f;
    MeanDots<D, G>(st, qs, lane, unit, qmu0, qmu1);
    float dacc[8][4];
    KeyDots<D>(reinterpret_cast<const uint4*>(st + kHdrBytes + D), lane, qf, dacc);
    float sc[8][2];
    float mx0, mx1;
    PageScores<G>(st, dacc, lr, valid, kunit, a0, a1, qmu0, qmu1, sc, mx0, mx1);
    float mn0, mn1;
    Rescale<MT>(mx0, mx1, rs, acc, mn0, mn1);
    uint32_t pb[8][2];
    PageWeights<G>(st, reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(st) + kHdrBytes + D), sc, lr, mn0, mn1, rs, pb);

    // ---- 3. values ----
    {
      const uint4* vb = reinterpret_cast<const uint4*>(st + kHdrBytes + D + lay.key_block_bytes);
      ValueGroup<D, 0>(vb, lane, dc, pb, acc);
      ValueGroup<D, 1>(vb, lane, dc, pb, acc);
      ValueGroup<D, 2>(vb, lane, dc, pb, acc);
    }
    __syncwarp();
    if (lane == 0 && k + kStages < my_pages) {
      FenceProxyAsync();
      issue(k + kStages);
    }
  }

  ReduceLanes<G, MT>(rs, acc);
  CombineWarps<D, G, MT>(args, item, split, kvh, tid, warp, lr, rs, acc, stages);
}

// One block per (split, KV head, item); warp w takes pages first + w,
// first + w + kWarps, ... of the split. With the merge in the launch, the
// last split index is the window's block, and the last block of an (item,
// KV head) to finish merges.
template <int D, int G, int kStages, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) LevelAttentionKernel(KernelArgs args) {
  static_assert(G == 2 || G == 4, "GQA group");
  static_assert(kThreads == kWindowMergeThreads, "the merge in the launch runs on the kernel's block");
  extern __shared__ __align__(128) uint8_t smem[];
  // Every block has started once all have passed here: the window and
  // merge kernel (a dependent launch) may take the SMs the last wave frees.
  LaunchDependents();
  // (Indices are read again after the split's work rather than kept live
  // through it: its registers are all taken.)
  if (args.in_launch && blockIdx.x == args.part.splits - 1) {
    WindowState<D, G>(args.merge, args.ws, blockIdx.z, blockIdx.y, StagesOf<D, G>(smem));
  } else {
    PageSplit<D, G, kStages>(args, smem);
  }
  if (args.in_launch && ArriveLast(args.p.merge_counters_dev + blockIdx.z * gridDim.y + blockIdx.y, gridDim.x)) {
    MergeTail<D, G>(args.merge, blockIdx.z, blockIdx.y, StagesOf<D, G>(smem));
  }
}

// The window and the merge as a second launch: one block per (KV head,
// item), the same device code as in the attention kernel's launch.
template <int D, int G>
__global__ void __launch_bounds__(kThreads) LevelWindowMergeKernel(KernelArgs args) {
  extern __shared__ __align__(16) float scratch[];
  // The window needs nothing of the split kernel (its slot of the
  // workspace is this block's alone): computed while that kernel ends.
  WindowState<D, G>(args.merge, args.ws, blockIdx.y, blockIdx.x, scratch);
  WaitPrerequisites();  // the splits' states
  __syncthreads();      // the window's state, written to global memory, for every thread of the block
  MergeTail<D, G>(args.merge, blockIdx.y, blockIdx.x, scratch);
}

}  // namespace

size_t LevelAttentionWorkspaceBytes(int items, int q_heads, int head_dim, int max_pages) {
  return AttentionWorkspaceBytes(items, q_heads, head_dim, max_pages);
}

absl::Status LaunchLevelAttention(const LevelAttentionParams& p, cudaStream_t stream) {
  const AttentionBatch& b = p.batch;
  const LevelPageLayout& l = p.layout;
  if (b.items < 1) return absl::InvalidArgumentError(absl::StrCat("items ", b.items, " < 1"));
  if (l.kv_heads < 1 || b.q_heads % l.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", b.q_heads, " not a multiple of kv_heads ", l.kv_heads));
  }
  if (l.page_bytes % 16 != 0 || l.blocks_offset % 16 != 0 || l.head_bytes() % 16 != 0) {
    return absl::InvalidArgumentError("level page layout not aligned (use MakeLevelPageLayout)");
  }
  if (b.max_pages < 0) return absl::InvalidArgumentError(absl::StrCat("max_pages ", b.max_pages, " < 0"));
  const int page_splits = SplitsCovering(b.max_pages, [](int pages) { return LevelPagesPerSplit(pages); });
  KernelArgs args;
  args.p = p;
  // A per-head output transform needs the merge kernel of the cold pages.
  const bool window_split = b.transforms_dev == nullptr || b.values_folded;
  constexpr int kBlocksPerSm = 4;  // the launch bounds below
  const bool one_wave = static_cast<int64_t>(b.items) * l.kv_heads * page_splits <= kBlocksPerSm * SmCount();
  args.in_launch = window_split && p.merge_counters_dev != nullptr &&
                   (p.merge == LevelMerge::kInLaunch || (p.merge == LevelMerge::kAuto && one_wave));
  args.part = PartialLayout{b.items, page_splits + (window_split ? 1 : 0), b.q_heads, l.head_dim};
  args.ws = CarveWorkspace(b.workspace_dev, args.part);
  args.merge = PageMergeParams(args.part, args.ws, b, l.kv_heads);  // the window's query: b's, the model domain
  absl::StatusOr<const float*> q =
      PageQueries(b, l.kv_heads, l.head_dim, args.ws.acc + args.part.count() * l.head_dim, stream);
  if (!q.ok()) return q.status();
  args.p.batch.query_dev = *q;
  const dim3 grid(args.in_launch ? args.part.splits : page_splits, l.kv_heads, b.items);
  // One stage a warp and four blocks (16 warps) an SM: on the H200 10-20%
  // faster at batch >= 32 than two stages and two blocks (8 warps), where
  // too few warps hid the latency of the decode and the mma chains.
  constexpr int kStages = 1;
  const size_t head_bytes = l.head_bytes();
  return DispatchHeadDimGroup(l.head_dim, b.q_heads / l.kv_heads, "level-page", [&](auto d, auto g) {
    constexpr int D = decltype(d)::value, G = decltype(g)::value;
    const size_t front = QueryBytes<D, G>() + 128;  // barriers, query, alignment of the stages
    const size_t scratch = sizeof(float) * WindowMergeScratchFloats<D, G>();
    const size_t smem = front + std::max(static_cast<size_t>(kWarps) * kStages * StageBytes(D, head_bytes), scratch);
    if (smem > 227 * 1024) {
      return absl::InvalidArgumentError(absl::StrCat("level page too large: ", smem, " B of shared memory"));
    }
    absl::Status ls = LaunchKernel(LevelAttentionKernel<D, G, kStages, kBlocksPerSm>, grid, kThreads, smem, stream,
                                   "level attention", args);
    if (!ls.ok()) return ls;
    if (p.split_done != nullptr) cudaEventRecord(p.split_done, stream);
    if (args.in_launch) return ls;
    if (!window_split) return LaunchMerge(args.merge, stream);
    // A dependent launch unless a probe's event sits between the two.
    auto launch = p.split_done != nullptr ? LaunchKernel<KernelArgs> : LaunchDependentKernel<KernelArgs>;
    return launch(LevelWindowMergeKernel<D, G>, dim3(l.kv_heads, b.items), kThreads, scratch, stream,
                  "level window and merge", args);
  });
}

}  // namespace gpu
}  // namespace driftkv
