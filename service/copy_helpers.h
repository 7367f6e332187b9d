// Copies a call needs done before a device reads their destination, shared
// between the call's thread and a helper thread that takes them up while
// the call goes on with other work. An inline Attend's queries (0.5 MB for
// 64 items) are copied into pinned staging one item at a time as they are
// validated; the copies are needed only when the backend launches, after
// the call's lookups, locks and plan, so a helper that copies meanwhile
// takes most of them off the call's path.
//
// A call asks for a helper with Begin (one that is idle, woken then: its
// wake-up overlaps the rest of the validation), hands it copies with Add,
// and Finish waits for all of them: whatever the helper has not taken,
// the caller copies itself, so a helper that wakes late (or none at all)
// costs nothing but the copies the call would have made anyway. Stores
// bypass the cache (the device reads the bytes next, not this process),
// and Finish fences them: after it, the device sees every byte.
#ifndef DRIFTKV_SERVICE_COPY_HELPERS_H_
#define DRIFTKV_SERVICE_COPY_HELPERS_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace driftkv {

// Copies `n` bytes from `from` to `to` with stores that bypass the cache
// where the destination allows (16-byte aligned); StreamFence() makes them
// visible to other agents (a device, another thread's fence does not).
void StreamCopy(void* to, const void* from, size_t n);
void StreamFence();

class CopyHelpers {
  struct Helper;

 public:
  // `threads` helpers, started at the first Begin; 0: none (every Batch
  // copies on its caller's thread).
  explicit CopyHelpers(int threads);
  ~CopyHelpers();
  CopyHelpers(const CopyHelpers&) = delete;
  CopyHelpers& operator=(const CopyHelpers&) = delete;

  // One call's copies. Used by one thread; the sources must stay unchanged
  // and the destinations untouched until Finish returns.
  class Batch {
   public:
    Batch() = default;  // without a helper
    Batch(Batch&& other) noexcept { *this = std::move(other); }
    Batch& operator=(Batch&& other) noexcept;
    ~Batch() { Finish(); }
    // Copies `n` bytes from `from` to `to`: handed to the helper, or, with
    // none (or its list full), here and now.
    void Add(void* to, const void* from, size_t n);
    // Every copy done and fenced; the helper (if any) goes back to idle.
    // Idempotent; the batch then copies on its caller's thread.
    void Finish();

   private:
    friend class CopyHelpers;
    Helper* helper_ = nullptr;
    bool unfenced_ = false;  // Add copied here since the last fence
  };

  // A batch with an idle helper (woken now), or without one when every
  // helper is busy or there are none.
  Batch Begin();

  // Helpers that woke to a batch (for tests: the helper path ran).
  int64_t batches_helped() const { return helped_.load(std::memory_order_relaxed); }

 private:
  void Run(Helper* h);
  // Back to the idle list: by the helper for a batch abandoned before it
  // looked, else by the batch's caller once it has seen the helper done.
  void Idle(Helper* h);

  const int threads_;
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Helper>> helpers_ ABSL_GUARDED_BY(mu_);
  std::vector<Helper*> idle_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> helped_{0};
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_COPY_HELPERS_H_
