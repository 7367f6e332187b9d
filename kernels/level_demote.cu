// Demotion of level pages to cold pages on the device (level_demote.h).
//
// One block of 128 threads per (page, keys or values); thread t codes token
// t's record. rANS codes backwards, so the block unpacks the page's KV heads
// last to first into shared memory ([token][channel], the inverse of the
// promotion's packing: codec/level_fragments.h) and each thread carries its
// state from one head to the next, writing renormalisation bytes backwards
// into its record in device memory, a word at a time, each symbol by the
// codec's division-free step (codec/rans_encode_step.h); then each warp
// moves its 32 streams to their payloads' starts, a record at a time over
// consecutive words (a thread moving its own record touched 32 lines per
// access).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codec/format_constants.h"
#include "codec/level_fragments.h"
#include "codec/rans_encode_step.h"
#include "kernels/device_common.cuh"
#include "kernels/first_failure.cuh"
#include "kernels/launch.cuh"
#include "kernels/level_demote.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = kLevelPageTokens;

// codec/level_page.cc LevelHeaderGrid: scale and offset finite, scale >= 0.
__device__ __forceinline__ bool GridOk(uint32_t header) {
  const uint32_t s = header & 0xffffu, o = header >> 16;
  const bool finite = (s & 0x7c00u) != 0x7c00u && (o & 0x7c00u) != 0x7c00u;
  return finite && ((s & 0x8000u) == 0 || (s & 0x7fffu) == 0);
}

// A token's record, written from the end of its payload area backwards in
// 32-bit words as rANS emits bytes (the first byte emitted is the last of
// the payload), then moved to the payload's start. `end` is the payload's
// end rounded up to a word; words below `lo` (the payload's start) are never
// written, so a stream that does not fit stays inside its record. A symbol
// emits at most one byte, so a group of four completes at most one word,
// which ended at most three bytes before the group's last: the writer keeps
// the last eight bytes emitted and the group's StoreGroup writes that word,
// one store a group instead of a predicated one per symbol.
struct BackwardWriter {
  uint32_t* end;            // one past the last word
  int room;                 // words the area holds
  uint32_t lo = 0, hi = 0;  // the last eight bytes emitted, the latest lowest
  int bytes = 0;            // emitted so far
  // Emits b's low byte when `emit`: the coding loop emits a byte every few
  // levels, at different levels in each lane.
  __device__ __forceinline__ void PutIf(bool emit, uint32_t b) {
    if (emit) {
      hi = __funnelshift_l(lo, hi, 8);
      lo = __byte_perm(lo, b, 0x2104);  // (lo << 8) | (b & 255)
      ++bytes;
    }
  }
  // Writes the word completed since `words_before` (bytes / 4 before the
  // group of at most four PutIf), if one was: it ended (bytes & 3) bytes ago.
  __device__ __forceinline__ void StoreGroup(int words_before) {
    const int j = bytes >> 2;  // a full word is end[-j]
    if (j != words_before && j <= room) end[-j] = __funnelshift_r(lo, hi, 8 * (bytes & 3));
  }
  // The last partial word, its bytes at the top.
  __device__ __forceinline__ void Flush() {
    const int nb = bytes & 3;
    if (nb != 0 && bytes / 4 + 1 <= room) end[-(bytes / 4 + 1)] = lo << (8 * (4 - nb));
  }
};

// Moves each coded record of the calling warp's 32 tokens to its payload's
// start and zeroes its tail, one record at a time with the warp's lanes on
// consecutive words: a record's stream (`used` bytes, -1 for a record not
// written) ends at byte `area` of its payload words, which start at
// `first_pay` + r * `stride_words` for the warp's r-th token. Word i takes
// the stream's bytes 4i..4i+3 from source words q + i and q + i + 1. The
// lanes read kChunks chunks of 32 words before writing any (one memory
// latency for a whole record of up to 96 words); a later batch reads only
// words above those an earlier one wrote.
__device__ __forceinline__ void MoveWarpRecordsToStart(uint32_t* first_pay, int stride_words, int area, int used,
                                                       int tail_words) {
  constexpr int kChunks = 3;
  const int lane = threadIdx.x & 31, limit = area / 4;
  for (int r = 0; r < 32; ++r) {
    const int u = __shfl_sync(0xffffffffu, used, r);
    if (u < 0) continue;  // the same in every lane
    uint32_t* pay = first_pay + r * stride_words;
    const int d = area - u;  // bytes to move down
    const int q = d >> 2, sh = 8 * (d & 3);
    const int words = (u + 3) / 4;
    for (int i0 = 0; i0 < tail_words; i0 += 32 * kChunks) {
      uint32_t a[kChunks], last[kChunks];
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int i = i0 + 32 * c + lane;
        a[c] = i <= words && q + i < limit ? pay[q + i] : 0u;
        last[c] = lane == 31 && i < words && q + i + 1 < limit ? pay[q + i + 1] : 0u;
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int i = i0 + 32 * c + lane;
        const uint32_t down = __shfl_down_sync(0xffffffffu, a[c], 1);
        const uint32_t b = lane == 31 ? last[c] : down;
        uint32_t v = sh == 0 ? a[c] : __funnelshift_r(a[c], b, sh);
        const int valid = u - 4 * i;
        if (valid < 4) v = valid <= 0 ? 0u : v & ((1u << (8 * valid)) - 1u);
        if (i < tail_words) pay[i] = v;
      }
    }
  }
}

// Static shared memory: the levels of one head [token][D + 4].
template <int D>
__global__ void __launch_bounds__(kThreads) DemoteKernel(DemoteParams p) {
  constexpr int kRowBytes = D + 4;  // rows in different banks
  __shared__ __align__(16) uint8_t lv[kLevelPageTokens * kRowBytes];
  __shared__ __align__(16) uint4 table[16];  // RansEncodeEntry
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
    const RansEncodeEntry& e = tab.step[tid];
    table[tid] = make_uint4(e.rcp, e.shift, e.cmpl, e.cum);
  }
  const bool has = tid < tokens;
  uint32_t* rec =
      reinterpret_cast<uint32_t*>(cold + (kind == 0 ? 0 : cl.value_offset) + static_cast<size_t>(tid) * stride);
  const uint32_t header = reinterpret_cast<const uint32_t*>(hot + 512 * kind)[tid];
  bool ok = GridOk(header);
  if (kind == 0) {  // the mean record, then zeros to its stride
    for (int i = tid; i < cl.mean_stride; i += kThreads) {
      cold[cl.mean_offset + i] = i < kMeanHeaderBytes + n ? hot[kLevelMeanOffset + i] : 0;
    }
  }

  const size_t head_bytes = hl.key_block_bytes + hl.value_block_bytes;
  const int area = (stride - kRecordHeaderBytes) / 4 * 4;  // >= payload: the stride is word-aligned
  BackwardWriter out;
  out.end = rec + 1 + area / 4;
  out.room = area / 4;
  uint32_t x = kStateLow;
  // Levels at or above tab.levels set bit 7 of their byte here (levels are
  // below 8 after unpacking, so no byte carries into the next).
  const uint32_t over_add = (0x80u - static_cast<uint32_t>(tab.levels)) * 0x01010101u;
  uint32_t over = 0;
  const uint32_t table_addr = static_cast<uint32_t>(__cvta_generic_to_shared(table));
  const uint32_t row_addr = static_cast<uint32_t>(__cvta_generic_to_shared(lv + tid * kRowBytes));
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
      // A group's four levels are read while the group before is coded:
      // the table loads they index then wait for one shared-memory
      // latency, not two.
      uint32_t four;
      asm volatile("ld.shared.u32 %0, [%1];" : "=r"(four) : "r"(row_addr + D - 4));
      for (int j = D - 4; j >= 0; j -= 4) {
        uint32_t next = 0;
        if (j > 0) asm volatile("ld.shared.u32 %0, [%1];" : "=r"(next) : "r"(row_addr + j - 4));
        over |= (four + over_add) & 0x80808080u;
        const int words_before = out.bytes >> 2;
#pragma unroll
        for (int k = 3; k >= 0; --k) {
          uint32_t rcp, shift, cmpl, cum;
          asm("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
              : "=r"(rcp), "=r"(shift), "=r"(cmpl), "=r"(cum)
              : "r"(table_addr + (((four >> (8 * k)) & 15u) << 4)));
          uint32_t q = RansQuotient(x, rcp, shift);
          const bool emit = RansMustEmit(q);
          out.PutIf(emit, x);
          x = emit ? x >> 8 : x;
          q = emit ? q >> 8 : q;  // (x >> 8) / f
          x = RansCoded(x, q, cmpl, cum);
        }
        out.StoreGroup(words_before);
        four = next;
      }
    }
  }
  int used = -1;  // a record written and to be moved
  if (has) {
    // The final state, its bytes LE below the stream: the top byte first.
    const int words_before = out.bytes >> 2;
    out.PutIf(true, x >> 24);
    out.PutIf(true, x >> 16);
    out.PutIf(true, x >> 8);
    out.PutIf(true, x);
    out.StoreGroup(words_before);
    out.Flush();
    if (over != 0 || out.bytes > payload) ok = false;
    if (ok) {
      rec[0] = header;
      used = out.bytes;
    } else if (p.status_dev != nullptr) {
      atomicMin(p.status_dev + page, 1 + kind * kLevelPageTokens + tid);
    }
  }
  __syncwarp();  // the warp's records as their lanes wrote them
  uint32_t* first =
      reinterpret_cast<uint32_t*>(cold + (kind == 0 ? 0 : cl.value_offset) + static_cast<size_t>(tid & ~31) * stride);
  MoveWarpRecordsToStart(first + 1, stride / 4, area, used, (stride - kRecordHeaderBytes) / 4);
}

}  // namespace

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
  LaunchFirstFailureReset(p.status_dev, p.pages, stream);
  const dim3 grid(p.pages, 2);
  absl::Status st = p.hot.head_dim == 128 ? LaunchKernel(DemoteKernel<128>, grid, kThreads, 0, stream, "demote", p)
                                          : LaunchKernel(DemoteKernel<64>, grid, kThreads, 0, stream, "demote", p);
  if (!st.ok()) return st;
  LaunchFirstFailureFinish(p.status_dev, p.pages, stream);
  return CudaStatus(cudaGetLastError(), "demote launch");
}

}  // namespace gpu
}  // namespace driftkv
