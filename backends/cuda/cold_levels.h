// Cold pages attended through level pages: the pages of a cold launch are
// promoted on the device into a scratch pool of level pages (the hot tier's
// promotion, kernels/level_promote.h) and the level kernel attends them
// (kernels/level_attention.h). The fused cold kernel decodes rANS once per
// page as it attends, bound by the decode's serial chain; the promotion
// decodes the same symbols with many more warps in flight, and the level
// kernel then reads 1-byte levels. On an H100 the two together took 0.12
// against 0.22 ms at 1 x 8K and 1.24 against 1.62 ms at 64 x 8K
// (docs/hot_tier.md, "Cold launches through level pages"). And a cold
// layer's answer is then the one its level pages give in the hot tier,
// bit for bit: attention no longer depends on the tier a layer sits in.
//
// The scratch holds `bytes` of level pages, allocated by Init; a launch
// with more pages goes through it in chunks (cold_chunks.h), an item
// larger than the whole scratch through the fused kernel.
#ifndef DRIFTKV_BACKENDS_CUDA_COLD_LEVELS_H_
#define DRIFTKV_BACKENDS_CUDA_COLD_LEVELS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/cuda/cold_chunks.h"
#include "backends/cuda/device_memory.h"
#include "codec/level_page.h"
#include "kernels/attention.h"
#include "kernels/level_promote.h"

namespace driftkv {
namespace cuda_backend {

class ColdLevels {
 public:
  // Allocates a scratch of floor(bytes / level page) level pages (0 pages:
  // off, every cold launch fused). `promote`: the backend's promotion from
  // its cold arena (layouts, decode tables, payload sizes); each chunk
  // names its own pages and writes into the scratch.
  absl::Status Init(const gpu::PromoteParams& promote, size_t bytes);
  bool enabled() const { return capacity_ > 0; }
  int capacity_pages() const { return capacity_; }

  // Queues on `stream` the cold launch `fused` (its batch's page table
  // packed in item order, item i's pages item_pages[i] entries after item
  // i - 1's), each chunk promoted and attended by the level kernel, or
  // fused. `merge_counters_dev`: the level kernel's (LevelAttentionParams).
  // The host arrays it uploads are reused by the next call: the caller
  // waits for `stream` in between (after a failure, Attend has waited).
  absl::Status Attend(const gpu::DQuantAttentionParams& fused, absl::Span<const int> item_pages,
                      uint32_t* merge_counters_dev, cudaStream_t stream);
  // The last Attend's chunks: which items went through the level kernel.
  const std::vector<ColdChunk>& chunks() const { return chunks_; }

 private:
  gpu::PromoteParams promote_;
  int capacity_ = 0;
  Scratch pool_;    // capacity_ level pages
  Scratch ids_;     // [capacity_] 0, 1, ...; then [capacity_] full pages' tokens
  Scratch starts_;  // [items] each item's first page within its chunk
  PinnedScratch host_starts_;
  std::vector<ColdChunk> chunks_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_COLD_LEVELS_H_
