// Demotion of level pages to cold pages on the device (level_demote.h).
//
// One block of 128 threads per (page, keys or values); thread t codes token
// t's record. rANS codes backwards, so the block unpacks the page's KV heads
// last to first into shared memory ([token][channel], the inverse of
// level_promote.cu's packing) and each thread carries its state from one
// head to the next, writing renormalisation bytes backwards into its record
// in shared memory. The finished records (header, payload moved to its
// start, zero tail) leave in one coalesced copy of the page's records.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codec/format_constants.h"
#include "kernels/device_common.cuh"
#include "kernels/launch.cuh"
#include "kernels/level_demote.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = kLevelPageTokens;

// Key group gi of lane l of one head's block (the inverse of
// level_promote.cu's PackKeyGroup) into levels lv[token][row_bytes].
template <int D>
__device__ __forceinline__ void UnpackKeyGroup(const uint32_t* in, int l, int gi, uint8_t* lv, int row_bytes) {
  constexpr int gpm = D / 64;
  const int mt = gi / gpm, grp = gi % gpm, g = l >> 2, t = l & 3;
  uint8_t* base = lv + (16 * mt + g) * row_bytes + 64 * grp + 2 * t;
  const int w0 = gi * 3;
  uint32_t w[3];
#pragma unroll
  for (int k = 0; k < 3; ++k) w[k] = in[((w0 + k) / 4 * 32 + l) * 4 + (w0 + k) % 4];
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const int r = e & 3;
    uint32_t lo, hi;
    if (e < 15) {
      lo = (w[e / 5] >> (3 * (e % 5))) & 7u;
      hi = (w[e / 5] >> (16 + 3 * (e % 5))) & 7u;
    } else {
      lo = ((w[0] >> 15) & 1u) | ((w[1] >> 14) & 2u) | ((w[2] >> 13) & 4u);
      hi = ((w[0] >> 31) & 1u) | ((w[1] >> 30) & 2u) | ((w[2] >> 29) & 4u);
    }
    *reinterpret_cast<uint16_t*>(base + 8 * (r & 1) * row_bytes + 16 * (e >> 2) + 8 * (r >> 1)) =
        static_cast<uint16_t>(lo | (hi << 8));
  }
}

// The base-6 digits of a byte as codec/level_page.cc computes them (for
// bytes >= 216 too, so that an out-of-range level is seen the same way).
__device__ __forceinline__ uint32_t Digit(uint32_t x, int d) {
  const uint32_t l2 = (x * 57u) >> 11, r = x - 36u * l2, l1 = (r * 43u) >> 8;
  return d == 0 ? r - 6u * l1 : (d == 1 ? l1 : l2);
}

// Value k-step group GR of lane l of one head's block (the inverse of
// level_promote.cu's PackValueGroup).
template <int D, int GR>
__device__ __forceinline__ void UnpackValueGroup(const uint32_t* in, int l, uint8_t* lv, int row_bytes) {
  constexpr int MT = D / 16;
  constexpr int kPairs = LevelValueGroupKsteps(GR) * MT * 4;
  constexpr int kFirst = GR * 3 * MT * 4;
  constexpr int kWords = LevelValueGroupWords(D, GR);
  constexpr int kVec0 = GR == 0 ? 0 : (GR == 1 ? 1 : 2) * (LevelValueGroupWords(D, 0) / 4);
  const int g = l >> 2, t = l & 3;
  uint8_t* base = lv + (2 * t) * row_bytes + g;
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    const uint32_t word = in[((kVec0 + w / 4) * 32 + l) * 4 + w % 4];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint32_t e = (word >> (8 * half)) & 255u, od = (word >> (16 + 8 * half)) & 255u;
#pragma unroll
      for (int d = 0; d < 3; ++d) {
        const int i = 3 * (2 * w + half) + d;
        if (i < kPairs) {
          const int P = kFirst + i, ks = P / (4 * MT), mt = (P / 4) % MT, r = P & 3;
          uint8_t* at = base + (16 * ks + 8 * (r >> 1)) * row_bytes + 16 * mt + 8 * (r & 1);
          at[0] = static_cast<uint8_t>(Digit(e, d));
          at[row_bytes] = static_cast<uint8_t>(Digit(od, d));
        }
      }
    }
  }
}

// codec/level_page.cc LevelHeaderGrid: scale and offset finite, scale >= 0.
__device__ __forceinline__ bool GridOk(uint32_t header) {
  const uint32_t s = header & 0xffffu, o = header >> 16;
  const bool finite = (s & 0x7c00u) != 0x7c00u && (o & 0x7c00u) != 0x7c00u;
  return finite && ((s & 0x8000u) == 0 || (s & 0x7fffu) == 0);
}

__global__ void ClearStatus(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) s[i] = 0x7fffffff;
}
__global__ void FinishStatus(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && s[i] == 0x7fffffff) s[i] = 0;
}

// Dynamic shared memory: the levels of one head [token][D + 4], then the
// page's records of this kind [token][stride].
template <int D>
__global__ void __launch_bounds__(kThreads) DemoteKernel(DemoteParams p) {
  constexpr int kRowBytes = D + 4;  // rows in different banks
  extern __shared__ __align__(16) uint8_t smem[];
  uint8_t* lv = smem;
  uint8_t* recs = smem + kLevelPageTokens * kRowBytes;
  __shared__ uint32_t table[16], rcp[16];
  const int page = blockIdx.x, kind = blockIdx.y, tid = threadIdx.x;
  const LevelPageLayout& hl = p.hot;
  const PageLayout& cl = p.cold;
  const int n = hl.kv_heads * D;
  const int tokens = p.tokens_dev[page];
  const uint8_t* hot = p.hot_pool_dev + static_cast<size_t>(p.hot_pages_dev[page]) * hl.page_bytes;
  uint8_t* cold = p.cold_pool_dev + static_cast<size_t>(p.cold_pages_dev[page]) * cl.page_bytes;
  const DemoteTable& tab = kind == 0 ? p.keys : p.values;
  const int stride = kind == 0 ? cl.key_stride : cl.value_stride;
  const int payload = tab.payload;
  if (tid < 16) {
    // A level past the table (only in a corrupt page, which is reported)
    // codes as frequency 1 so that nothing divides by zero.
    const uint32_t e = tab.entry[tid];
    const uint32_t f = (e & 0xffffu) != 0 ? (e & 0xffffu) : 1u;
    table[tid] = (e & 0xffff0000u) | f;
    rcp[tid] = 0xffffffffu / f;  // q = umulhi(x, rcp) is x / f or one less
  }
  const bool has = tid < tokens;
  uint8_t* rec = recs + tid * stride;
  const uint32_t header = reinterpret_cast<const uint32_t*>(hot + 512 * kind)[tid];
  bool ok = GridOk(header);
  if (kind == 0) {  // the mean record, then zeros to its stride
    for (int i = tid; i < cl.mean_stride; i += kThreads) {
      cold[cl.mean_offset + i] = i < kMeanHeaderBytes + n ? hot[kLevelMeanOffset + i] : 0;
    }
  }

  const size_t head_bytes = hl.key_block_bytes + hl.value_block_bytes;
  uint32_t x = kStateLow;
  int pos = payload;  // the stream's bytes so far: rec[4 + pos, 4 + payload)
  uint32_t top = 0;
  for (int h = hl.kv_heads - 1; h >= 0; --h) {
    __syncthreads();  // the previous head's levels are coded
    const uint32_t* in = reinterpret_cast<const uint32_t*>(hot + hl.blocks_offset + h * head_bytes +
                                                           (kind == 0 ? 0 : hl.key_block_bytes));
    if (kind == 0) {
      for (int task = tid; task < 32 * 8 * (D / 64); task += kThreads) {
        UnpackKeyGroup<D>(in, task % 32, task / 32, lv, kRowBytes);
      }
    } else {
      const int l = tid % 32, gr = tid / 32;
      if (gr == 0) UnpackValueGroup<D, 0>(in, l, lv, kRowBytes);
      if (gr == 1) UnpackValueGroup<D, 1>(in, l, lv, kRowBytes);
      if (gr == 2) UnpackValueGroup<D, 2>(in, l, lv, kRowBytes);
    }
    __syncthreads();
    if (has) {
      const uint8_t* row = lv + tid * kRowBytes;
      for (int j = D - 1; j >= 0; --j) {
        const uint32_t s = row[j];
        top = max(top, s);
        const uint32_t e = table[s & 15u];
        const uint32_t f = e & 0xffffu;
        if (x >= ((kStateLow >> kProbBits) << 8) * f) {
          if (pos > 0)
            rec[4 + --pos] = static_cast<uint8_t>(x);
          else
            ok = false;
          x >>= 8;
        }
        uint32_t q = __umulhi(x, rcp[s & 15u]);
        uint32_t r = x - q * f;
        if (r >= f) {
          ++q;
          r -= f;
        }
        x = (q << kProbBits) + r + (e >> 16);
      }
    }
  }
  if (has) {
    if (top >= static_cast<uint32_t>(tab.levels) || pos < kStateBytes) ok = false;
    if (ok) {
      pos -= kStateBytes;
      rec[4 + pos] = static_cast<uint8_t>(x);
      rec[5 + pos] = static_cast<uint8_t>(x >> 8);
      rec[6 + pos] = static_cast<uint8_t>(x >> 16);
      rec[7 + pos] = static_cast<uint8_t>(x >> 24);
      const int used = payload - pos;
      for (int i = 0; i < used; ++i) rec[4 + i] = rec[4 + pos + i];
      for (int i = 4 + used; i < stride; ++i) rec[i] = 0;
      *reinterpret_cast<uint32_t*>(rec) = header;
    } else if (p.status_dev != nullptr) {
      atomicMin(p.status_dev + page, 1 + kind * kLevelPageTokens + tid);
    }
  }
  __syncthreads();
  // The records of tokens [0, tokens), contiguous in the page.
  uint8_t* dst = cold + (kind == 0 ? 0 : cl.value_offset);
  const int bytes = tokens * stride;
  for (int i = tid; i < bytes / 4; i += kThreads) {
    reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(recs)[i];
  }
}

}  // namespace

DemoteTable MakeDemoteTable(const uint16_t* freq, const uint16_t* cum, int levels, int payload) {
  DemoteTable t;
  t.levels = levels;
  t.payload = payload;
  for (int m = 0; m < levels && m < 16; ++m) t.entry[m] = freq[m] | (static_cast<uint32_t>(cum[m]) << 16);
  return t;
}

absl::Status LaunchDemote(const DemoteParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  if (p.hot.head_dim != 64 && p.hot.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.hot.head_dim, ": level pages need 64 or 128"));
  }
  if (p.cold.key_stride % 4 != 0 || p.cold.value_stride % 4 != 0 || p.cold.value_offset % 4 != 0 ||
      p.cold.page_bytes % 4 != 0) {
    return absl::InvalidArgumentError("cold page layout not 4-byte aligned");
  }
  if (p.keys.payload + kRecordHeaderBytes > p.cold.key_stride ||
      p.values.payload + kRecordHeaderBytes > p.cold.value_stride) {
    return absl::InvalidArgumentError("payload larger than its record");
  }
  if (p.status_dev != nullptr) ClearStatus<<<(p.pages + 255) / 256, 256, 0, stream>>>(p.status_dev, p.pages);
  const dim3 grid(p.pages, 2);
  absl::Status st;
  if (p.hot.head_dim == 128) {
    const size_t smem = kLevelPageTokens * (128 + 4) +
                        static_cast<size_t>(kLevelPageTokens) * std::max(p.cold.key_stride, p.cold.value_stride);
    st = LaunchKernel(DemoteKernel<128>, grid, kThreads, smem, stream, "demote", p);
  } else {
    const size_t smem = kLevelPageTokens * (64 + 4) +
                        static_cast<size_t>(kLevelPageTokens) * std::max(p.cold.key_stride, p.cold.value_stride);
    st = LaunchKernel(DemoteKernel<64>, grid, kThreads, smem, stream, "demote", p);
  }
  if (!st.ok()) return st;
  if (p.status_dev != nullptr) FinishStatus<<<(p.pages + 255) / 256, 256, 0, stream>>>(p.status_dev, p.pages);
  return CudaStatus(cudaGetLastError(), "demote launch");
}

}  // namespace gpu
}  // namespace driftkv
