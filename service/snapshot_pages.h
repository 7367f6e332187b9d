// Pages held once across a snapshot (service/snapshot_file.h, version 4):
// the writer's side finds a page whose bytes it already wrote in the same
// namespace (a tenant's page-key namespace, Handler::NamespaceOf), the
// loader's side gives a repeated page the one restored copy.
//
// Sharing is by content within a tenant: forks share pages by reference,
// and a hot layer shared by forks is demoted at drain into equal cold pages
// per holder (demotion is exact), which the content finds again. Across
// tenants nothing is shared, as at runtime (docs/prefix_cache.md).
#ifndef DRIFTKV_SERVICE_SNAPSHOT_PAGES_H_
#define DRIFTKV_SERVICE_SNAPSHOT_PAGES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "backends/page_checksum.h"
#include "backends/page_pool.h"

namespace driftkv {

// The writer's memory of the full pages written. It holds a reference to
// each (PagePool::Retain) until destroyed, so that their bytes stay there
// to compare with even if their sequence goes meanwhile.
class SnapshotPagesWritten {
 public:
  explicit SnapshotPagesWritten(PagePool* pool) : pool_(pool) {}
  ~SnapshotPagesWritten();
  SnapshotPagesWritten(const SnapshotPagesWritten&) = delete;
  SnapshotPagesWritten& operator=(const SnapshotPagesWritten&) = delete;

  // The ordinal of a full page already written in namespace `space` (its
  // 16 bytes) with the same checksum and bytes as `page`, if any.
  std::optional<uint64_t> Find(const std::string& space, PageChecksum checksum, PageId page) const;
  // `page` was written as full page `ordinal` in `space`. REQUIRES: the
  // caller holds a reference to it.
  void Add(const std::string& space, PageChecksum checksum, PageId page, uint64_t ordinal);

 private:
  PagePool* pool_;
  // (namespace, checksum) -> (page, ordinal) of every full page written.
  absl::flat_hash_map<std::pair<std::string, PageChecksum>, std::vector<std::pair<PageId, uint64_t>>> written_;
};

// The loader's map from a file's full pages (by ordinal) to the pages
// restored for them. It holds one reference to each until Release, so that
// a page restored for a sequence that is then dropped still serves a later
// sequence that repeats it; pages nothing else holds go back to the pool
// at Release.
class SnapshotPagesRestored {
 public:
  static constexpr PageId kNone = -1;
  explicit SnapshotPagesRestored(PagePool* pool) : pool_(pool) {}
  ~SnapshotPagesRestored() { Release(); }
  SnapshotPagesRestored(const SnapshotPagesRestored&) = delete;
  SnapshotPagesRestored& operator=(const SnapshotPagesRestored&) = delete;

  // The next full page of the file: restored as `page` (the caller holds
  // a reference; this adds one), or kNone when it was not kept (a full
  // pool, a failed checksum).
  void Full(PageId page, PageChecksum stored);
  // Full page `ordinal`'s restored page (kNone if it was not kept) and its
  // stored checksum. REQUIRES: ordinal < the full pages so far (the
  // reader checks it).
  PageId page(uint64_t ordinal) const { return pages_[ordinal]; }
  PageChecksum checksum(uint64_t ordinal) const { return sums_[ordinal]; }
  // Of `pages`, those not yet marked Uploaded: each page goes to the
  // backend once, with the first sequence kept that holds it.
  std::vector<PageId> NotUploaded(const std::vector<PageId>& pages) const;
  void Uploaded(const std::vector<PageId>& pages) { uploaded_.insert(pages.begin(), pages.end()); }
  // Drops the references taken by Full.
  void Release();

 private:
  PagePool* pool_;
  std::vector<PageId> pages_;
  std::vector<PageChecksum> sums_;
  std::vector<PageId> held_;
  absl::flat_hash_set<PageId> uploaded_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SNAPSHOT_PAGES_H_
