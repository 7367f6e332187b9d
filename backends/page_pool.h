// The page arena: one preallocated block of `capacity` pages of one
// PageLayout (codec/page_layout.h: key records, value records and the
// key-mean record of one window of P tokens, page p at arena + p *
// page_bytes). A full page is one CompressedBlock of attention.
//
// Reserve() is all-or-nothing: either every page asked for is handed out or
// none is, and RESOURCE_EXHAUSTED names the capacity. Thread-safe.
//
// REFERENCES. Every page in use has a reference count: Reserve hands a page
// out with one, Retain adds one (a second holder sharing the page: a
// forked sequence, docs/prefix_cache.md), Free drops one and puts the page
// back on the free list only when none is left. A holder that never
// retains sees the pool exactly as without counts. The pool does not know
// who holds a page: pages_in_use counts distinct pages, and whoever
// charges memory to a tenant decides how a shared page is charged. A page
// is immutable while shared: its bytes are written once, before its first
// holder publishes it, and never again (tier moves copy into new pages).
//
// RECLAIMER. A cache that holds references of its own (the prefix index,
// service/prefix_index.h) may register a reclaimer: when Reserve finds too
// few free pages in a partition it calls reclaimer(short, partition)
// without the pool's lock, then tries once more; up to kReclaimRounds
// times while it still falls short (another Reserve may take what one
// reclaim freed). The reclaimer drops
// references it alone holds (FreeIfLast), never one another holder needs.
//
// PARTITIONS. A pool may be split into `partitions` contiguous ranges of
// page ids, one per device of a multi-GPU server (backends/multi_device.h):
// partition k holds ids [partition_begin(k), partition_begin(k + 1)), and
// Reserve takes pages of one partition. One partition (the default) is the
// whole pool.
#ifndef DRIFTKV_BACKENDS_PAGE_POOL_H_
#define DRIFTKV_BACKENDS_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "codec/compressed_attention.h"
#include "codec/page_layout.h"

namespace driftkv {

using PageId = int32_t;

class PagePool {
 public:
  static constexpr int kReclaimRounds = 4;
  // `capacity_bytes` is rounded down to whole pages; fails when that leaves
  // no page (the message names both sizes).
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(const PageLayout& layout, uint64_t capacity_bytes,
                                                          int partitions = 1);
  // A pool of opaque pages of `page_bytes` holding `page_tokens` tokens each
  // (the hot tier's level pages, codec/level_page.h); layout() then carries
  // only page_tokens and page_bytes, and only page() addresses pages.
  static absl::StatusOr<std::unique_ptr<PagePool>> CreateOpaque(size_t page_bytes, int page_tokens,
                                                                uint64_t capacity_bytes, int partitions = 1);

  const PageLayout& layout() const { return layout_; }
  int page_tokens() const { return layout_.page_tokens; }
  size_t page_stride() const { return stride_; }
  int64_t capacity_pages() const { return capacity_; }
  uint64_t capacity_bytes() const { return static_cast<uint64_t>(capacity_) * stride_; }
  int64_t pages_in_use() const;

  int partitions() const { return static_cast<int>(begin_.size()) - 1; }
  PageId partition_begin(int k) const { return begin_[k]; }  // k in [0, partitions()]
  int partition_of(PageId p) const;
  int64_t pages_in_use(int partition) const;

  // Hands out `count` pages of `partition`, or none: RESOURCE_EXHAUSTED
  // "pool full: ...".
  absl::StatusOr<std::vector<PageId>> Reserve(int64_t count, int partition = 0);
  // Adds one reference to each of `pages` (a page may appear more than
  // once: one reference per appearance). REQUIRES: each is in use, and
  // the caller holds a reference to it for the duration of the call (so
  // that no Free can return it to the free list meanwhile).
  void Retain(absl::Span<const PageId> pages);
  // Drops one reference to each page; a page whose last reference goes
  // returns to the free list. REQUIRES: each is in use, and the caller
  // holds the reference it drops.
  void Free(const std::vector<PageId>& pages);
  // Drops the caller's reference to p only if it is the last one (the page
  // then returns to the free list): true when it did. REQUIRES: the caller
  // holds a reference to p.
  bool FreeIfLast(PageId p);
  // See RECLAIMER; set before the pool is shared (not synchronised), null
  // to remove. It must not call Reserve.
  void SetReclaimer(std::function<void(int64_t pages, int partition)> reclaimer) { reclaimer_ = std::move(reclaimer); }
  // Page p's reference count: 0 when free (tests, tools).
  int32_t references(PageId p) const;
  // How many of `pages` have exactly one holder now, under one lock.
  int64_t SoleHeld(absl::Span<const PageId> pages) const;

  // Page p's first byte.
  uint8_t* page(PageId p) const { return base(p); }
  uint8_t* key_records(PageId p) const { return base(p); }
  uint8_t* value_records(PageId p) const { return base(p) + layout_.value_offset; }
  uint8_t* mean_record(PageId p) const { return base(p) + layout_.mean_offset; }
  // The full page as one attention block.
  CompressedBlock block(PageId p) const {
    return CompressedBlock{key_records(p), value_records(p), mean_record(p), layout_.page_tokens};
  }

 private:
  PagePool() = default;
  uint8_t* base(PageId p) const { return arena_.get() + static_cast<size_t>(p) * stride_; }
  // Reserve without the reclaimer; *short_by: pages missing when it fails.
  absl::StatusOr<std::vector<PageId>> TryReserve(int64_t count, int partition, int64_t* short_by);

  PageLayout layout_;
  size_t stride_ = 0;  // layout_.page_bytes
  int64_t capacity_ = 0;
  std::unique_ptr<uint8_t[]> arena_;
  std::function<void(int64_t, int)> reclaimer_;

  std::vector<PageId> begin_;  // partition k: [begin_[k], begin_[k + 1])
  mutable absl::Mutex mu_;
  // Per partition, LIFO: recently freed pages are warm.
  std::vector<std::vector<PageId>> free_ ABSL_GUARDED_BY(mu_);
  // Per page: its holders (0: on a free list). 32 bits: a page shared by
  // more holders than a pool has pages is not a use this pool serves.
  std::vector<int32_t> refs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_PAGE_POOL_H_
