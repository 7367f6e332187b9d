#include "backends/attend_batcher.h"

#include <utility>
#include <vector>

namespace driftkv {

void BatchingBackend::RunBatch(const std::deque<Call*>& batch) {
  if (batch.size() == 1) {
    inner_->Attend(batch.front()->jobs);
    if (observer_) observer_(1, static_cast<int>(batch.front()->jobs.size()));
    return;
  }
  std::vector<AttendJob> all;
  for (const Call* c : batch) all.insert(all.end(), c->jobs.begin(), c->jobs.end());
  inner_->Attend(absl::MakeSpan(all));
  size_t k = 0;
  for (Call* c : batch) {
    for (AttendJob& j : c->jobs) CopyAttendOutcome(all[k++], &j);
  }
  if (observer_) observer_(static_cast<int>(batch.size()), static_cast<int>(all.size()));
}

void BatchingBackend::Attend(absl::Span<AttendJob> jobs) {
  Call self{jobs};
  absl::MutexLock lock(&mu_);
  queue_.push_back(&self);
  // Wait until a batch that took this call has run, or the backend is free.
  std::pair<BatchingBackend*, Call*> arg(this, &self);
  mu_.Await(absl::Condition(
      +[](std::pair<BatchingBackend*, Call*>* a)
           ABSL_NO_THREAD_SAFETY_ANALYSIS { return a->second->done || !a->first->running_; },
      &arg));
  if (self.done) return;
  // Run everything queued (this call included) as one batch, then hand over:
  // a caller that queued meanwhile wakes and runs the next batch, so no
  // thread works on others' calls for longer than one batch.
  running_ = true;
  std::deque<Call*> batch;
  batch.swap(queue_);
  mu_.Unlock();
  RunBatch(batch);
  mu_.Lock();
  for (Call* c : batch) c->done = true;
  running_ = false;
}

}  // namespace driftkv
