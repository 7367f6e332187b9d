// The host level's page copies on the device (Backend::PagesToHost and
// PagesFromHost, docs/tiers.md): one upload of the pages' addresses, one
// copy launch, and, coming back, one checksum launch over the device's
// copies, then one synchronisation. Host slots must be page-locked and
// mapped at their host address (PinHostRegion); so must the host pool's
// arena for its mirror to be written by the same launch. Not thread-safe:
// the backend calls it under its own lock, on its stream.
#ifndef DRIFTKV_BACKENDS_CUDA_HOST_LEVEL_COPY_H_
#define DRIFTKV_BACKENDS_CUDA_HOST_LEVEL_COPY_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/cuda/device_memory.h"
#include "backends/page_pool.h"

namespace driftkv {
namespace cuda_backend {

// Where the backend keeps pages: page p at dev + (p - base) * page_bytes,
// and its host mirror at mirror + (p - base) * page_bytes (null: no
// mirror the device can write).
struct DeviceArena {
  uint8_t* dev = nullptr;
  uint8_t* mirror = nullptr;
  PageId base = 0;
  size_t page_bytes = 0;
};

class HostLevelCopy {
 public:
  // Sizes the buffers for `pages` pages and launches each kernel once (CUDA
  // loads kernels at their first launch), so that the first move does not
  // pay for either.
  absl::Status Warm(size_t pages, cudaStream_t stream);
  // dst[i] <- page pages[i] of the device arena.
  absl::Status ToHost(const DeviceArena& a, absl::Span<const PageId> pages, absl::Span<uint8_t* const> dst,
                      cudaStream_t stream);
  // Page pages[i] of the device arena and of its mirror <- src[i]; then
  // sums[i] = the CRC-32C of the device's copy.
  absl::Status FromHost(const DeviceArena& a, absl::Span<const uint8_t* const> src, absl::Span<const PageId> pages,
                        uint32_t* sums, cudaStream_t stream);

 private:
  // Uploads the first `words` 8-byte words of the pinned staging to
  // scratch_, which holds at least `reserve_words` afterwards.
  absl::Status Upload(size_t words, size_t reserve_words, cudaStream_t stream);

  PinnedScratch staging_;  // the launch's addresses and page indices
  Scratch scratch_;        // the same on the device, then the sums
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_HOST_LEVEL_COPY_H_
