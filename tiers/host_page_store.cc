// HostPageStore (tiers/host_page_store.h).
#include "tiers/host_page_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv::tiers {

absl::StatusOr<std::unique_ptr<HostPageStore>> HostPageStore::Create(size_t page_bytes, uint64_t budget_bytes) {
  if (page_bytes == 0 || budget_bytes / page_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host level budget ", budget_bytes, " bytes holds no page of ", page_bytes, " bytes"));
  }
  const int64_t capacity = static_cast<int64_t>(budget_bytes / page_bytes);
  const size_t os_page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t bytes = static_cast<size_t>(capacity) * page_bytes;
  const size_t mapped = (bytes + os_page - 1) / os_page * os_page;
  // Anonymous and private, and written once here: the budget is committed
  // at start, so that no move down pays for first touches of its slots
  // (MAP_POPULATE alone left first writes slow on some hosts).
  void* block = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (block == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host level: mmap of ", mapped, " bytes failed: ", std::strerror(errno)));
  }
  std::memset(block, 0, mapped);
  std::unique_ptr<HostPageStore> s(new HostPageStore(page_bytes, capacity, static_cast<uint8_t*>(block), mapped));
  absl::MutexLock lock(&s->mu_);
  s->free_.reserve(static_cast<size_t>(capacity));
  // Slot 0 on top: a fresh store hands out ascending slots, so that a
  // sequence's pages lie side by side in memory.
  for (int64_t i = capacity - 1; i >= 0; --i) s->free_.push_back(static_cast<Slot>(i));
  return s;
}

HostPageStore::~HostPageStore() {
  munmap(block_, mapped_);
}

int64_t HostPageStore::in_use() const {
  absl::MutexLock lock(&mu_);
  return capacity_ - static_cast<int64_t>(free_.size());
}

int64_t HostPageStore::free_slots() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

absl::StatusOr<std::vector<HostPageStore::Slot>> HostPageStore::Take(int64_t count) {
  absl::MutexLock lock(&mu_);
  if (count < 0 || static_cast<size_t>(count) > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host level full: ", count, " pages asked, ", free_.size(), " of ", capacity_, " free"));
  }
  std::vector<Slot> out(free_.end() - count, free_.end());
  std::reverse(out.begin(), out.end());
  free_.resize(free_.size() - static_cast<size_t>(count));
  return out;
}

void HostPageStore::Give(absl::Span<const Slot> slots) {
  absl::MutexLock lock(&mu_);
  // Reversed, so that Take hands out a run given back in its own order.
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) free_.push_back(*it);
}

}  // namespace driftkv::tiers
