#include "service/cold_copies.h"

#include <utility>

namespace driftkv {

ColdCopies::~ColdCopies() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, copy] : copies_) cold_.Free(copy.pages);
}

void ColdCopies::EraseLocked(uint64_t id, std::vector<PageId>* out) {
  auto it = copies_.find(id);
  if (it == copies_.end()) return;
  oldest_.erase(it->second.order);
  by_partition_[it->second.partition] -= it->second.sole;
  out->insert(out->end(), it->second.pages.begin(), it->second.pages.end());
  copies_.erase(it);
}

void ColdCopies::Keep(uint64_t id, std::vector<PageId> pages) {
  std::vector<PageId> earlier;
  const int64_t sole = cold_.SoleHeld(pages);
  {
    absl::MutexLock lock(&mu_);
    EraseLocked(id, &earlier);
    if (!pages.empty()) {
      const int partition = cold_.partition_of(pages.front());
      by_partition_[partition] += sole;
      const uint64_t order = next_order_++;
      oldest_.emplace(order, id);
      copies_.emplace(id, Copy{std::move(pages), sole, order, partition});
    }
  }
  cold_.Free(earlier);
}

bool ColdCopies::Extend(uint64_t id, size_t first, std::vector<PageId> pages) {
  const int64_t sole = cold_.SoleHeld(pages);
  {
    absl::MutexLock lock(&mu_);
    auto it = copies_.find(id);
    if (it != copies_.end() && it->second.pages.size() == first && !pages.empty() &&
        cold_.partition_of(pages.front()) == it->second.partition) {
      it->second.sole += sole;
      by_partition_[it->second.partition] += sole;
      it->second.pages.insert(it->second.pages.end(), pages.begin(), pages.end());
      return true;
    }
  }
  cold_.Free(pages);
  return false;
}

std::vector<PageId> ColdCopies::Take(uint64_t id) {
  std::vector<PageId> out;
  absl::MutexLock lock(&mu_);
  EraseLocked(id, &out);
  return out;
}

void ColdCopies::Drop(uint64_t id) {
  cold_.Free(Take(id));
}

int64_t ColdCopies::Reclaim(int64_t pages, int partition, int64_t* dropped) {
  int64_t freed = 0;
  if (dropped != nullptr) *dropped = 0;
  while (freed < pages) {
    std::vector<PageId> victim;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [order, id] : oldest_) {
        if (copies_.at(id).partition != partition) continue;
        EraseLocked(id, &victim);
        break;
      }
      if (victim.empty()) return freed;
    }
    if (dropped != nullptr) *dropped += static_cast<int64_t>(victim.size());
    for (PageId p : victim) {
      if (cold_.FreeIfLast(p)) {
        ++freed;
      } else {
        cold_.Free({p});
      }
    }
  }
  return freed;
}

int64_t ColdCopies::pages() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (int64_t n : by_partition_) total += n;
  return total;
}

int64_t ColdCopies::pages(int partition) const {
  absl::MutexLock lock(&mu_);
  return by_partition_[partition];
}

size_t ColdCopies::layers() const {
  absl::MutexLock lock(&mu_);
  return copies_.size();
}

}  // namespace driftkv
