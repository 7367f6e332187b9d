// Promotion of cold D-Quant pages to level pages on the device: the same
// bytes as codec/level_page.cc's PromotePage.
//
// One block of 128 threads per (page, keys or values); thread t decodes
// token t's record (rans.h: one 32-bit state, byte renormalisation, the
// final state must be L) one KV head at a time into shared memory, and the
// block packs each head's block as soon as its levels are there (one output
// word per thread at a time, coalesced writes). About 17 KB of shared memory
// a block, so many blocks share an SM and hide the decode's serial latency.
#include "absl/strings/str_cat.h"
#include "codec/format_constants.h"
#include "codec/level_fragments.h"
#include "kernels/device_common.cuh"
#include "kernels/first_failure.cuh"
#include "kernels/level_promote.h"
#include "kernels/promote_table.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = kLevelPageTokens;
static_assert(kProbScale == 256, "one table lookup per byte of state");

constexpr uint32_t kSelBase = 0x2104;  // byte_perm selector: (x << 8) | window byte k

// A record's payload, read forward through a three-word buffer that covers
// bytes [4a, 4a + 12): the window uses the first two words, and the load of
// a word is issued two words before it is needed, so that its latency
// (L2 or DRAM: the block's 128 records do not stay in L1) hides behind
// about 30 symbols of decoding. One 32-bit load per 4 bytes consumed
// (records are 4-byte aligned). The reads may pass the payload's end by up
// to 12 bytes, staying inside the page: after a key record come more
// records, after the last value record the mean record (4 + n bytes).
struct PayloadReader {
  const uint32_t* words;  // payload start
  uint32_t a;             // buffer starts at word a
  uint32_t w0, w1, w2;
  __device__ void Start(const uint32_t* payload, uint32_t p) {
    words = payload;
    a = p >> 2;
    w0 = __ldg(words + a);
    w1 = __ldg(words + a + 1);
    w2 = __ldg(words + a + 2);
  }
  // The 4 bytes at byte offset p (p >= 4a, p < 4a + 8 after advancing).
  __device__ uint32_t Window(uint32_t p) {
    if ((p >> 2) != a) {
      a = p >> 2;
      w0 = w1;
      w1 = w2;
      w2 = __ldg(words + a + 2);
    }
    return __funnelshift_r(w0, w1, 8 * (p & 3));
  }
};

// Decodes 4 symbols (rans.h) from state x by kernels/promote_table.h's
// entries; the at most 4 renormalisation bytes come from one 4-byte window
// (a predicated byte permute consumes the next one), the levels (each
// entry's kPromoteLevelByte) permuted into the bytes of the returned word.
__device__ __forceinline__ uint32_t Decode4(uint32_t& x, uint32_t& ptr, PayloadReader& rd, const uint32_t* table) {
  const uint32_t win = rd.Window(ptr);
  uint32_t sel = kSelBase, out = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t e = table[x & 255u];
    // Byte k of out from e's level byte (selector 4 + that byte), the
    // others kept.
    out = __byte_perm(out, e, (0x3210u & ~(0xfu << (4 * k))) | ((4u + kPromoteLevelByte) << (4 * k)));
    x = PromoteStateStep(x, e);
    asm("{\n\t.reg .pred p;\n\tsetp.lt.u32 p, %0, 0x800000;\n\t@p prmt.b32 %0, %0, %2, %1;\n\t"
        "@p add.u32 %1, %1, 1;\n\t}"
        : "+r"(x), "+r"(sel)
        : "r"(win));
  }
  ptr += sel - kSelBase;
  return out;
}

// One block per (page, kind): thread t owns token t's record of that kind.
// Eight blocks an SM: the compiler would take 72 registers (seven blocks)
// for the decode loop without the per-Decode4 test of `has`; 64 fit it
// without spills.
// Head by head (the stream runs head-major, so the rANS state carries over),
// the block decodes head_dim symbols per token into shared memory, then
// packs that head's block of the level page: key groups (3 words) or value
// k-step groups, one per thread, all index arithmetic constant but a base.
template <int D>
__global__ void __launch_bounds__(kThreads, 8) PromoteKernel(PromoteParams p) {
  constexpr int kRowBytes = D + 4;  // rows in different banks
  __shared__ __align__(16) uint8_t lv[kLevelPageTokens * kRowBytes];
  __shared__ uint32_t table[256];
  // One head's block, packed here and written out with 16-byte stores.
  constexpr int kBlockWords = 48 * D / 4;  // the key block; the value block is not larger
  static_assert(
      32 * (LevelValueGroupWords(D, 0) + LevelValueGroupWords(D, 1) + LevelValueGroupWords(D, 2)) <= kBlockWords,
      "value block fits the staging area");
  __shared__ __align__(16) uint32_t staged[kBlockWords];
  const int page = blockIdx.x, kind = blockIdx.y, tid = threadIdx.x;
  const LevelPageLayout& hl = p.hot;
  const PageLayout& cl = p.cold;
  const int n = hl.kv_heads * D;
  const int tokens = p.tokens_dev[page];
  const uint8_t* cold = p.cold_pool_dev + static_cast<size_t>(p.cold_pages_dev[page]) * cl.page_bytes;
  uint8_t* hot = p.hot_pool_dev + static_cast<size_t>(p.hot_pages_dev[page]) * hl.page_bytes;
  const size_t head_bytes = hl.key_block_bytes + hl.value_block_bytes;
  const bool has = tid < tokens;
  const uint8_t* rec = kind == 0 ? cold + static_cast<size_t>(tid) * cl.key_stride
                                 : cold + cl.value_offset + static_cast<size_t>(tid) * cl.value_stride;
  for (int i = tid; i < 256; i += kThreads) table[i] = p.tables_dev[kind * 256 + i];

  // Headers (this kind's), and with the keys the mean record and zero bytes.
  reinterpret_cast<uint32_t*>(hot + 512 * kind)[tid] = has ? *reinterpret_cast<const uint32_t*>(rec) : 0u;
  if (kind == 0) {
    for (int i = tid; i < (4 + n) / 4; i += kThreads) {
      reinterpret_cast<uint32_t*>(hot + kLevelMeanOffset)[i] =
          reinterpret_cast<const uint32_t*>(cold + cl.mean_offset)[i];
    }
    if (tid < 3) reinterpret_cast<uint32_t*>(hot + kLevelHeadersBytes)[tid] = 0u;
    const size_t end = hl.blocks_offset + hl.kv_heads * head_bytes;
    for (size_t i = end + tid; i < hl.page_bytes; i += kThreads) hot[i] = 0;
  }
  __syncthreads();

  const uint32_t* words = reinterpret_cast<const uint32_t*>(rec + 4);
  const uint32_t payload = kind == 0 ? p.key_payload : p.value_payload;
  uint32_t x = has ? __ldg(words) : kStateLow;
  const bool start_ok = x >= kStateLow && x < kStateHigh;
  uint32_t ptr = 4;
  PayloadReader rd;
  if (has) rd.Start(words, ptr);
  uint32_t* row = reinterpret_cast<uint32_t*>(lv + tid * kRowBytes);
  for (int h = 0; h < hl.kv_heads; ++h) {
    // One test of `has` a head, not one a Decode4 (every thread of a full
    // page decodes).
    if (has) {
#pragma unroll 4
      for (int j = 0; j < D / 4; ++j) row[j] = Decode4(x, ptr, rd, table);
    } else {
      for (int j = 0; j < D / 4; ++j) row[j] = 0u;
    }
    __syncthreads();
    if (kind == 0) {
      // 32 lanes x (8 m-tiles x D/64 groups): lane tid % 32 of groups
      // tid / 32 + 4 i.
      constexpr int kGroups = KeyGroupPos<D>::kGroups;
      static_assert(kGroups % (kThreads / 32) == 0, "groups shared evenly by the warps");
#pragma unroll
      for (int i = 0; i < kGroups / (kThreads / 32); ++i) {
        PackKeyGroup<D>(lv, kRowBytes, tid % 32, tid / 32 + (kThreads / 32) * i, staged);
      }
    } else {
      const int l = tid % 32, gr = tid / 32;
      if (gr == 0) PackValueGroup<D, 0>(lv, kRowBytes, l, staged);
      if (gr == 1) PackValueGroup<D, 1>(lv, kRowBytes, l, staged);
      if (gr == 2) PackValueGroup<D, 2>(lv, kRowBytes, l, staged);
    }
    __syncthreads();
    {
      const size_t bytes = kind == 0 ? hl.key_block_bytes : hl.value_block_bytes;
      uint4* out =
          reinterpret_cast<uint4*>(hot + hl.blocks_offset + h * head_bytes + (kind == 0 ? 0 : hl.key_block_bytes));
      for (size_t i = tid; i < bytes / 16; i += kThreads) out[i] = reinterpret_cast<const uint4*>(staged)[i];
    }
  }
  // The lowest failing token of either kind (1-based), by integer atomicMin.
  const bool ok = start_ok && x == kStateLow && ptr <= payload;
  if (has && !ok && p.status_dev != nullptr) atomicMin(p.status_dev + page, tid + 1);
}

}  // namespace

absl::Status LaunchPromote(const PromoteParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  if (p.hot.head_dim % 64 != 0 || p.hot.head_dim > 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.hot.head_dim, ": level pages need 64 or 128"));
  }
  LaunchFirstFailureReset(p.status_dev, p.pages, stream);
  if (p.hot.head_dim == 128) {
    PromoteKernel<128><<<dim3(p.pages, 2), kThreads, 0, stream>>>(p);
  } else {
    PromoteKernel<64><<<dim3(p.pages, 2), kThreads, 0, stream>>>(p);
  }
  LaunchFirstFailureFinish(p.status_dev, p.pages, stream);
  return CudaStatus(cudaGetLastError(), "promote launch");
}

}  // namespace gpu
}  // namespace driftkv
