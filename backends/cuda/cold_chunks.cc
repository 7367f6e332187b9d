#include "backends/cuda/cold_chunks.h"

#include <algorithm>

namespace driftkv {
namespace cuda_backend {

void PlanColdChunks(absl::Span<const int> item_pages, int capacity_pages, std::vector<ColdChunk>* chunks) {
  chunks->clear();
  int page = 0;
  for (int i = 0; i < static_cast<int>(item_pages.size()); ++i) {
    const int pages = item_pages[i];
    const bool levels = capacity_pages > 0 && pages <= capacity_pages;
    ColdChunk* last = chunks->empty() ? nullptr : &chunks->back();
    if (last == nullptr || last->levels != levels || (levels && last->pages + pages > capacity_pages)) {
      ColdChunk c;
      c.first_item = i;
      c.first_page = page;
      c.levels = levels;
      chunks->push_back(c);
      last = &chunks->back();
    }
    ++last->items;
    last->pages += pages;
    last->max_pages = std::max(last->max_pages, pages);
    page += pages;
  }
}

}  // namespace cuda_backend
}  // namespace driftkv
