// The cold pages of hot layers, kept after their promotion while the cold
// pool has room for them (docs/hot_tier.md, "Cold copies").
//
// A level page and the cold page it was promoted from are exact images of
// each other, and pages never change once written. So the cold page need
// not be freed when its layer goes hot: kept, it makes the layer's
// demotion a swap of page lists (after a checksum of the kept bytes)
// instead of rANS coding every record again. Copies are a cache, never the
// only copy of anything: the pool takes them back, oldest first, when a
// Reserve falls short (PagePool's RECLAIMER), and a layer whose copies are
// gone is demoted by coding, as without them.
//
// Copies are no one's charge: a promoted layer's tenant pays for its hot
// pages only. They are counted apart (pages()) so that what is resident
// for sequences and what is cache can be told apart: a page counts when
// the copy was its only holder as it was kept (a page the prefix index or
// a fork's layer also held then stays in use without the copy, and a
// page whose other holder lets go later is not counted: the count errs
// toward "in use").
//
// A layer's copies are the cold pages of its first pages, in order: those
// it held when it was promoted (pages a hot layer gains later have no cold
// form). Locks: mu_ is a leaf; pages are freed after it is released.
#ifndef DRIFTKV_SERVICE_COLD_COPIES_H_
#define DRIFTKV_SERVICE_COLD_COPIES_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "backends/page_pool.h"

namespace driftkv {

class ColdCopies {
 public:
  explicit ColdCopies(PagePool& cold) : cold_(cold), by_partition_(cold.partitions(), 0) {}
  ~ColdCopies();  // every copy's reference back to the pool
  ColdCopies(const ColdCopies&) = delete;
  ColdCopies& operator=(const ColdCopies&) = delete;

  // Keeps `pages` (the caller's references to them move here) as the cold
  // form of the first pages of layer `id` (LayerState::id). A layer's
  // earlier copies, if any, are freed.
  void Keep(uint64_t id, std::vector<PageId> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Appends `pages` (the caller's references move here, or are freed) to
  // layer `id`'s copies when they cover exactly its first `first` pages
  // (its later pages are the cold form of the pages after them); true
  // when kept.
  bool Extend(uint64_t id, size_t first, std::vector<PageId> pages) ABSL_LOCKS_EXCLUDED(mu_);
  // Layer `id`'s copies, whose references move to the caller; empty when
  // it has none (never kept, reclaimed or dropped).
  std::vector<PageId> Take(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees layer `id`'s copies, if any.
  void Drop(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  // Frees the copies of partition `partition`, the longest kept first,
  // until `pages` pages went back to the free list or none is left;
  // returns how many went back (a page another holder shares, a forked
  // sequence's, loses only this reference); *dropped (if given): the
  // copies' references it dropped. Called as the pool's reclaimer: it
  // never calls Reserve.
  int64_t Reclaim(int64_t pages, int partition, int64_t* dropped = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Pages held only as copies (see above), in all and on one partition.
  int64_t pages() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t pages(int partition) const ABSL_LOCKS_EXCLUDED(mu_);
  size_t layers() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Copy {
    std::vector<PageId> pages;
    int64_t sole = 0;    // of pages, those the copy alone held when kept
    uint64_t order = 0;  // when kept: the key in oldest_
    int partition = 0;
  };
  // Removes layer `id`'s entry, its pages moved to *out. REQUIRES: mu_.
  void EraseLocked(uint64_t id, std::vector<PageId>* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PagePool& cold_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Copy> copies_ ABSL_GUARDED_BY(mu_);  // by layer id
  absl::btree_map<uint64_t, uint64_t> oldest_ ABSL_GUARDED_BY(mu_);  // order -> layer id
  std::vector<int64_t> by_partition_ ABSL_GUARDED_BY(mu_);           // Copy::sole summed, per partition
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_COLD_COPIES_H_
