// Page checksums on the device: one block of kThreads threads per page;
// thread t sums segment t of the page (codec/crc32c_combine.h's segments)
// a byte at a time through a table in shared memory, reading 16 bytes at
// a time, then the block joins the segments' sums in a tree, as
// Crc32cBySegments does on the host.
#include "absl/strings/str_cat.h"
#include "codec/crc32c_combine.h"
#include "kernels/device_common.cuh"
#include "kernels/page_crc.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;

__device__ uint32_t Step(const uint32_t* table, uint32_t c, uint32_t word) {
  for (int i = 0; i < 4; ++i, word >>= 8) c = table[(c ^ word) & 0xFFu] ^ (c >> 8);
  return c;
}

__global__ void __launch_bounds__(kThreads) PageCrcKernel(PageCrcParams p) {
  __shared__ uint32_t table[256];
  __shared__ Crc32cPowers powers;
  __shared__ uint32_t sums[kThreads];
  __shared__ uint64_t lengths[kThreads];
  const int t = threadIdx.x;
  table[t] = Crc32cTableEntry(static_cast<uint32_t>(t));
  if (t == 0) Crc32cMakePowers(&powers);
  __syncthreads();
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
      c = Step(table, c, v.x);
      c = Step(table, c, v.y);
      c = Step(table, c, v.z);
      c = Step(table, c, v.w);
    }
  }
  for (; i < end; ++i) c = table[(c ^ page[i]) & 0xFFu] ^ (c >> 8);
  sums[t] = c ^ 0xFFFFFFFFu;
  lengths[t] = end - begin;
  __syncthreads();
  for (int stride = 1; stride < kThreads; stride *= 2) {
    if (t % (2 * stride) == 0) {
      sums[t] = Crc32cJoin(powers, sums[t], sums[t + stride], lengths[t + stride]);
      lengths[t] += lengths[t + stride];
    }
    __syncthreads();
  }
  if (t == 0) p.sums_dev[blockIdx.x] = sums[0];
}

}  // namespace

absl::Status LaunchPageCrc(const PageCrcParams& p, cudaStream_t stream) {
  if (p.pages < 0) return absl::InvalidArgumentError(absl::StrCat("pages ", p.pages, " < 0"));
  if (p.pages == 0) return absl::OkStatus();
  PageCrcKernel<<<p.pages, kThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "page checksum launch");
}

}  // namespace gpu
}  // namespace driftkv
