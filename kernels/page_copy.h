// Whole pages copied between memories the device addresses (its own, and
// host memory page-locked and mapped at its host address), one launch for
// any number of pages: the host level's moves (docs/tiers.md) without a
// copy call per page. Page i goes from src[i] to dst[i], and to mirror[i]
// as well when `mirror_dev` is set. Reads and writes run in 16-byte words
// where every address and page_bytes allow it, bytes otherwise.
#ifndef DRIFTKV_KERNELS_PAGE_COPY_H_
#define DRIFTKV_KERNELS_PAGE_COPY_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace gpu {

struct PageCopyParams {
  // [pages] device-addressable pointers, in device memory.
  const uint8_t* const* src_dev = nullptr;
  uint8_t* const* dst_dev = nullptr;
  uint8_t* const* mirror_dev = nullptr;  // optional
  size_t page_bytes = 0;
  int pages = 0;
};

absl::Status LaunchPageCopy(const PageCopyParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_PAGE_COPY_H_
