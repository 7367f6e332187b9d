#include "service/pinned_staging.h"

#include <sys/mman.h>

#include <utility>

namespace driftkv {
namespace {

constexpr size_t kMinBytes = size_t{1} << 20;

}  // namespace

PinnedStagingPool::~PinnedStagingPool() {
  absl::MutexLock lock(&mu_);
  for (const Buffer& b : free_) Free(b);
  free_.clear();
}

PinnedStagingPool::Lease& PinnedStagingPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    used_ = std::exchange(other.used_, 0);
  }
  return *this;
}

void* PinnedStagingPool::Lease::Claim(size_t bytes) {
  if (data_ == nullptr || bytes > bytes_ - used_) return nullptr;
  void* p = data_ + used_;
  used_ += Claimed(bytes);
  if (used_ > bytes_) used_ = bytes_;
  return p;
}

void PinnedStagingPool::Lease::Release() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Give(Buffer{data_, bytes_});
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = used_ = 0;
}

PinnedStagingPool::Lease PinnedStagingPool::Take(size_t bytes) {
  Lease lease;
  if (bytes == 0 || bytes > kMaxBytes) return lease;
  Buffer b{nullptr, 0};
  {
    absl::MutexLock lock(&mu_);
    // The smallest free buffer that fits, else the largest (grown below).
    int fit = -1, largest = -1;
    for (size_t k = 0; k < free_.size(); ++k) {
      const size_t size = free_[k].bytes;
      if (size >= bytes && (fit < 0 || size < free_[fit].bytes)) fit = static_cast<int>(k);
      if (largest < 0 || size > free_[largest].bytes) largest = static_cast<int>(k);
    }
    const int best = fit >= 0 ? fit : largest;
    if (best >= 0) {
      b = free_[best];
      free_.erase(free_.begin() + best);
    }
  }
  if (b.data != nullptr && b.bytes < bytes) {
    Free(b);
    b = Buffer{nullptr, 0};
  }
  if (b.data == nullptr) {
    size_t size = kMinBytes;
    while (size < bytes) size *= 2;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return lease;
    if (!backend_->PinHostRegion(p, size).ok()) {
      munmap(p, size);
      return lease;
    }
    b = Buffer{static_cast<char*>(p), size};
  }
  lease.pool_ = this;
  lease.data_ = b.data;
  lease.bytes_ = b.bytes;
  return lease;
}

void PinnedStagingPool::Give(Buffer b) {
  absl::MutexLock lock(&mu_);
  free_.push_back(b);
}

void PinnedStagingPool::Free(Buffer b) {
  backend_->UnpinHostRegion(b.data);
  munmap(b.data, b.bytes);
}

}  // namespace driftkv
