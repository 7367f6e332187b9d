// Page copies (kernels/page_copy.h): one block per chunk of a page. Across PCIe each warp's loads cover 512 contiguous
// bytes, so host reads go out as full-size requests, and every thread keeps several loads in flight before it stores,
// which is what the bandwidth of reads from host memory needs.
#include "absl/strings/str_cat.h"
#include "kernels/page_copy.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr size_t kChunkBytes = size_t{kThreads} * kUnroll * 16;  // 16 KiB

__global__ void __launch_bounds__(kThreads) PageCopyKernel(PageCopyParams p, unsigned chunks) {
  const unsigned page = blockIdx.x / chunks;
  const uint8_t* src = p.src_dev[page];
  uint8_t* dst = p.dst_dev[page];
  uint8_t* mirror = p.mirror_dev != nullptr ? p.mirror_dev[page] : nullptr;
  const size_t begin = static_cast<size_t>(blockIdx.x % chunks) * kChunkBytes;
  const size_t end = min(begin + kChunkBytes, p.page_bytes);
  const bool words = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                       reinterpret_cast<uintptr_t>(mirror) | p.page_bytes) &
                      15) == 0;
  if (words) {
    uint4 v[kUnroll];
    const size_t first = begin / 16 + threadIdx.x;
    const size_t last = end / 16;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t w = first + static_cast<size_t>(u) * kThreads;
      if (w < last) v[u] = reinterpret_cast<const uint4*>(src)[w];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t w = first + static_cast<size_t>(u) * kThreads;
      if (w < last) {
        reinterpret_cast<uint4*>(dst)[w] = v[u];
        if (mirror != nullptr) reinterpret_cast<uint4*>(mirror)[w] = v[u];
      }
    }
    return;
  }
  for (size_t i = begin + threadIdx.x; i < end; i += kThreads) {
    const uint8_t b = src[i];
    dst[i] = b;
    if (mirror != nullptr) mirror[i] = b;
  }
}

}  // namespace

absl::Status LaunchPageCopy(const PageCopyParams& p, cudaStream_t stream) {
  if (p.pages <= 0 || p.page_bytes == 0) return absl::OkStatus();
  const unsigned chunks = static_cast<unsigned>((p.page_bytes + kChunkBytes - 1) / kChunkBytes);
  const uint64_t blocks = uint64_t{chunks} * static_cast<uint64_t>(p.pages);
  if (blocks > 0x7FFFFFFFu) return absl::InvalidArgumentError(absl::StrCat("page copy of ", blocks, " blocks"));
  PageCopyKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, chunks);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("page copy launch: ", cudaGetErrorString(e)));
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace driftkv
