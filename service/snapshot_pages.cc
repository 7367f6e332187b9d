#include "service/snapshot_pages.h"

#include <cstring>

namespace driftkv {

SnapshotPagesWritten::~SnapshotPagesWritten() {
  std::vector<PageId> held;
  for (const auto& [key, pages] : written_) {
    for (const auto& [page, ordinal] : pages) held.push_back(page);
  }
  pool_->Free(held);
}

std::optional<uint64_t> SnapshotPagesWritten::Find(const std::string& space, PageChecksum checksum, PageId page) const {
  auto it = written_.find(std::make_pair(space, checksum));
  if (it == written_.end()) return std::nullopt;
  for (const auto& [other, ordinal] : it->second) {
    // A checksum match is a hint; the bytes decide.
    if (other == page || std::memcmp(pool_->page(other), pool_->page(page), pool_->page_stride()) == 0) {
      return ordinal;
    }
  }
  return std::nullopt;
}

void SnapshotPagesWritten::Add(const std::string& space, PageChecksum checksum, PageId page, uint64_t ordinal) {
  pool_->Retain({page});
  written_[std::make_pair(space, checksum)].emplace_back(page, ordinal);
}

void SnapshotPagesRestored::Full(PageId page, PageChecksum stored) {
  pages_.push_back(page);
  sums_.push_back(stored);
  if (page == kNone) return;
  pool_->Retain({page});
  held_.push_back(page);
}

std::vector<PageId> SnapshotPagesRestored::NotUploaded(const std::vector<PageId>& pages) const {
  std::vector<PageId> out;
  absl::flat_hash_set<PageId> seen;
  for (PageId p : pages) {
    if (!uploaded_.contains(p) && seen.insert(p).second) out.push_back(p);
  }
  return out;
}

void SnapshotPagesRestored::Release() {
  pool_->Free(held_);
  held_.clear();
}

}  // namespace driftkv
