// Window tokens a launch lacks, moved into their slots of the device window
// cache through a pinned ring of two halves: the host packs one half while
// the device copies the other. A launch that fills many windows at once
// (the first Attend of new sequences: 512 KiB a sequence of 8 KV heads x
// 128 with a 128-token window) then needs no pinned staging of its own size
// (allocated on first use, such staging cost that launch tens of
// milliseconds) and overlaps the packing with the copies. A round's
// packing is spread over a few threads of the uploader's own: one thread
// packing 32 MiB of windows from pageable memory was most of the ~7 ms of
// host work in a first Attend of 64 new sequences on the H200
// (docs/hot_tier.md).
#ifndef DRIFTKV_BACKENDS_CUDA_WINDOW_UPLOAD_H_
#define DRIFTKV_BACKENDS_CUDA_WINDOW_UPLOAD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/window_cache.h"
#include "backends/thread_pool.h"

namespace driftkv {
namespace cuda_backend {

class WindowUploader {
 public:
  WindowUploader() = default;
  WindowUploader(const WindowUploader&) = delete;
  WindowUploader& operator=(const WindowUploader&) = delete;
  ~WindowUploader();

  // The ring for windows of n values a token: each half holds at least one
  // whole window's keys and values; `pack_threads` (counting the caller)
  // pack each round.
  absl::Status Init(int n, int pack_threads);

  // Queues on `stream`, for each upload, tokens [from, from + count) of its
  // item's window (keys and values) into its slot of `cache`: per round of
  // one half, one host-to-device copy and one scatter launch per
  // gpu::kMaxCopySegments / 2 uploads. Before reusing a half the host waits
  // for that half's earlier copy; the caller synchronises `stream` before
  // its next call, so every call starts with both halves free.
  absl::Status Upload(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads,
                      const WindowCache& cache, cudaStream_t stream);

  // A launch's few missing tokens (a decode step's: one a window) ride in
  // the launch's own staging upload instead, saving a copy: Pack writes
  // them at `host` (each upload's keys, then its values) and Scatter queues
  // their moves into the cache from `dev`, where the caller's upload put
  // them. Bytes: what Pack writes.
  size_t Bytes(absl::Span<const WindowCache::Upload> uploads) const;
  void Pack(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads, uint8_t* host) const;
  // Pack's bytes, the uploads spread over the packing threads.
  void PackSpread(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads, uint8_t* host);
  absl::Status Scatter(absl::Span<const WindowCache::Upload> uploads, const WindowCache& cache, const uint8_t* dev,
                       cudaStream_t stream) const;

 private:
  int n_ = 0;
  size_t half_bytes_ = 0;
  PinnedScratch host_;
  Scratch device_;
  cudaEvent_t sent_[2] = {nullptr, nullptr};  // each half's copy queued
  std::unique_ptr<ThreadPool> pack_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_WINDOW_UPLOAD_H_
