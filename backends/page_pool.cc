#include "backends/page_pool.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const PageLayout& layout,
                                                           uint64_t capacity_bytes) {
  std::unique_ptr<PagePool> pool(new PagePool());
  pool->layout_ = layout;
  pool->stride_ = layout.page_bytes;
  const uint64_t pages = capacity_bytes / pool->stride_;
  if (pages == 0) {
    return absl::InvalidArgumentError(absl::StrCat("pool_bytes ", capacity_bytes,
                                                   " is smaller than one page of ", pool->stride_,
                                                   " bytes"));
  }
  if (pages > static_cast<uint64_t>(std::numeric_limits<PageId>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("pool_bytes ", capacity_bytes, " gives ", pages,
                                                   " pages, more than ",
                                                   std::numeric_limits<PageId>::max()));
  }
  pool->capacity_ = static_cast<int64_t>(pages);
  const size_t bytes = static_cast<size_t>(pages) * pool->stride_;
  pool->arena_.reset(new (std::nothrow) uint8_t[bytes]);
  if (pool->arena_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate the pool arena of ", bytes, " bytes"));
  }
  std::memset(pool->arena_.get(), 0, bytes);  // commits the memory now, not on first use
  pool->free_.reserve(pages);
  for (int64_t i = static_cast<int64_t>(pages) - 1; i >= 0; --i) {
    pool->free_.push_back(static_cast<PageId>(i));
  }
  return pool;
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::CreateOpaque(size_t page_bytes, int page_tokens,
                                                                 uint64_t capacity_bytes) {
  PageLayout layout;
  layout.page_tokens = page_tokens;
  layout.page_bytes = page_bytes;
  return Create(layout, capacity_bytes);
}

int64_t PagePool::pages_in_use() const {
  absl::MutexLock lock(&mu_);
  return capacity_ - static_cast<int64_t>(free_.size());
}

absl::StatusOr<std::vector<PageId>> PagePool::Reserve(int64_t count) {
  std::vector<PageId> out;
  if (count <= 0) return out;
  absl::MutexLock lock(&mu_);
  const int64_t free = static_cast<int64_t>(free_.size());
  if (count > free) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool full: capacity ", capacity_, " pages (", capacity_bytes(), " bytes, ",
        layout_.page_tokens, " tokens per page), ", capacity_ - free, " in use, ", count,
        " more needed; release sequences or raise pool_bytes"));
  }
  out.assign(free_.end() - count, free_.end());
  free_.resize(free - count);
  return out;
}

void PagePool::Free(const std::vector<PageId>& pages) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), pages.begin(), pages.end());
}

}  // namespace driftkv
