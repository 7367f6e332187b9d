// Page-locked host buffers that the backend's device reads and writes at
// their host address (Backend::PinHostRegion), for the inline tensors of an
// Attend on a backend that addresses client memory: an inline query is
// copied here once in its wire dtype and read by the same gather as a
// query in a host region, and the output is written here by the
// attention's merge, in the dtype the client asked for. No host pass converts
// payloads to floats and back, and nothing is staged twice.
//
// Pinning costs milliseconds, so buffers are pinned once and reused: a
// call takes one (Take), its Lease gives it back. There are as many as
// calls have run at once; each grows to the largest call it served, up to
// kMaxBytes (a call that needs more is served without one).
#ifndef DRIFTKV_SERVICE_PINNED_STAGING_H_
#define DRIFTKV_SERVICE_PINNED_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace driftkv {

class PinnedStagingPool {
 public:
  static constexpr size_t kMaxBytes = size_t{64} << 20;

  // `backend` outlives the pool.
  explicit PinnedStagingPool(Backend* backend) : backend_(backend) {}
  ~PinnedStagingPool();
  PinnedStagingPool(const PinnedStagingPool&) = delete;
  PinnedStagingPool& operator=(const PinnedStagingPool&) = delete;

  // One taken buffer; a bump allocator over it. Empty (capacity 0) when
  // the pool could not give one: every Claim then answers null.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }

    // `bytes` at a 64-byte boundary of the buffer, or null when they do not
    // fit in what is left.
    void* Claim(size_t bytes);
    // What a Claim of `bytes` takes of the buffer.
    static uint64_t Claimed(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
    size_t capacity() const { return bytes_; }

   private:
    static constexpr size_t kAlign = 64;
    friend class PinnedStagingPool;
    void Release();
    PinnedStagingPool* pool_ = nullptr;
    char* data_ = nullptr;
    size_t bytes_ = 0, used_ = 0;
  };

  // A buffer of at least `bytes` (0 < bytes <= kMaxBytes), or an empty
  // lease when `bytes` is out of that range or memory cannot be pinned.
  Lease Take(size_t bytes);

 private:
  struct Buffer {
    char* data;
    size_t bytes;
  };
  void Give(Buffer b);
  void Free(Buffer b);

  Backend* const backend_;
  absl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PINNED_STAGING_H_
