// How a cold launch's items pass through the scratch level pages of
// cold_levels.h: runs of consecutive items whose pages fit the scratch
// together, each run promoted and attended at once; an item with more
// pages than the scratch holds goes to the fused cold kernel instead
// (with its neighbours of the same kind). An item's route depends on its
// own page count alone, and both kernels give an item the same bits alone
// and in any batch, so a batch's answers do not depend on how it was cut.
#ifndef DRIFTKV_BACKENDS_CUDA_COLD_CHUNKS_H_
#define DRIFTKV_BACKENDS_CUDA_COLD_CHUNKS_H_

#include <vector>

#include "absl/types/span.h"

namespace driftkv {
namespace cuda_backend {

struct ColdChunk {
  int first_item = 0;
  int items = 0;
  int first_page = 0;  // the launch's page table entries [first_page, first_page + pages)
  int pages = 0;
  int max_pages = 0;   // of one item
  bool levels = true;  // false: the fused cold kernel
};

// Cuts items with item_pages[i] pages each, their page table entries
// packed in item order, into chunks of at most `capacity_pages` pages
// (level chunks) and runs of items larger than that (fused chunks).
// capacity_pages <= 0: one fused chunk of everything.
void PlanColdChunks(absl::Span<const int> item_pages, int capacity_pages, std::vector<ColdChunk>* chunks);

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_COLD_CHUNKS_H_
