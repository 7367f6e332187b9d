// Copies a call needs done before a device reads their destination, shared
// between the call's thread and helper threads that take them up while
// the call goes on with other work. An inline Attend's queries (0.5 MB for
// 64 items) are copied into pinned staging one item at a time as they are
// validated; the copies are needed only when the backend launches, after
// the call's lookups, locks and plan, and one core copies no faster than
// ~5-10 GB/s, so helpers that copy meanwhile, several at once, take most
// of them off the call's path.
//
// A call asks for helpers with Begin (every idle one; a helper that has
// slept is woken then, and its wake-up overlaps the rest of the
// validation), hands them copies with Add, and Finish waits for all of
// them: whatever the helpers have not taken, the caller copies itself, so
// helpers that wake late (or none at all) cost nothing but the copies the
// call would have made anyway. A helper polls for its next batch for
// `spin` after each one before it sleeps (a decode loop's calls then find
// it awake). Stores bypass the cache (the device reads the bytes next, not
// this process), and Finish fences them: after it, the device sees every
// byte.
#ifndef DRIFTKV_SERVICE_COPY_HELPERS_H_
#define DRIFTKV_SERVICE_COPY_HELPERS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace driftkv {

// Copies `n` bytes from `from` to `to` with stores that bypass the cache
// where the destination allows (16-byte aligned); StreamFence() makes them
// visible to other agents (a device, another thread's fence does not).
void StreamCopy(void* to, const void* from, size_t n);
void StreamFence();

class CopyHelpers {
  struct Helper;
  struct Work;

 public:
  // `threads` helpers, started at the first Begin; 0: none (every Batch
  // copies on its caller's thread).
  CopyHelpers(int threads, absl::Duration spin);
  ~CopyHelpers();
  CopyHelpers(const CopyHelpers&) = delete;
  CopyHelpers& operator=(const CopyHelpers&) = delete;

  // One call's copies. Used by one thread; the sources must stay unchanged
  // and the destinations untouched until Finish returns.
  class Batch {
   public:
    Batch() = default;  // without helpers
    Batch(Batch&& other) noexcept { *this = std::move(other); }
    Batch& operator=(Batch&& other) noexcept;
    ~Batch() { Finish(); }
    // Copies `n` bytes from `from` to `to`: handed to the helpers, or,
    // with none (or their list full), here and now.
    void Add(void* to, const void* from, size_t n);
    // Every copy done and fenced; the helpers go back to idle. Idempotent;
    // the batch then copies on its caller's thread.
    void Finish();

   private:
    friend class CopyHelpers;
    CopyHelpers* crew_ = nullptr;
    Work* work_ = nullptr;  // null: no helper
    absl::InlinedVector<Helper*, 4> helpers_;
    bool unfenced_ = false;  // Add copied here since the last fence
  };

  // A batch with every idle helper (each woken if it sleeps), or without
  // helpers when all are busy or there are none.
  Batch Begin();

  // Helpers that took part in a batch (for tests: the helper path ran).
  int64_t batches_helped() const { return helped_.load(std::memory_order_relaxed); }

 private:
  void Run(Helper* h);
  // Back to the idle lists: by a helper for a batch abandoned before it
  // looked, else by the batch's caller once it has seen the helper done
  // (a helper idle before the caller has looked could be armed anew and
  // its state reset under the caller's wait).
  void Idle(Helper* h);
  void Idle(Work* w);

  const int threads_;
  const absl::Duration spin_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Helper>> helpers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Work>> works_ ABSL_GUARDED_BY(mu_);
  std::vector<Helper*> idle_ ABSL_GUARDED_BY(mu_);
  std::vector<Work*> idle_works_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> helped_{0};
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_COPY_HELPERS_H_
