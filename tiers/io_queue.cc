#include "tiers/io_queue.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace tiers {

IoQueue::IoQueue(int threads, int capacity) : capacity_(capacity < 1 ? 1 : capacity) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) threads_.emplace_back([this] { Loop(); });
}

IoQueue::~IoQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

absl::Status IoQueue::Submit(std::function<void()> job, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  auto room = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || static_cast<int>(jobs_.size()) < capacity_; };
  mu_.AwaitWithTimeout(absl::Condition(&room), wait);
  if (stop_) return absl::FailedPreconditionError("I/O queue is shutting down");
  if (static_cast<int>(jobs_.size()) >= capacity_) {
    ++refused_;
    return absl::UnavailableError(
        absl::StrCat("I/O queue full: ", capacity_, " jobs waiting for ", absl::FormatDuration(wait)));
  }
  jobs_.push_back(std::move(job));
  return absl::OkStatus();
}

void IoQueue::Drain() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty() && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

uint64_t IoQueue::refused() const {
  absl::MutexLock lock(&mu_);
  return refused_;
}

void IoQueue::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (jobs_.empty()) return;  // stopping, nothing left
      job = std::move(jobs_.front());
      jobs_.pop_front();
      ++running_;
    }
    job();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace tiers
}  // namespace driftkv
