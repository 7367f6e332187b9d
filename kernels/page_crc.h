// CRC-32C (wire/crc32c.h) of pages in a device arena, on the device: the
// checksums a host would compute over the same bytes, without the pages'
// trip to the host.
#ifndef DRIFTKV_KERNELS_PAGE_CRC_H_
#define DRIFTKV_KERNELS_PAGE_CRC_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace gpu {

struct PageCrcParams {
  const uint8_t* arena_dev = nullptr;  // page i at arena_dev + i * page_bytes
  size_t page_bytes = 0;
  const int32_t* pages_dev = nullptr;  // [pages] page indices into the arena
  int pages = 0;
  uint32_t* sums_dev = nullptr;  // [pages] out
};

absl::Status LaunchPageCrc(const PageCrcParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_PAGE_CRC_H_
