// A heap buffer aligned to kDiskAlign (tiers/disk_format.h), its size a
// multiple of a block: what O_DIRECT reads and writes need.
#ifndef DRIFTKV_TIERS_ALIGNED_BUFFER_H_
#define DRIFTKV_TIERS_ALIGNED_BUFFER_H_

#include <cstdlib>
#include <cstring>
#include <memory>

#include "tiers/disk_format.h"

namespace driftkv {
namespace tiers {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // `size` is rounded up to a multiple of `block`; bytes from `zero_from`
  // on are zeroed (the caller fills those before, a page is not written
  // twice); nullptr data() when the allocation failed.
  explicit AlignedBuffer(size_t size, size_t zero_from = 0, size_t block = kDiskAlign)
      : size_(RoundUpToBlock(size, block)) {
    if (size_ == 0) return;
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kDiskAlign, RoundUpToBlock(size_, kDiskAlign))));
    if (data_ != nullptr && zero_from < size_) std::memset(data_.get() + zero_from, 0, size_ - zero_from);
  }
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  size_t size_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_ALIGNED_BUFFER_H_
