// Promotion of cold D-Quant pages to level pages on the device: the same
// bytes as codec/level_page.cc's PromotePage.
//
// One block of 128 threads per page, two passes (keys, then values). Pass:
// thread t decodes token t's record (rans.h: one 32-bit state, byte renorm,
// final state must be L) into a [128][n] level array in shared memory, then
// the block packs those levels into the page's blocks, one output word per
// thread at a time, writes coalesced.
#include "absl/strings/str_cat.h"
#include "codec/rans.h"
#include "kernels/device_common.cuh"
#include "kernels/level_promote.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = kLevelPageTokens;
static_assert(kProbScale == 256, "one table lookup per byte of state");

// One record's symbols into lv[0..n); false when the stream is corrupt.
__device__ bool DecodeRecord(const uint8_t* rec, int payload, int n, const uint32_t* table, uint8_t* lv) {
  const uint8_t* pay = rec + 4;
  uint32_t x = static_cast<uint32_t>(pay[0]) | (static_cast<uint32_t>(pay[1]) << 8) |
               (static_cast<uint32_t>(pay[2]) << 16) | (static_cast<uint32_t>(pay[3]) << 24);
  bool ok = x >= kStateLow && x < kStateHigh;
  int ptr = 4;
  for (int j = 0; j < n; ++j) {
    const uint32_t e = table[x & 255u];
    lv[j] = static_cast<uint8_t>((e >> 16) & 15u);
    x = (e & 255u) * (x >> 8) + ((e >> 8) & 255u);
    if (x < kStateLow) {
      const uint32_t b = ptr < payload ? pay[ptr] : 0u;
      ok = ok && ptr < payload;
      ++ptr;
      x = (x << 8) | b;
    }
  }
  return ok && x == kStateLow;
}

// Token and channel (within the head) of the lower value of key pair e of
// group grp, m-tile mt, lane l (codec/level_page.h).
__device__ __forceinline__ void KeyPairAt(int mt, int grp, int e, int l, int* tok, int* ch) {
  const int q = grp * 16 + e, ks = q >> 2, r = q & 3, g = l >> 2, t = l & 3;
  *tok = 16 * mt + g + 8 * (r & 1);
  *ch = 16 * ks + 2 * t + 8 * (r >> 1);
}

// Token (lower) and channel of value pair i of k-step group gr, lane l.
__device__ __forceinline__ void ValuePairAt(int head_dim, int gr, int i, int l, int* tok, int* ch) {
  const int mts = head_dim / 16;
  const int pidx = gr * 3 * mts * 4 + i;
  const int ks = pidx / (4 * mts), mt = (pidx / 4) % mts, r = pidx & 3, g = l >> 2, t = l & 3;
  *ch = 16 * mt + g + 8 * (r & 1);
  *tok = 16 * ks + 2 * t + 8 * (r >> 1);
}

__global__ void __launch_bounds__(kThreads) PromoteKernel(PromoteParams p) {
  extern __shared__ uint8_t lv[];  // [128][n] levels
  __shared__ uint32_t table[256];
  __shared__ int bad;
  const int page = blockIdx.x, tid = threadIdx.x;
  const LevelPageLayout& hl = p.hot;
  const DQuantPageLayout& cl = p.cold;
  const int n = hl.kv_heads * hl.head_dim, D = hl.head_dim;
  const int tokens = p.tokens_dev[page];
  const uint8_t* cold = p.cold_pool_dev + static_cast<size_t>(p.cold_pages_dev[page]) * cl.page_bytes;
  uint8_t* hot = p.hot_pool_dev + static_cast<size_t>(p.hot_pages_dev[page]) * hl.page_bytes;
  const size_t head_bytes = hl.key_block_bytes + hl.value_block_bytes;
  if (tid == 0) bad = kLevelPageTokens + 1;  // none

  // Headers, mean record, zero bytes.
  {
    const bool has = tid < tokens;
    const uint32_t kh = has ? *reinterpret_cast<const uint32_t*>(cold + static_cast<size_t>(tid) * cl.key_stride) : 0u;
    const uint32_t vh =
        has ? *reinterpret_cast<const uint32_t*>(cold + cl.value_offset + static_cast<size_t>(tid) * cl.value_stride) : 0u;
    reinterpret_cast<uint32_t*>(hot)[tid] = kh;
    reinterpret_cast<uint32_t*>(hot + 512)[tid] = vh;
    for (int i = tid; i < (4 + n) / 4; i += kThreads) {
      reinterpret_cast<uint32_t*>(hot + kLevelMeanOffset)[i] = reinterpret_cast<const uint32_t*>(cold + cl.mean_offset)[i];
    }
    if (tid < 3) reinterpret_cast<uint32_t*>(hot + kLevelHeadersBytes)[tid] = 0u;
    const size_t end = hl.blocks_offset + hl.kv_heads * head_bytes;
    for (size_t i = end + tid; i < hl.page_bytes; i += kThreads) hot[i] = 0;
  }

  for (int kind = 0; kind < 2; ++kind) {
    __syncthreads();
    for (int i = tid; i < 256; i += kThreads) table[i] = p.tables_dev[kind * 256 + i];
    __syncthreads();
    uint8_t* mine = lv + static_cast<size_t>(tid) * n;
    if (tid < tokens) {
      const uint8_t* rec = kind == 0 ? cold + static_cast<size_t>(tid) * cl.key_stride
                                     : cold + cl.value_offset + static_cast<size_t>(tid) * cl.value_stride;
      if (!DecodeRecord(rec, kind == 0 ? p.key_payload : p.value_payload, n, table, mine)) atomicMin(&bad, tid + 1);
    } else {
      for (int j = 0; j < n; ++j) mine[j] = 0;
    }
    __syncthreads();
    if (kind == 0) {
      // Key words: per head 32 lanes x 3D/8 words, [vec][lane][4 words].
      const int lane_words = 3 * D / 8, gpm = D / 64;
      const int words = hl.kv_heads * 32 * lane_words;
      for (int o = tid; o < words; o += kThreads) {
        const int h = o / (32 * lane_words), r = o % (32 * lane_words);
        const int vec = r / 128, l = (r / 4) % 32, c = r % 4;
        const int w = vec * 4 + c;
        const int mt = w / (3 * gpm), grp = (w / 3) % gpm, k = w % 3;
        uint32_t word = 0;
        for (int sub = 0; sub < 5; ++sub) {
          int tok, ch;
          KeyPairAt(mt, grp, 5 * k + sub, l, &tok, &ch);
          const uint8_t* row = lv + static_cast<size_t>(tok) * n + h * D + ch;
          word |= (static_cast<uint32_t>(row[0]) << (3 * sub)) | (static_cast<uint32_t>(row[1]) << (16 + 3 * sub));
        }
        int tok, ch;
        KeyPairAt(mt, grp, 15, l, &tok, &ch);
        const uint8_t* row = lv + static_cast<size_t>(tok) * n + h * D + ch;
        word |= (((row[0] >> k) & 1u) << 15) | (((row[1] >> k) & 1u) << 31);
        reinterpret_cast<uint32_t*>(hot + hl.blocks_offset + h * head_bytes)[(vec * 32 + l) * 4 + c] = word;
      }
    } else {
      const int mts = D / 16;
      const int vecs = static_cast<int>(hl.value_block_bytes / 512);
      const int words = hl.kv_heads * vecs * 128;
      for (int o = tid; o < words; o += kThreads) {
        const int h = o / (vecs * 128), r = o % (vecs * 128);
        const int vec = r / 128, l = (r / 4) % 32, c = r % 4;
        int gr = 0, v0 = 0;
        while (gr < 2 && vec >= v0 + LevelValueGroupWords(D, gr) / 4) v0 += LevelValueGroupWords(D, gr++) / 4;
        const int w = (vec - v0) * 4 + c;
        const int pairs = LevelValueGroupKsteps(gr) * mts * 4;
        uint32_t word = 0;
        for (int half = 0; half < 2; ++half) {
          const int j = 2 * w + half;
          uint32_t e = 0, od = 0, pw = 1;
          for (int d = 0; d < 3; ++d, pw *= 6) {
            const int i = 3 * j + d;
            if (i >= pairs) break;
            int tok, ch;
            ValuePairAt(D, gr, i, l, &tok, &ch);
            e += lv[static_cast<size_t>(tok) * n + h * D + ch] * pw;
            od += lv[static_cast<size_t>(tok + 1) * n + h * D + ch] * pw;
          }
          word |= (e << (8 * half)) | (od << (16 + 8 * half));
        }
        reinterpret_cast<uint32_t*>(hot + hl.blocks_offset + h * head_bytes + hl.key_block_bytes)[(vec * 32 + l) * 4 + c] = word;
      }
    }
  }
  __syncthreads();
  if (tid == 0 && p.status_dev != nullptr) p.status_dev[page] = bad > kLevelPageTokens ? 0 : bad;
}

}  // namespace

absl::Status LaunchPromote(const PromoteParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  const size_t smem = static_cast<size_t>(kLevelPageTokens) * p.hot.n();
  cudaError_t e = cudaFuncSetAttribute(PromoteKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e != cudaSuccess) return CudaStatus(e, "cudaFuncSetAttribute(promote)");
  PromoteKernel<<<p.pages, kThreads, smem, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "promote launch");
}

}  // namespace gpu
}  // namespace driftkv
