// A fixed set of worker threads shared by all calls of a backend, so that
// concurrent RPCs do not each spawn their own threads.
//
// ParallelFor(n, fn) runs fn(0..n-1) and returns when all have run. The
// calling thread works on its own loop too, so a call always makes progress
// even when every worker is busy with other calls; idle workers join the
// oldest loop first (FIFO). fn must not call ParallelFor on the same pool.
#ifndef DRIFTKV_BACKENDS_THREAD_POOL_H_
#define DRIFTKV_BACKENDS_THREAD_POOL_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace driftkv {

class ThreadPool {
 public:
  // `threads` counts the caller: threads - 1 workers are started.
  explicit ThreadPool(int threads);
  ~ThreadPool();  // finishes queued loops, then joins the workers

  void ParallelFor(int n, const std::function<void(int)>& fn);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  struct Loop {
    const std::function<void(int)>* fn = nullptr;  // lives until `done`
    int n = 0;
    std::atomic<int> next{0};
    std::atomic<int> remaining{0};
    absl::Notification done;
  };
  // Claims and runs indices of `loop` until none is left.
  static void Run(Loop* loop);
  void Work();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Loop>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_THREAD_POOL_H_
