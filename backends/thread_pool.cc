#include "backends/thread_pool.h"

namespace driftkv {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::Run(Loop* loop) {
  for (int i = loop->next.fetch_add(1); i < loop->n; i = loop->next.fetch_add(1)) {
    (*loop->fn)(i);
    if (loop->remaining.fetch_sub(1) == 1) loop->done.Notify();
  }
}

void ThreadPool::ParallelFor(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty()) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  auto loop = std::make_shared<Loop>();
  loop->fn = &fn;
  loop->n = n;
  loop->remaining = n;
  {
    absl::MutexLock lock(&mu_);
    queue_.push_back(loop);
  }
  Run(loop.get());
  loop->done.WaitForNotification();
}

void ThreadPool::Work() {
  for (;;) {
    std::shared_ptr<Loop> loop;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->queue_.empty(); }, this));
      if (queue_.empty()) return;  // stop_ and nothing left
      loop = queue_.front();
      if (loop->next.load() >= loop->n) {
        // Every index is claimed; whoever runs the last ones finishes it.
        queue_.pop_front();
        continue;
      }
    }
    Run(loop.get());
  }
}

}  // namespace driftkv
