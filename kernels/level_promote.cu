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
#include "codec/rans.h"
#include "kernels/device_common.cuh"
#include "kernels/level_promote.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = kLevelPageTokens;
static_assert(kProbScale == 256, "one table lookup per byte of state");

// Reads the payload of one record a byte at a time through 32-bit loads
// (records are 4-byte aligned), zeros past the payload.
struct Payload {
  const uint32_t* words;  // payload start (record + 4)
  int size;               // C
  int ptr;
  __device__ uint32_t Next() {
    const int p = ptr++;
    return p < size ? (__ldg(words + (p >> 2)) >> (8 * (p & 3))) & 255u : 0u;
  }
};

// Token and channel (within the head) of the lower value of key pair e of
// group grp, m-tile mt, lane l (codec/level_page.h).
__device__ __forceinline__ void KeyPairAt(int mt, int grp, int e, int l, int* tok, int* ch) {
  const int q = grp * 16 + e, ks = q >> 2, r = q & 3, g = l >> 2, t = l & 3;
  *tok = 16 * mt + g + 8 * (r & 1);
  *ch = 16 * ks + 2 * t + 8 * (r >> 1);
}

// Token (lower) and channel of value pair i of k-step group gr, lane l.
template <int D>
__device__ __forceinline__ void ValuePairAt(int gr, int i, int l, int* tok, int* ch) {
  constexpr int mts = D / 16;
  const int pidx = gr * 3 * mts * 4 + i;
  const int ks = pidx / (4 * mts), mt = (pidx / 4) % mts, r = pidx & 3, g = l >> 2, t = l & 3;
  *ch = 16 * mt + g + 8 * (r & 1);
  *tok = 16 * ks + 2 * t + 8 * (r >> 1);
}

// One block per (page, kind): thread t owns token t's record of that kind.
// Head by head (the stream runs head-major, so the rANS state carries over),
// the block decodes head_dim symbols per token into shared memory, then
// packs that head's block of the level page.
__global__ void ClearStatus(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) s[i] = 0x7fffffff;
}
__global__ void FinishStatus(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && s[i] == 0x7fffffff) s[i] = 0;
}

template <int D>
__global__ void __launch_bounds__(kThreads) PromoteKernel(PromoteParams p) {
  extern __shared__ uint32_t lvw[];  // [128][row_words] levels, 4 per word
  __shared__ uint32_t table[256];
  const int page = blockIdx.x, kind = blockIdx.y, tid = threadIdx.x;
  const LevelPageLayout& hl = p.hot;
  const DQuantPageLayout& cl = p.cold;
  const int n = hl.kv_heads * D;
  constexpr int row_words = D / 4 + 1;  // odd: a row per bank, conflict-free
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
      reinterpret_cast<uint32_t*>(hot + kLevelMeanOffset)[i] = reinterpret_cast<const uint32_t*>(cold + cl.mean_offset)[i];
    }
    if (tid < 3) reinterpret_cast<uint32_t*>(hot + kLevelHeadersBytes)[tid] = 0u;
    const size_t end = hl.blocks_offset + hl.kv_heads * head_bytes;
    for (size_t i = end + tid; i < hl.page_bytes; i += kThreads) hot[i] = 0;
  }
  __syncthreads();

  Payload pay{reinterpret_cast<const uint32_t*>(rec + 4), kind == 0 ? p.key_payload : p.value_payload, 4};
  uint32_t x = 0;
  bool ok = true;
  if (has) {
    x = __ldg(pay.words);
    ok = x >= kStateLow && x < kStateHigh;
  }
  uint32_t* row = lvw + tid * row_words;
  for (int h = 0; h < hl.kv_heads; ++h) {
    // Decode this head's symbols, four to a word.
#pragma unroll 4
    for (int j = 0; j < D; j += 4) {
      uint32_t w = 0;
      if (has) {
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint32_t e = table[x & 255u];
          w |= ((e >> 16) & 15u) << (8 * k);
          x = (e & 255u) * (x >> 8) + ((e >> 8) & 255u);
          if (x < kStateLow) {
            ok = ok && pay.ptr < pay.size;
            x = (x << 8) | pay.Next();
          }
        }
      }
      row[j / 4] = w;
    }
    __syncthreads();
    const uint8_t* lv = reinterpret_cast<const uint8_t*>(lvw);
    auto level = [&](int tok, int ch) -> uint32_t { return lv[tok * row_words * 4 + ch]; };
    if (kind == 0) {
      // Key words of head h: 32 lanes x 3D/8 words, [vec][lane][4 words].
      constexpr int lane_words = 3 * D / 8, gpm = D / 64;
      uint32_t* out = reinterpret_cast<uint32_t*>(hot + hl.blocks_offset + h * head_bytes);
      for (int o = tid; o < 32 * lane_words; o += kThreads) {
        const int vec = o / 128, l = (o / 4) % 32, c = o % 4;
        const int w = vec * 4 + c;
        const int mt = w / (3 * gpm), grp = (w / 3) % gpm, k = w % 3;
        uint32_t word = 0;
        for (int sub = 0; sub < 5; ++sub) {
          int tok, ch;
          KeyPairAt(mt, grp, 5 * k + sub, l, &tok, &ch);
          word |= (level(tok, ch) << (3 * sub)) | (level(tok, ch + 1) << (16 + 3 * sub));
        }
        int tok, ch;
        KeyPairAt(mt, grp, 15, l, &tok, &ch);
        word |= (((level(tok, ch) >> k) & 1u) << 15) | (((level(tok, ch + 1) >> k) & 1u) << 31);
        out[o] = word;
      }
    } else {
      constexpr int mts = D / 16;
      constexpr int vecs = (LevelValueGroupWords(D, 0) + LevelValueGroupWords(D, 1) + LevelValueGroupWords(D, 2)) / 4;
      uint32_t* out = reinterpret_cast<uint32_t*>(hot + hl.blocks_offset + h * head_bytes + hl.key_block_bytes);
      for (int o = tid; o < vecs * 128; o += kThreads) {
        const int vec = o / 128, l = (o / 4) % 32, c = o % 4;
        int gr = 0, v0 = 0;
        while (gr < 2 && vec >= v0 + LevelValueGroupWords(D, gr) / 4) v0 += LevelValueGroupWords(D, gr++) / 4;
        const int w = (vec - v0) * 4 + c;
        const int pairs = LevelValueGroupKsteps(gr) * mts * 4;
        uint32_t word = 0;
        for (int half = 0; half < 2; ++half) {
          uint32_t e = 0, od = 0, pw = 1;
          for (int d = 0; d < 3; ++d, pw *= 6) {
            const int i = 3 * (2 * w + half) + d;
            if (i >= pairs) break;
            int tok, ch;
            ValuePairAt<D>(gr, i, l, &tok, &ch);
            e += level(tok, ch) * pw;
            od += level(tok + 1, ch) * pw;
          }
          word |= (e << (8 * half)) | (od << (16 + 8 * half));
        }
        out[o] = word;
      }
    }
    __syncthreads();
  }
  // The lowest failing token of either kind (1-based), by integer atomicMin.
  if (has && !(ok && x == kStateLow) && p.status_dev != nullptr) atomicMin(p.status_dev + page, tid + 1);
}

}  // namespace

absl::Status LaunchPromote(const PromoteParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  if (p.hot.head_dim % 64 != 0 || p.hot.head_dim > 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.hot.head_dim, ": level pages need 64 or 128"));
  }
  if (p.status_dev != nullptr) {
    // "No failure" is the largest value, so that atomicMin keeps the first bad token.
    ClearStatus<<<(p.pages + 255) / 256, 256, 0, stream>>>(p.status_dev, p.pages);
  }
  const size_t smem = static_cast<size_t>(kLevelPageTokens) * (p.hot.head_dim / 4 + 1) * 4;
  if (p.hot.head_dim == 128) {
    PromoteKernel<128><<<dim3(p.pages, 2), kThreads, smem, stream>>>(p);
  } else {
    PromoteKernel<64><<<dim3(p.pages, 2), kThreads, smem, stream>>>(p);
  }
  if (p.status_dev != nullptr) FinishStatus<<<(p.pages + 255) / 256, 256, 0, stream>>>(p.status_dev, p.pages);
  return CudaStatus(cudaGetLastError(), "promote launch");
}

}  // namespace gpu
}  // namespace driftkv
