#include "backends/page_pool.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::Create(const PageLayout& layout, uint64_t capacity_bytes,
                                                           int partitions) {
  std::unique_ptr<PagePool> pool(new PagePool());
  pool->layout_ = layout;
  pool->stride_ = layout.page_bytes;
  const uint64_t pages = capacity_bytes / pool->stride_;
  if (pages == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool_bytes ", capacity_bytes, " is smaller than one page of ", pool->stride_, " bytes"));
  }
  if (pages > static_cast<uint64_t>(std::numeric_limits<PageId>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("pool_bytes ", capacity_bytes, " gives ", pages,
                                                   " pages, more than ", std::numeric_limits<PageId>::max()));
  }
  if (partitions < 1 || static_cast<uint64_t>(partitions) > pages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool of ", pages, " pages cannot be split into ", partitions, " partitions"));
  }
  pool->capacity_ = static_cast<int64_t>(pages);
  const size_t bytes = static_cast<size_t>(pages) * pool->stride_;
  pool->arena_.reset(new (std::nothrow) uint8_t[bytes]);
  if (pool->arena_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate the pool arena of ", bytes, " bytes"));
  }
  std::memset(pool->arena_.get(), 0, bytes);  // commits the memory now, not on first use
  for (int k = 0; k <= partitions; ++k) {
    pool->begin_.push_back(static_cast<PageId>(static_cast<int64_t>(pages) * k / partitions));
  }
  {
    absl::MutexLock lock(&pool->mu_);
    pool->refs_.assign(pages, 0);
    pool->free_.resize(partitions);
    for (int k = 0; k < partitions; ++k) {
      std::vector<PageId>& f = pool->free_[k];
      f.reserve(pool->begin_[k + 1] - pool->begin_[k]);
      for (PageId i = pool->begin_[k + 1] - 1; i >= pool->begin_[k]; --i) f.push_back(i);
    }
  }
  return pool;
}

absl::StatusOr<std::unique_ptr<PagePool>> PagePool::CreateOpaque(size_t page_bytes, int page_tokens,
                                                                 uint64_t capacity_bytes, int partitions) {
  PageLayout layout;
  layout.page_tokens = page_tokens;
  layout.page_bytes = page_bytes;
  return Create(layout, capacity_bytes, partitions);
}

int PagePool::partition_of(PageId p) const {
  return static_cast<int>(std::upper_bound(begin_.begin(), begin_.end(), p) - begin_.begin()) - 1;
}

int64_t PagePool::pages_in_use() const {
  absl::MutexLock lock(&mu_);
  int64_t free = 0;
  for (const std::vector<PageId>& f : free_) free += static_cast<int64_t>(f.size());
  return capacity_ - free;
}

int64_t PagePool::pages_in_use(int partition) const {
  absl::MutexLock lock(&mu_);
  return (begin_[partition + 1] - begin_[partition]) - static_cast<int64_t>(free_[partition].size());
}

absl::StatusOr<std::vector<PageId>> PagePool::Reserve(int64_t count, int partition) {
  int64_t short_by = 0;
  absl::StatusOr<std::vector<PageId>> out = TryReserve(count, partition, &short_by);
  // Pages one reclaim freed may go to a concurrent Reserve before this
  // one tries again: a few rounds, each for what is still missing.
  for (int round = 0; round < kReclaimRounds && !out.ok() && short_by > 0 && reclaimer_; ++round) {
    reclaimer_(short_by, partition);
    out = TryReserve(count, partition, &short_by);
  }
  return out;
}

absl::StatusOr<std::vector<PageId>> PagePool::TryReserve(int64_t count, int partition, int64_t* short_by) {
  std::vector<PageId> out;
  if (count <= 0) return out;
  if (partition < 0 || partition >= partitions()) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of ", partitions()));
  }
  absl::MutexLock lock(&mu_);
  std::vector<PageId>& f = free_[partition];
  const int64_t free = static_cast<int64_t>(f.size());
  if (count > free) {
    *short_by = count - free;
    const int64_t cap = begin_[partition + 1] - begin_[partition];
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool full: capacity ", cap, " pages", partitions() > 1 ? absl::StrCat(" on device slot ", partition) : "",
        " (", cap * stride_, " bytes, ", layout_.page_tokens, " tokens per page), ", cap - free, " in use, ", count,
        " more needed; release sequences or raise pool_bytes"));
  }
  out.assign(f.end() - count, f.end());
  f.resize(free - count);
  for (PageId p : out) refs_[p] = 1;
  return out;
}

void PagePool::Retain(absl::Span<const PageId> pages) {
  absl::MutexLock lock(&mu_);
  for (PageId p : pages) ++refs_[p];
}

void PagePool::Free(const std::vector<PageId>& pages) {
  absl::MutexLock lock(&mu_);
  for (PageId p : pages) {
    if (--refs_[p] == 0) free_[partitions() == 1 ? 0 : partition_of(p)].push_back(p);
  }
}

bool PagePool::FreeIfLast(PageId p) {
  absl::MutexLock lock(&mu_);
  if (refs_[p] != 1) return false;
  refs_[p] = 0;
  free_[partitions() == 1 ? 0 : partition_of(p)].push_back(p);
  return true;
}

int32_t PagePool::references(PageId p) const {
  absl::MutexLock lock(&mu_);
  return refs_[p];
}

int64_t PagePool::SoleHeld(absl::Span<const PageId> pages) const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (PageId p : pages) n += refs_[p] == 1 ? 1 : 0;
  return n;
}

}  // namespace driftkv
