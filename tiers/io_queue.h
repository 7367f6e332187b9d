// A bounded job queue served by a fixed pool of threads: the disk level's
// reads (tiers/disk_page_store.h), each a blocking pread, as many in flight
// as there are threads.
//
// BOUND. At most `capacity` jobs wait; Submit waits up to `wait` for room
// and then answers UNAVAILABLE naming the capacity. Jobs start in
// submission order; with several threads they may finish in any order.
#ifndef DRIFTKV_TIERS_IO_QUEUE_H_
#define DRIFTKV_TIERS_IO_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace driftkv {
namespace tiers {

class IoQueue {
 public:
  // threads >= 1, capacity >= 1.
  IoQueue(int threads, int capacity);
  // Runs every job already queued, then joins the threads.
  ~IoQueue();
  IoQueue(const IoQueue&) = delete;
  IoQueue& operator=(const IoQueue&) = delete;

  // Queues `job`, waiting at most `wait` for room: UNAVAILABLE "I/O queue
  // full" when there is none by then (the job is not run), FAILED_PRECONDITION
  // once the queue is shutting down.
  absl::Status Submit(std::function<void()> job, absl::Duration wait);
  // Waits until no job is queued or running.
  void Drain();
  int capacity() const { return capacity_; }
  // Jobs refused for want of room (a counter).
  uint64_t refused() const;

 private:
  void Loop();

  const int capacity_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_IO_QUEUE_H_
