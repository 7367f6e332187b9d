// Fused D-Quant decode attention on the compressed pool (paper eq. 8-9,
// Sec. 4.5). One block of 256 threads walks chunks of 4 pages (512 tokens)
// of one item; blocks of one item split its chunks (split-KV) and the merge
// kernel combines their (max, sum, acc) states.
//
// Per chunk, token-centric: thread i owns tokens A = (page i/128, slot i%128)
// and B = (page 2 + i/128, same slot), so a warp owns 64 tokens; each stream
// is decoded exactly once and serves every query head.
//  1. Keys. The two rANS chains of a thread run interleaved (ILP). Decoded
//     levels go, as fp16 pairs, into a per-warp tile [64 tokens][32 channels];
//     tensor cores contract it with the rotated query, times a power of two
//     that keeps it in fp16's range, split into fp16 hi + lo halves
//     (columns 0..G-1 hi, G..2G-1 lo of the G heads of the KV head), an
//     fp32-exact product since levels are small integers. Score =
//     scale * (s_t * dot + o_t * sum q' + q' . mu) (eq. 8).
//  2. Softmax over the chunk per head, online against the block's running
//     max; the weights are pre-multiplied by each token's value scale s_t.
//  3. Values. Levels of the thread's two tokens at one channel form one fp16
//     pair, the K dimension of an MMA whose other operand is the weights
//     (hi/lo again); the channel-partitioned accumulator lives in shared
//     memory. The offsets enter as sum_t a_t o_t (eq. 9).
// Payload bytes come from global memory in 16-byte blocks into a per-token
// ring of 4 blocks in shared memory ([word][token], conflict-free), one block
// pair prefetched in registers; a group of 4 symbols reads a 4-byte window
// (at most one byte per symbol is consumed, rans.h) and renormalizes with a
// predicated byte permute: no loops, no branches per symbol.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/format_constants.h"
#include "kernels/attention.h"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunkPages = 4;
constexpr int kChunkTokens = kChunkPages * kPageTokens;  // 512, 2 per thread
constexpr int kWarpTokens = 64;
constexpr int kSlab = 32;          // channels decoded between two MMA rounds
constexpr int kKeyRowWords = 20;   // 16 words of fp16 pairs + 4 pad: ldmatrix conflict-free
constexpr int kValRowWords = 36;   // 32 words (64 tokens) + 4 pad
constexpr int kStageWords = 1280;  // max(64 * 20, 32 * 36)
constexpr int kRingBlocks = 4;     // 16-byte blocks per token in the ring
constexpr int kRingWords = 4 * kRingBlocks;
constexpr int kMaxQHeads = 32;
constexpr int kMaxN = 1024;
constexpr uint32_t kSelBase = 0x2104;  // byte_perm selector: (x << 8) | win.byte[k]

// Shared memory, in 32-bit words.
// Decode table: entry z of lane l at word z * 64 + l (256-byte rows), so the
// byte address z << 8 | l << 2 is one byte permute of the state. Words 32..63
// of each row (the gaps) hold the accumulator (rows 0..127) and the query
// fragments (rows 128..255), see Gap().
constexpr int kTableRowWords = 64;
constexpr int kTableWords = 256 * kTableRowWords;
constexpr int kOffTable = 0;
constexpr int kGapAcc = 0;           // gap index of the accumulator (4096 words)
constexpr int kGapQFrag = 128 * 32;  // gap index of the query fragments (4096 words)
constexpr int kOffStage = kOffTable + kTableWords;
constexpr int kOffRing = kOffStage + kWarps * kStageWords;
constexpr int kOffScore = kOffRing + kWarps * kRingWords * kWarpTokens;
constexpr int kOffTok = kOffScore + kMaxQHeads * kChunkTokens;  // ks, ko, vs, vo
constexpr int kOffQSum = kOffTok + 4 * kChunkTokens;
constexpr int kOffQMu = kOffQSum + kMaxQHeads;
constexpr int kOffRun = kOffQMu + kChunkPages * kMaxQHeads;  // m, l, off
constexpr int kOffValid = kOffRun + 3 * kMaxQHeads;
constexpr int kOffRed = kOffValid + kChunkTokens / 4;  // [warp][2 m-tiles][32 lanes][2] value partials
constexpr int kSmemWords = kOffRed + kWarps * 128;
constexpr size_t kSmemBytes = static_cast<size_t>(kSmemWords) * 4;
static_assert(kSmemBytes <= 227 * 1024, "shared memory budget of one H100/H200 block");
static_assert(kMaxQHeads * 128 <= 128 * 32 && (kMaxN / 16) * 32 * 2 <= 128 * 32, "gaps of the table");

// Word of gap index i (i < 8192): row i / 32, word 32 + i % 32. Pairs (2k, 2k + 1)
// stay adjacent, so 8-byte accesses keep working.
__device__ __forceinline__ int Gap(int i) {
  return ((i >> 5) << 6) + 32 + (i & 31);
}

// A float or word array stored in the table's gaps.
template <typename T>
struct GapArray {
  T* base;  // the table
  int first;
  __device__ __forceinline__ T& operator[](int i) const { return base[Gap(first + i)]; }
  __device__ __forceinline__ T* ptr(int i) const { return base + Gap(first + i); }
};

struct Tok {
  const uint8_t* page;  // 16-byte aligned page base
  uint32_t x;           // rANS state
  uint32_t p;           // next payload byte, relative to page
  uint32_t lb;          // next 16-byte block not yet in the ring
  uint4 pf0, pf1;       // blocks lb and lb + 1, prefetched
};

__device__ __forceinline__ uint4 LoadBlock(const uint8_t* page, uint32_t b) {
  return __ldg(reinterpret_cast<const uint4*>(page) + b);
}

// Ring layout: word w of the token in slot s at byte ((w & 15) * 64 + s) * 4
// of the warp's ring, i.e. offset ((p << 6) & 0xf00) | (s << 2) for byte p:
// the 16 words of a token sit in one bank (its lane), conflict-free.
__device__ __forceinline__ void RingStore(uint32_t* ring, int slot, uint32_t b, uint4 v) {
  uint32_t* r = ring + (4 * (b & 3)) * kWarpTokens + slot;
  r[0] = v.x;
  r[kWarpTokens] = v.y;
  r[2 * kWarpTokens] = v.z;
  r[3 * kWarpTokens] = v.w;
}

__device__ __forceinline__ uint32_t RingWord(const uint32_t* ring, int slot, uint32_t w) {
  return ring[(w & (kRingWords - 1)) * kWarpTokens + slot];
}

__device__ __forceinline__ uint32_t RingAt(const uint32_t* ring, uint32_t byte_offset) {
  return *reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(ring) + byte_offset);
}

// Starts a record at page offset `rec` (4-byte aligned): fills the ring,
// primes the prefetch, returns the header word (fp16 scale | fp16 offset << 16).
__device__ __forceinline__ uint32_t TokStart(Tok& t, uint32_t* ring, int slot, uint32_t rec) {
  t.lb = rec >> 4;
#pragma unroll
  for (int k = 0; k < kRingBlocks; ++k) RingStore(ring, slot, t.lb + k, LoadBlock(t.page, t.lb + k));
  t.lb += kRingBlocks;
  t.pf0 = LoadBlock(t.page, t.lb);
  t.pf1 = LoadBlock(t.page, t.lb + 1);
  const uint32_t header = RingWord(ring, slot, rec >> 2);
  t.x = RingWord(ring, slot, (rec >> 2) + 1);
  t.p = rec + 8;
  return header;
}

// Makes the ring hold bytes [p, p + 36), all a slab of 32 symbols can read.
// After the first slab at most two new blocks are needed per slab.
__device__ __forceinline__ void TokRefill(Tok& t, uint32_t* ring, int slot) {
  const uint32_t eb = ((t.p + 35) >> 4) + 1;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (t.lb < eb) {
      RingStore(ring, slot, t.lb, t.pf0);
      ++t.lb;
      t.pf0 = t.pf1;
      t.pf1 = LoadBlock(t.page, t.lb + 1);
    }
  }
}

// The 4-byte window at p: two ring words and a funnel shift by 8 * (p & 3).
__device__ __forceinline__ uint32_t TokWindow(const Tok& t, const uint32_t* ring, uint32_t slot4) {
  const uint32_t a = t.p << 6;
  const uint32_t w0 = RingAt(ring, (a & 0xf00u) | slot4);
  const uint32_t w1 = RingAt(ring, ((a + 0x100u) & 0xf00u) | slot4);
  return __funnelshift_r(w0, w1, t.p << 3);
}

// One rANS decode step (rans.h) on the lane's copy of the table (byte offset
// z * 256 + lane * 4): returns the entry (level as fp16 in [31:16]).
//   x' = f * (x >> 8) + bias;  if x' < 2^23: x' = (x' << 8) | win.byte[sel - kSelBase]
// The renormalization is predicated (setp + two @p instructions), never a
// branch, and consumes at most one byte (rans.h).
static_assert(kStateLow == 0x800000u, "Step's inline PTX compares the state with the literal 0x800000 = kStateLow");
static_assert(kProbBits == 8, "Step indexes the table by x & 255 and renormalises by one byte");
__device__ __forceinline__ uint32_t Step(uint32_t& x, uint32_t win, uint32_t& sel, const uint32_t* table,
                                         uint32_t lane4) {
  const uint32_t off = __byte_perm(x, lane4, 0x5504);  // (x & 255) << 8 | lane4
  const uint32_t e = *reinterpret_cast<const uint32_t*>(reinterpret_cast<const char*>(table) + off);
  x = (e & 255u) * (x >> 8) + __byte_perm(e, 0u, 0x4441);
  asm("{\n\t.reg .pred p;\n\tsetp.lt.u32 p, %0, 0x800000;\n\t@p prmt.b32 %0, %0, %2, %1;\n\t"
      "@p add.u32 %1, %1, 1;\n\t}"
      : "+r"(x), "+r"(sel)
      : "r"(win));
  return e;
}

// Decodes 4 symbols of each of A and B.
__device__ __forceinline__ void Decode4(Tok& a, Tok& b, const uint32_t* ring, uint32_t slot4_a, uint32_t slot4_b,
                                        const uint32_t* table, uint32_t lane4, uint32_t ea[4], uint32_t eb[4]) {
  const uint32_t wa = TokWindow(a, ring, slot4_a), wb = TokWindow(b, ring, slot4_b);
  uint32_t sa = kSelBase, sb = kSelBase;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    ea[k] = Step(a.x, wa, sa, table, lane4);
    eb[k] = Step(b.x, wb, sb, table, lane4);
  }
  a.p += sa - kSelBase;
  b.p += sb - kSelBase;
}

__device__ __forceinline__ uint32_t PackLevels(uint32_t lo_entry, uint32_t hi_entry) {
  return __byte_perm(lo_entry, hi_entry, 0x7632);
}

// q' (hi + lo) of head h, channel c of its KV head, read back from the
// fragment array (used for q' . mu once per page).
template <int D, int G>
__device__ __forceinline__ float QValue(const GapArray<uint32_t>& qfrag, int h, int c) {
  const int gch = (h / G) * D + c, ks = gch >> 4, r = gch & 15;
  const int t = (r & 7) >> 1, reg = r >> 3, half = r & 1, n = h % G;
  const uint32_t whi = qfrag[(ks * 32 + n * 4 + t) * 2 + reg];
  const uint32_t wlo = qfrag[(ks * 32 + (n + G) * 4 + t) * 2 + reg];
  const uint16_t hi = static_cast<uint16_t>(half ? whi >> 16 : whi & 0xffff);
  const uint16_t lo = static_cast<uint16_t>(half ? wlo >> 16 : wlo & 0xffff);
  return HalfBitsToFloat(hi) + HalfBitsToFloat(lo);
}

// Chunks (of 4 pages) per split of an item with `chunks` chunks: one chunk a
// split up to 128 chunks (64K tokens), then at most 128 splits, so that one
// long sequence still fills the GPU; a function of the item alone.
__host__ __device__ inline int DQuantChunksPerSplit(int chunks) {
  return chunks <= 128 ? 1 : (chunks + 127) / 128;
}

struct KernelArgs {
  DQuantAttentionParams p;
  PartialLayout part;
  Workspace ws;
  int chunks_per_split;
};

// The block's views of shared memory (offsets above).
struct Shared {
  uint32_t* table;
  float* score;
  GapArray<float> acc;
  GapArray<uint32_t> qfrag;
  float *ks, *ko, *vs, *vo;  // [kChunkTokens] key and value scale and offset of each token
  float* qsum;
  float* qmu;                 // [kChunkPages][kMaxQHeads]
  float *mrun, *lrun, *orun;  // [kMaxQHeads] running max, denominator, sum of w_t o_t
  uint8_t* valid;
  float* red;
};

__device__ __forceinline__ Shared CarveShared(uint32_t* smem) {
  Shared s{smem + kOffTable, reinterpret_cast<float*>(smem + kOffScore),
           GapArray<float>{reinterpret_cast<float*>(smem + kOffTable), kGapAcc},
           GapArray<uint32_t>{smem + kOffTable, kGapQFrag}};
  s.ks = reinterpret_cast<float*>(smem + kOffTok);
  s.ko = s.ks + kChunkTokens;
  s.vs = s.ko + kChunkTokens;
  s.vo = s.vs + kChunkTokens;
  s.qsum = reinterpret_cast<float*>(smem + kOffQSum);
  s.qmu = reinterpret_cast<float*>(smem + kOffQMu);
  s.mrun = reinterpret_cast<float*>(smem + kOffRun);
  s.lrun = s.mrun + kMaxQHeads;
  s.orun = s.lrun + kMaxQHeads;
  s.valid = reinterpret_cast<uint8_t*>(smem + kOffValid);
  s.red = reinterpret_cast<float*>(smem + kOffRed);
  return s;
}

// Prologue: the item's query rotated (in the score area), its fp16 hi/lo
// fragments of q' * 2^e (QueryExponent of the largest |q'| of all its
// heads), the sums sum_d q'[d], the empty running state and a zero
// accumulator. Returns 2^-e, the factor that takes the fragments' products
// back to q'. Ends with a block barrier.
template <int D, int G>
__device__ __forceinline__ float PrepareQuery(const float* q, int q_heads, int n, int tid, int warp, int lane,
                                              const Shared& s) {
  for (int i = tid; i < q_heads * D; i += kThreads) s.score[i] = q[i];
  HadamardRows(s.score, q_heads, D, tid, kThreads, BlockSync());
  float m = 0.0f;
  for (int i = tid; i < q_heads * D; i += kThreads) m = fmaxf(m, fabsf(s.score[i]));
  m = WarpMax(m);
  if (lane == 0) s.red[warp] = m;
  __syncthreads();
  m = s.red[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, s.red[w]);
  const int e = QueryExponent(m);
  const float up = Pow2(e);
  for (int i = tid; i < (n / 16) * 32; i += kThreads) {
    const int kstep = i >> 5, l = i & 31, col = l >> 2, t = l & 3;
    uint32_t w[2];
#pragma unroll
    for (int reg = 0; reg < 2; ++reg) {
      uint16_t half[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int ch = kstep * 16 + 2 * t + 8 * reg + e;
        const int g = ch / D;
        uint16_t hi = 0, lo = 0;
        if (col < 2 * G) {
          SplitHalf(s.score[(g * G + (col % G)) * D + ch % D] * up, &hi, &lo);
        }
        half[e] = col < G ? hi : (col < 2 * G ? lo : 0);
      }
      w[reg] = half[0] | (static_cast<uint32_t>(half[1]) << 16);
    }
    s.qfrag[i * 2] = w[0];
    s.qfrag[i * 2 + 1] = w[1];
  }
  if (warp < kWarps) {
    for (int h = warp; h < q_heads; h += kWarps) {
      float sum = 0.0f;
      for (int d = lane; d < D; d += 32) sum += s.score[h * D + d];
      sum = WarpSum(sum);
      if (lane == 0) {
        s.qsum[h] = sum;
        s.mrun[h] = kNegInf;
        s.lrun[h] = 0.0f;
        s.orun[h] = 0.0f;
      }
    }
  }
  for (int i = tid; i < q_heads * D; i += kThreads) s.acc[i] = 0.0f;
  __syncthreads();
  return Pow2(-e);
}

// This thread's two tokens of a chunk: A = (page tid / 128, slot tid % 128)
// and B = (page 2 + tid / 128, same slot). An absent token (past the item's
// end) decodes a present record (slot 0 of a present page) and is masked.
struct ChunkTokens {
  Tok a, b;
  uint32_t ia, ib;  // record slots in their pages
  bool va, vb;      // present
};

__device__ __forceinline__ ChunkTokens StartChunk(const DQuantAttentionParams& p, const int32_t* pt, int first_page,
                                                  int pages, int tokens, int tid) {
  const int idx = tid & (kPageTokens - 1);
  auto page_ptr = [&](int k) -> const uint8_t* {
    const int k_ok = first_page + k < pages ? k : 0;
    return p.pool_dev + static_cast<size_t>(pt[k_ok]) * p.layout.page_bytes;
  };
  auto token_valid = [&](int k) { return first_page + k < pages && (first_page + k) * kPageTokens + idx < tokens; };
  const int kA = tid >> 7, kB = 2 + (tid >> 7);
  ChunkTokens c;
  c.va = token_valid(kA);
  c.vb = token_valid(kB);
  c.a.page = page_ptr(c.va ? kA : 0);
  c.b.page = page_ptr(c.vb ? kB : 0);
  c.ia = c.va ? idx : 0;
  c.ib = c.vb ? idx : 0;
  return c;
}

// The decode table `word` (this thread's entry z = tid), replicated into the
// 32 banks: words z * 64 + lane, lane < 32.
__device__ __forceinline__ void FillTable(uint32_t* table, uint32_t word, int tid) {
  const uint4 e = make_uint4(word, word, word, word);
  for (int k = 0; k < 8; ++k) reinterpret_cast<uint4*>(table)[tid * (kTableRowWords / 4) + k] = e;
}

// q' . mu for each (page of the chunk, head), scaled by the page's mean
// scale; `down` takes the query fragments' values back to q'.
template <int D, int G>
__device__ __forceinline__ void MeanDots(const DQuantAttentionParams& p, const int32_t* pt, int first_page, int pages,
                                         int q_heads, int warp, int lane, float down, const Shared& s) {
  for (int j = warp; j < kChunkPages * q_heads; j += kWarps) {
    const int k = j / q_heads, h = j % q_heads;
    float sum = 0.0f;
    if (first_page + k < pages) {
      const uint8_t* mean = p.pool_dev + static_cast<size_t>(pt[k]) * p.layout.page_bytes + p.layout.mean_offset;
      const float mscale = __ldg(reinterpret_cast<const float*>(mean));
      const int8_t* q8 = reinterpret_cast<const int8_t*>(mean + 4) + (h / G) * D;
      for (int d = lane; d < D; d += 32) sum += QValue<D, G>(s.qfrag, h, d) * static_cast<float>(q8[d]);
      sum = WarpSum(sum) * down * mscale;
    }
    if (lane == 0) s.qmu[k * kMaxQHeads + h] = sum;
  }
}

// Value headers (scale, offset) and presence of both tokens.
__device__ __forceinline__ void LoadValueHeaders(const PageLayout& lay, const ChunkTokens& c, int ta, int tb,
                                                 const Shared& s) {
  const uint32_t ha = __ldg(reinterpret_cast<const uint32_t*>(c.a.page + lay.value_offset + c.ia * lay.value_stride));
  const uint32_t hb = __ldg(reinterpret_cast<const uint32_t*>(c.b.page + lay.value_offset + c.ib * lay.value_stride));
  s.vs[ta] = HalfBitsToFloat(ha & 0xffff);
  s.vo[ta] = HalfBitsToFloat(ha >> 16);
  s.vs[tb] = HalfBitsToFloat(hb & 0xffff);
  s.vo[tb] = HalfBitsToFloat(hb >> 16);
  s.valid[ta] = c.va;
  s.valid[tb] = c.vb;
}

// ---- 1. keys: decode both tokens' key records slab by slab into the
// warp's stage, contract with the query fragments on tensor cores, and
// write scale * (s_t * dot + o_t * sum q' + q' . mu) (or -inf for absent
// tokens) to score[head][token] ----
template <int D, int G>
__device__ __forceinline__ void KeyScores(const PageLayout& lay, ChunkTokens& c, int kv_heads, float scale, float down,
                                          int warp, int lane, int ta, int tb, uint32_t lane4, const Shared& s,
                                          uint32_t* stage, uint32_t* ring) {
  const int slot_a = lane, slot_b = 32 + lane;
  const uint32_t slot4_a = slot_a << 2, slot4_b = slot_b << 2;
  const uint32_t ha = TokStart(c.a, ring, slot_a, c.ia * lay.key_stride);
  const uint32_t hb = TokStart(c.b, ring, slot_b, c.ib * lay.key_stride);
  s.ks[ta] = HalfBitsToFloat(ha & 0xffff);
  s.ko[ta] = HalfBitsToFloat(ha >> 16);
  s.ks[tb] = HalfBitsToFloat(hb & 0xffff);
  s.ko[tb] = HalfBitsToFloat(hb >> 16);
  for (int g = 0; g < kv_heads; ++g) {
    float dacc[4][4] = {};
    for (int slab = 0; slab < D / kSlab; ++slab) {
      TokRefill(c.a, ring, slot_a);
      TokRefill(c.b, ring, slot_b);
#pragma unroll
      for (int q8 = 0; q8 < kSlab / 8; ++q8) {
        uint32_t e0[4], e1[4], f0[4], f1[4];
        Decode4(c.a, c.b, ring, slot4_a, slot4_b, s.table, lane4, e0, f0);
        Decode4(c.a, c.b, ring, slot4_a, slot4_b, s.table, lane4, e1, f1);
        const uint4 wa = make_uint4(PackLevels(e0[0], e0[1]), PackLevels(e0[2], e0[3]), PackLevels(e1[0], e1[1]),
                                    PackLevels(e1[2], e1[3]));
        const uint4 wb = make_uint4(PackLevels(f0[0], f0[1]), PackLevels(f0[2], f0[3]), PackLevels(f1[0], f1[1]),
                                    PackLevels(f1[2], f1[3]));
        *reinterpret_cast<uint4*>(stage + slot_a * kKeyRowWords + q8 * 4) = wa;
        *reinterpret_cast<uint4*>(stage + slot_b * kKeyRowWords + q8 * 4) = wb;
      }
      __syncwarp();
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        const int kstep = (g * D + slab * kSlab) / 16 + k2;
        const uint2 bq = *reinterpret_cast<const uint2*>(s.qfrag.ptr((kstep * 32 + lane) * 2));
#pragma unroll
        for (int mt = 0; mt < 4; ++mt) {
          uint32_t af[4];
          const int row = mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LdMatrixX4(af, stage + row * kKeyRowWords + k2 * 8 + (lane >> 4) * 4);
          Mma16816(dacc[mt], af, bq.x, bq.y);
        }
      }
      __syncwarp();
    }
    // Scores of the G heads of KV head g: column n + G (lo) is in lane ^ (G/2).
    const int t4 = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt) {
      float part[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) part[r] = __shfl_xor_sync(0xffffffffu, dacc[mt][r], G / 2);
      if (2 * t4 < G) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = mt * 16 + (lane >> 2) + (r >> 1) * 8;
          const int tok = row < 32 ? warp * 32 + row : kChunkTokens / 2 + warp * 32 + row - 32;
          const int h = g * G + 2 * t4 + (r & 1);
          const float dot = (dacc[mt][r] + part[r]) * down;
          s.score[h * kChunkTokens + tok] =
              s.valid[tok] ? scale * (s.ks[tok] * dot + s.ko[tok] * s.qsum[h] + s.qmu[(tok >> 7) * kMaxQHeads + h])
                           : kNegInf;
        }
      }
    }
  }
}

// ---- 2. softmax over the chunk, online against the running state of each
// head; the weights pre-multiplied by s_t are stored split into fp16
// hi | lo << 16 in place of the scores ----
template <int D>
__device__ __forceinline__ void ChunkSoftmax(int q_heads, int warp, int lane, const Shared& s) {
  for (int h = warp; h < q_heads; h += kWarps) {
    float* sc = s.score + h * kChunkTokens;
    float cmax = kNegInf;
    for (int t = lane; t < kChunkTokens; t += 32) cmax = fmaxf(cmax, sc[t]);
    cmax = WarpMax(cmax);
    const float m_old = s.mrun[h];
    const float m_new = fmaxf(m_old, cmax);
    float sum = 0.0f, osum = 0.0f;
    for (int t = lane; t < kChunkTokens; t += 32) {
      const float x = sc[t];
      const float w = x == kNegInf ? 0.0f : __expf(x - m_new);
      sum += w;
      osum += w * s.vo[t];
      uint16_t whi, wlo;
      SplitHalf(w * s.vs[t], &whi, &wlo);
      reinterpret_cast<uint32_t*>(sc)[t] = whi | (static_cast<uint32_t>(wlo) << 16);
    }
    sum = WarpSum(sum);
    osum = WarpSum(osum);
    const float f = m_old == kNegInf ? (m_new == kNegInf ? 1.0f : 0.0f) : __expf(m_old - m_new);
    for (int d = lane; d < D; d += 32) s.acc[h * D + d] *= f;
    if (lane == 0) {
      s.mrun[h] = m_new;
      s.lrun[h] = s.lrun[h] * f + sum;
      s.orun[h] = s.orun[h] * f + osum;
    }
  }
}

// ---- 3. values: decode both tokens' value records slab by slab, contract
// the levels with the weights on tensor cores and add the warps' sums to
// the accumulator in warp order (no float atomics: the order never
// changes) ----
template <int D, int G>
__device__ __forceinline__ void ValueAccumulate(const PageLayout& lay, ChunkTokens& c, int kv_heads, int tid, int warp,
                                                int lane, uint32_t lane4, const Shared& s, uint32_t* stage,
                                                uint32_t* ring) {
  const int slot_a = lane, slot_b = 32 + lane;
  const uint32_t slot4_a = slot_a << 2, slot4_b = slot_b << 2;
  TokStart(c.a, ring, slot_a, static_cast<uint32_t>(lay.value_offset) + c.ia * lay.value_stride);
  TokStart(c.b, ring, slot_b, static_cast<uint32_t>(lay.value_offset) + c.ib * lay.value_stride);
  const int t4 = lane & 3, col = lane >> 2;
  for (int g = 0; g < kv_heads; ++g) {
    // Weight fragments of the warp's 64 tokens (virtual k = 2 * lane + {A, B}).
    uint32_t wf[4][2];
#pragma unroll
    for (int k4 = 0; k4 < 4; ++k4) {
#pragma unroll
      for (int reg = 0; reg < 2; ++reg) {
        const int src = 8 * k4 + t4 + 4 * reg;
        const int tok_a = warp * 32 + src, tok_b = kChunkTokens / 2 + warp * 32 + src;
        uint32_t w = 0u;
        if (col < 2 * G) {
          const uint32_t* wsplit = reinterpret_cast<const uint32_t*>(s.score) + (g * G + col % G) * kChunkTokens;
          w = __byte_perm(wsplit[tok_a], wsplit[tok_b], col < G ? 0x5410 : 0x7632);
        }
        wf[k4][reg] = w;
      }
    }
    for (int slab = 0; slab < D / kSlab; ++slab) {
      TokRefill(c.a, ring, slot_a);
      TokRefill(c.b, ring, slot_b);
#pragma unroll
      for (int q4 = 0; q4 < kSlab / 4; ++q4) {
        uint32_t e[4], f[4];
        Decode4(c.a, c.b, ring, slot4_a, slot4_b, s.table, lane4, e, f);
#pragma unroll
        for (int k = 0; k < 4; ++k) stage[(q4 * 4 + k) * kValRowWords + lane] = PackLevels(e[k], f[k]);
      }
      __syncwarp();
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        float d[4] = {};
#pragma unroll
        for (int k4 = 0; k4 < 4; ++k4) {
          uint32_t af[4];
          const int row = mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
          LdMatrixX4(af, stage + row * kValRowWords + k4 * 8 + (lane >> 4) * 4);
          Mma16816(d, af, wf[k4][0], wf[k4][1]);
        }
        // hi (lane t4 < G/2) + lo (lane t4 ^ G/2) of heads 2 t4', 2 t4' + 1: the
        // low lane holds rows 0..7, its partner rows 8..15; each warp's
        // sums go to its slot of `red`, added below in warp order.
        const bool low = (t4 & (G / 2)) == 0;
        const float r0 = __shfl_xor_sync(0xffffffffu, low ? d[2] : d[0], G / 2);
        const float r1 = __shfl_xor_sync(0xffffffffu, low ? d[3] : d[1], G / 2);
        s.red[(warp * 2 + mt) * 64 + lane * 2] = (low ? d[0] : d[2]) + r0;
        s.red[(warp * 2 + mt) * 64 + lane * 2 + 1] = (low ? d[1] : d[3]) + r1;
      }
      // The warps' partial sums of this slab into the accumulator, in
      // warp order: no float atomics, so the sum order never changes.
      __syncthreads();
      if (tid < 128) {
        const int mt = tid >> 6, ln = (tid >> 1) & 31, j = tid & 1, tr = ln & 3;
        if (tr < G) {
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) sum += s.red[(w * 2 + mt) * 64 + ln * 2 + j];
          const int h = g * G + 2 * (tr & (G / 2 - 1)) + j;
          const int ch = slab * kSlab + mt * 16 + (ln >> 2) + ((tr & (G / 2)) == 0 ? 0 : 8);
          s.acc[h * D + ch] += sum;
        }
      }
      __syncthreads();
    }
  }
}

// The split's partial state (kernels/device_common.cuh): m, l and acc +
// (sum a_t o_t) on every channel, in the rotated domain.
template <int D>
__device__ __forceinline__ void WritePartialState(const KernelArgs& args, int item, int split, int q_heads, int warp,
                                                  int lane, const Shared& s) {
  for (int h = warp; h < q_heads; h += kWarps) {
    const size_t mi = args.part.ml_index(item, split, h);
    if (lane == 0) {
      args.ws.m[mi] = s.mrun[h];
      args.ws.l[mi] = s.lrun[h];
    }
    for (int d = lane; d < D; d += 32)
      args.ws.acc[args.part.acc_index(item, split, h) + d] = s.acc[h * D + d] + s.orun[h];
  }
}

// One block per (split, item): the chunks [c_begin, c_end) of the item, each
// decoded once for every query head.
template <int D, int G>
__global__ void __launch_bounds__(kThreads, 1) DQuantAttentionKernel(KernelArgs args) {
  const DQuantAttentionParams& p = args.p;
  const AttentionBatch& batch = p.batch;
  extern __shared__ uint32_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int item = blockIdx.y, split = blockIdx.x;
  const int q_heads = batch.q_heads, kv_heads = q_heads / G, n = kv_heads * D;
  const Shared s = CarveShared(smem);
  // This warp's stage and ring, kept out of Shared: as locals of the kernel
  // they stay 32-bit shared addresses in the decode loops (inside the struct
  // nvcc recomputed them in 64 bits at every ring access).
  uint32_t* stage = smem + kOffStage + warp * kStageWords;
  uint32_t* ring = smem + kOffRing + warp * kRingWords * kWarpTokens;
  const uint32_t lane4 = static_cast<uint32_t>(lane) << 2;

  const int tokens = batch.tokens_dev[item];
  const int pages = (tokens + kPageTokens - 1) / kPageTokens;
  const int chunks = (pages + kChunkPages - 1) / kChunkPages;
  // Chunks per split: the launcher's override, or a function of this item's
  // own length (batch invariance).
  const int cps = args.chunks_per_split > 0 ? args.chunks_per_split : DQuantChunksPerSplit(chunks);
  const int c_begin = split * cps;
  const int c_end = min(chunks, c_begin + cps);

  const float down =
      PrepareQuery<D, G>(batch.query_dev + static_cast<size_t>(item) * q_heads * D, q_heads, n, tid, warp, lane, s);

  const int ta = tid, tb = kChunkTokens / 2 + tid;  // block token indices
  const float scale = batch.softmax_scale;
  static_assert(kThreads == 256, "one table entry per thread");
  const uint32_t key_word = p.tables_dev[tid], value_word = p.tables_dev[256 + tid];

  for (int c = c_begin; c < c_end; ++c) {
    const int32_t* pt = batch.page_table_dev + batch.page_start_dev[item] + c * kChunkPages;
    const int first_page = c * kChunkPages;
    ChunkTokens ct = StartChunk(p, pt, first_page, pages, tokens, tid);
    FillTable(s.table, key_word, tid);
    MeanDots<D, G>(p, pt, first_page, pages, q_heads, warp, lane, down, s);
    LoadValueHeaders(p.layout, ct, ta, tb, s);
    __syncthreads();
    KeyScores<D, G>(p.layout, ct, kv_heads, scale, down, warp, lane, ta, tb, lane4, s, stage, ring);
    __syncthreads();
    ChunkSoftmax<D>(q_heads, warp, lane, s);
    FillTable(s.table, value_word, tid);
    __syncthreads();
    ValueAccumulate<D, G>(p.layout, ct, kv_heads, tid, warp, lane, lane4, s, stage, ring);
    __syncthreads();
  }
  WritePartialState<D>(args, item, split, q_heads, warp, lane, s);
}

}  // namespace

absl::Status LaunchDQuantAttention(const DQuantAttentionParams& p, cudaStream_t stream) {
  const AttentionBatch& b = p.batch;
  const PageLayout& l = p.layout;
  if (b.items < 1) return absl::InvalidArgumentError(absl::StrCat("items ", b.items, " < 1"));
  if (l.kv_heads < 1 || b.q_heads % l.kv_heads != 0 || b.q_heads > kMaxQHeads) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_heads ", b.q_heads, " / kv_heads ", l.kv_heads, ": need a multiple, at most ", kMaxQHeads));
  }
  if (l.n() > kMaxN) return absl::InvalidArgumentError(absl::StrCat("kv_heads * head_dim = ", l.n(), " > ", kMaxN));
  if (const std::string error = GpuPageLayoutError(l, PageUse::kAttend); !error.empty())
    return absl::InvalidArgumentError(error);
  if (b.max_pages < 0) return absl::InvalidArgumentError(absl::StrCat("max_pages ", b.max_pages, " < 0"));
  // Chunks of kChunkPages pages per item.
  const int chunks = std::max(1, (b.max_pages + kChunkPages - 1) / kChunkPages);
  KernelArgs args;
  args.p = p;
  int splits;
  if (p.splits > 0) {
    // An explicit split count (tests): the same chunk count for every item.
    splits = std::min(p.splits, chunks);
    args.chunks_per_split = (chunks + splits - 1) / splits;
    splits = (chunks + args.chunks_per_split - 1) / args.chunks_per_split;
  } else {
    // Per item, from its own length.
    args.chunks_per_split = 0;
    splits = SplitsCovering(chunks, [](int c) { return DQuantChunksPerSplit(c); });
  }
  args.part = PartialLayout{b.items, splits, b.q_heads, l.head_dim};
  args.ws = CarveWorkspace(b.workspace_dev, args.part);
  // With transforms, the queries go through T_K^-T into the workspace, after
  // the partial states.
  absl::StatusOr<const float*> q =
      PageQueries(b, l.kv_heads, l.head_dim, args.ws.acc + args.part.count() * l.head_dim, stream);
  if (!q.ok()) return q.status();
  args.p.batch.query_dev = *q;
  const dim3 grid(splits, b.items);
  const int group = b.q_heads / l.kv_heads;
  absl::Status st = DispatchHeadDimGroup(l.head_dim, group, "D-Quant", [&](auto d, auto g) {
    return LaunchKernel(DQuantAttentionKernel<decltype(d)::value, decltype(g)::value>, grid, kThreads, kSmemBytes,
                        stream, "D-Quant attention", args);
  });
  if (!st.ok()) return st;
  return LaunchPageMerge(args.part, args.ws, b, l.kv_heads, stream);
}

}  // namespace gpu
}  // namespace driftkv
