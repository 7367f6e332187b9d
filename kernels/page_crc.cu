// Page checksums on the device: one block of kThreads threads per page;
// thread t sums segment t of the page (codec/crc32c_combine.h's segments)
// a word at a time by slicing by four (Crc32cWord: four independent table
// loads a word where a byte at a time chained four), reading 16 bytes at a
// time with the next 16 in flight, multiplies its sum by its segment's
// shift (from the host) and the block XORs the products, as
// Crc32cBySegments does on the host.
//
// The four tables are held 8 times each, entry b of table k in copy j at
// word 2048 k + 8 b + j, lane l reading copy l % 8: the four lanes of a
// copy meet in a bank only when their bytes agree modulo 4, where one
// table made a warp's 32 random bytes collide at every load (32 copies of
// four tables would take 128 KB).
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
constexpr int kCopies = 8;
constexpr int kTableWords = 4 * 256 * kCopies;

struct CrcArgs {
  PageCrcParams p;
  uint32_t shift[kThreads];  // Crc32cSegmentShifts(page_bytes, kThreads)
};

__global__ void __launch_bounds__(kThreads) PageCrcKernel(const CrcArgs a) {
  extern __shared__ uint4 table4[];  // kTableWords words
  __shared__ uint32_t warp_sums[kThreads / 32];
  const PageCrcParams& p = a.p;
  const int t = threadIdx.x, lane = t & 31;
  static_assert(kThreads == 256 && kCopies == 8, "thread t fills entry t of each table, two uint4 a copy set");
  for (int k = 0; k < 4; ++k) {
    const uint32_t e = Crc32cSliceEntry(k, static_cast<uint32_t>(t));
    const int at = (k * 256 * kCopies + kCopies * t) / 4;
    table4[at] = table4[at + 1] = make_uint4(e, e, e, e);
  }
  __syncthreads();
  const uint32_t* table = reinterpret_cast<const uint32_t*>(table4) + (lane & (kCopies - 1));
  const auto entry = [table](int k, uint32_t b) { return table[k * 256 * kCopies + kCopies * b]; };
  const auto sum16 = [&entry](uint32_t c, uint4 v) {
    return Crc32cWord(Crc32cWord(Crc32cWord(Crc32cWord(c, v.x, entry), v.y, entry), v.z, entry), v.w, entry);
  };
  const uint8_t* page = p.arena_dev + static_cast<size_t>(p.pages_dev[blockIdx.x]) * p.page_bytes;
  const size_t begin = Crc32cSegmentBegin(p.page_bytes, kThreads, t);
  const size_t end = Crc32cSegmentBegin(p.page_bytes, kThreads, t + 1);
  uint32_t c = 0xFFFFFFFFu;
  size_t i = begin;
  // Segments start at multiples of 16 bytes; so do pages when page_bytes
  // is a multiple of 16 and the arena is (cudaMalloc's are).
  if ((p.page_bytes & 15) == 0 && i + 16 <= end) {
    uint4 v = __ldg(reinterpret_cast<const uint4*>(page + i));
    for (; i + 32 <= end; i += 16) {
      const uint4 next = __ldg(reinterpret_cast<const uint4*>(page + i + 16));
      c = sum16(c, v);
      v = next;
    }
    c = sum16(c, v);
    i += 16;
  }
  for (; i < end; ++i) c = entry(0, (c ^ page[i]) & 0xFFu) ^ (c >> 8);
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
