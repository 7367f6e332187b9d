// Page checksums on the device: one block of kThreads threads per page;
// thread t sums segment t of the page (codec/crc32c_combine.h's segments)
// a byte at a time through a table in shared memory, reading 16 bytes at
// a time, multiplies its sum by its segment's shift (from the host) and
// the block XORs the products, as Crc32cBySegments does on the host.
//
// The table is held 32 times, entry b of lane l's copy at word 32 b + l:
// every lane of a warp reads its own bank, where one table made the
// lanes' random bytes collide in a few banks at every step.
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "codec/crc32c_combine.h"
#include "kernels/device_common.cuh"
#include "kernels/page_crc.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kTableWords = 256 * 32;

struct CrcArgs {
  PageCrcParams p;
  uint32_t shift[kThreads];  // Crc32cSegmentShifts(page_bytes, kThreads)
};

// One byte into the running sum c; entry b of this lane's table at table[32 b].
__device__ __forceinline__ uint32_t Byte(const uint32_t* table, uint32_t c, uint32_t byte) {
  return table[((c ^ byte) & 0xFFu) << 5] ^ (c >> 8);
}

__global__ void __launch_bounds__(kThreads) PageCrcKernel(const CrcArgs a) {
  extern __shared__ uint4 table4[];  // kTableWords words
  __shared__ uint32_t warp_sums[kThreads / 32];
  const PageCrcParams& p = a.p;
  const int t = threadIdx.x, lane = t & 31;
  {
    const uint32_t e = Crc32cTableEntry(static_cast<uint32_t>(t));
    for (int i = 0; i < 8; ++i) table4[t * 8 + i] = make_uint4(e, e, e, e);
  }
  __syncthreads();
  const uint32_t* table = reinterpret_cast<const uint32_t*>(table4) + lane;  // entry b at table[32 b]
  const uint8_t* page = p.arena_dev + static_cast<size_t>(p.pages_dev[blockIdx.x]) * p.page_bytes;
  const size_t begin = Crc32cSegmentBegin(p.page_bytes, kThreads, t);
  const size_t end = Crc32cSegmentBegin(p.page_bytes, kThreads, t + 1);
  uint32_t c = 0xFFFFFFFFu;
  size_t i = begin;
  // Segments start at multiples of 16 bytes; so do pages when page_bytes
  // is a multiple of 16 and the arena is (cudaMalloc's are).
  if ((p.page_bytes & 15) == 0) {
    for (; i + 16 <= end; i += 16) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(page + i));
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t word = words[w];
#pragma unroll
        for (int k = 0; k < 4; ++k, word >>= 8) c = Byte(table, c, word);
      }
    }
  }
  for (; i < end; ++i) c = Byte(table, c, page[i]);
  uint32_t v = Crc32cMulModP(a.shift[t], c ^ 0xFFFFFFFFu);
  for (int o = 16; o > 0; o >>= 1) v ^= __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) warp_sums[t / 32] = v;
  __syncthreads();
  if (t == 0) {
    uint32_t whole = 0;
    for (int w = 0; w < kThreads / 32; ++w) whole ^= warp_sums[w];
    p.sums_dev[blockIdx.x] = whole;
  }
}

// The shifts of a page size, made once per size (a service has two: cold
// and level pages).
void Shifts(size_t page_bytes, uint32_t* shift) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache ABSL_GUARDED_BY(mu) = new absl::flat_hash_map<size_t, std::vector<uint32_t>>();
  absl::MutexLock lock(&mu);
  std::vector<uint32_t>& s = (*cache)[page_bytes];
  if (s.empty()) {
    s.resize(kThreads);
    Crc32cSegmentShifts(page_bytes, kThreads, s.data());
  }
  std::memcpy(shift, s.data(), sizeof(uint32_t) * kThreads);
}

}  // namespace

absl::Status LaunchPageCrc(const PageCrcParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  CrcArgs a;
  a.p = p;
  Shifts(p.page_bytes, a.shift);
  PageCrcKernel<<<p.pages, kThreads, sizeof(uint32_t) * kTableWords, stream>>>(a);
  return CudaStatus(cudaGetLastError(), "page checksum launch");
}

}  // namespace gpu
}  // namespace driftkv
