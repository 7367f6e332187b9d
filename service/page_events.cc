#include "service/page_events.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace driftkv {

absl::StatusOr<std::shared_ptr<PageEvents::Subscriber>> PageEvents::Subscribe(const PageKey& ns, size_t capacity) {
  absl::MutexLock lock(&mu_);
  if (subscribers_.size() >= static_cast<size_t>(kMaxSubscribers)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("WatchPages has ", kMaxSubscribers, " subscribers, the most at once; close one and retry"));
  }
  auto s = std::make_shared<Subscriber>(ns, std::max<size_t>(capacity, 1));
  subscribers_.push_back(s);
  count_.store(static_cast<int>(subscribers_.size()));
  return s;
}

void PageEvents::Unsubscribe(const std::shared_ptr<Subscriber>& s) {
  absl::MutexLock lock(&mu_);
  subscribers_.erase(std::remove(subscribers_.begin(), subscribers_.end(), s), subscribers_.end());
  count_.store(static_cast<int>(subscribers_.size()));
}

void PageEvents::Publish(const PageKey& ns, const Event& event) {
  if (count_.load(std::memory_order_relaxed) == 0) return;
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Subscriber>& s : subscribers_) {
    if (!(s->ns_ == ns)) continue;
    absl::MutexLock q(&s->mu_);
    if (s->queue_.size() >= s->capacity_) {
      ++s->dropped_;
    } else {
      s->queue_.push_back(event);
    }
  }
}

uint64_t PageEvents::Subscriber::Take(absl::Duration timeout, size_t most, std::vector<Event>* out) {
  out->clear();
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&Subscriber::Ready, this), timeout);
  const size_t n = std::min(most, queue_.size());
  out->assign(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
  const uint64_t dropped = dropped_;
  dropped_ = 0;
  return dropped;
}

}  // namespace driftkv
