// The page arena: one preallocated block of `capacity` pages of a fixed
// stride, each holding one key-mean window of P compressed tokens.
//
// Page layout (offsets computed, never looked up; S = page_stride()):
//   [0, P*Ks)                 P key records,   token i at i * Ks
//   [P*Ks, P*(Ks+Vs))         P value records, token i at P*Ks + i * Vs
//   [P*(Ks+Vs), +Ms)          the window's key-mean record
//   [.., S)                   zero padding to a multiple of kPageAlign
// Ks, Vs, Ms are the codec's key, value and mean record strides. Page p
// starts at arena + p * S. A full page is one CompressedBlock of attention.
//
// Reserve() is all-or-nothing: either every page asked for is handed out or
// none is, and RESOURCE_EXHAUSTED names the capacity. Thread-safe.
#ifndef DRIFTKV_BACKENDS_PAGE_POOL_H_
#define DRIFTKV_BACKENDS_PAGE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codec/attention.h"
#include "codec/dquant_codec.h"

namespace driftkv {

using PageId = int32_t;

// 64: pages start on cache lines (and on the 16-byte boundaries a GPU copy
// engine prefers).
constexpr size_t kPageAlign = 64;

class PagePool {
 public:
  // `capacity_bytes` is rounded down to whole pages; fails when that leaves
  // no page (the message names both sizes). The codec must outlive the pool.
  static absl::StatusOr<std::unique_ptr<PagePool>> Create(const DQuantCodec* codec,
                                                           uint64_t capacity_bytes);

  int page_tokens() const { return page_tokens_; }
  size_t page_stride() const { return stride_; }
  int64_t capacity_pages() const { return capacity_; }
  uint64_t capacity_bytes() const { return static_cast<uint64_t>(capacity_) * stride_; }
  int64_t pages_in_use() const;

  // Hands out `count` pages, or none: RESOURCE_EXHAUSTED "pool full: ...".
  absl::StatusOr<std::vector<PageId>> Reserve(int64_t count);
  // Returns pages to the free list. REQUIRES: each was reserved and not yet freed.
  void Free(const std::vector<PageId>& pages);

  uint8_t* key_records(PageId p) const { return base(p); }
  uint8_t* value_records(PageId p) const { return base(p) + value_offset_; }
  uint8_t* mean_record(PageId p) const { return base(p) + mean_offset_; }
  // The full page as one attention block.
  CompressedBlock block(PageId p) const {
    return CompressedBlock{key_records(p), value_records(p), mean_record(p), page_tokens_};
  }

 private:
  PagePool() = default;
  uint8_t* base(PageId p) const { return arena_.get() + static_cast<size_t>(p) * stride_; }

  int page_tokens_ = 0;
  size_t value_offset_ = 0;
  size_t mean_offset_ = 0;
  size_t stride_ = 0;
  int64_t capacity_ = 0;
  std::unique_ptr<uint8_t[]> arena_;

  mutable absl::Mutex mu_;
  std::vector<PageId> free_ ABSL_GUARDED_BY(mu_);  // LIFO: recently freed pages are warm
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_PAGE_POOL_H_
