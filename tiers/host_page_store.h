// The host-memory level below a GPU's page pool (docs/tiers.md): fixed-size
// page slots carved from one block of host memory, within a byte budget.
// The store only hands out and takes back slots; what a slot holds, and
// the checksum it must match, belong to the caller (service/spill_tier.h
// keeps each page's CRC-32C beside it and checks it when the page comes
// back). The block is allocated once, page-aligned, so that a backend can
// page-lock and map it for copies straight between it and the device
// (Backend::PinHostMemory). Thread-safe.
#ifndef DRIFTKV_TIERS_HOST_PAGE_STORE_H_
#define DRIFTKV_TIERS_HOST_PAGE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace driftkv::tiers {

class HostPageStore {
 public:
  // floor(budget_bytes / page_bytes) slots; INVALID_ARGUMENT when that is
  // none, RESOURCE_EXHAUSTED when the host cannot map the block.
  static absl::StatusOr<std::unique_ptr<HostPageStore>> Create(size_t page_bytes, uint64_t budget_bytes);
  ~HostPageStore();
  HostPageStore(const HostPageStore&) = delete;
  HostPageStore& operator=(const HostPageStore&) = delete;

  size_t page_bytes() const { return page_bytes_; }
  int64_t capacity() const { return capacity_; }
  // The block (to pin it), capacity() * page_bytes() bytes.
  uint8_t* block() const { return block_; }
  size_t block_bytes() const { return static_cast<size_t>(capacity_) * page_bytes_; }
  // Slots are numbered 0 .. capacity() - 1; 64 bits unsigned, as the
  // disk level's keys, so that a sequence holds either in one list.
  using Slot = uint64_t;
  uint8_t* slot(Slot s) const { return block_ + static_cast<size_t>(s) * page_bytes_; }

  int64_t in_use() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t free_slots() const ABSL_LOCKS_EXCLUDED(mu_);
  // `count` slots or none: RESOURCE_EXHAUSTED naming what is free.
  absl::StatusOr<std::vector<Slot>> Take(int64_t count) ABSL_LOCKS_EXCLUDED(mu_);
  // REQUIRES: each slot taken and not given back since.
  void Give(absl::Span<const Slot> slots) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  HostPageStore(size_t page_bytes, int64_t capacity, uint8_t* block, size_t mapped)
      : page_bytes_(page_bytes), capacity_(capacity), block_(block), mapped_(mapped) {}

  const size_t page_bytes_;
  const int64_t capacity_;
  uint8_t* const block_;
  const size_t mapped_;  // bytes of the mapping (block_bytes rounded up to the OS page)
  mutable absl::Mutex mu_;
  // LIFO: a slot given back is the next taken.
  std::vector<Slot> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv::tiers

#endif  // DRIFTKV_TIERS_HOST_PAGE_STORE_H_
