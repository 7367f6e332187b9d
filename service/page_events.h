// Page stored / evicted events of the prefix index for routers
// (WatchPages RPC; docs/prefix_cache.md, "Events for routers").
//
// SCOPE. A subscriber names one namespace (its tenant's, under this
// codec: Handler::NamespaceOf) and sees only the events of entries of that
// namespace, so a client sees only its tenant's pages.
//
// BOUNDED BUFFERS. Each subscriber has a buffer of at most `capacity`
// events. Publish never blocks and never allocates past it: when the
// buffer is full the event is dropped and counted, and the subscriber's
// next Take reports the count (`dropped`, the overflow signal: its picture
// of the index has gaps; a router should rebuild it, e.g. with Lookup,
// and carry on). Memory per subscriber is thus at most capacity x
// sizeof(Event) (24 bytes) whatever the subscriber's speed.
//
// Locks: mu_ (the subscriber list) is taken under PrefixIndex::mu_
// (Publish) and is a leaf but for each subscriber's mu, taken under it.
#ifndef DRIFTKV_SERVICE_PAGE_EVENTS_H_
#define DRIFTKV_SERVICE_PAGE_EVENTS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "service/page_key.h"

namespace driftkv {

class PageEvents {
 public:
  // Most subscribers at once: each holds a server thread.
  static constexpr int kMaxSubscribers = 64;

  struct Event {
    bool stored = true;  // false: evicted
    int layer = 0;
    PageKey key;
  };
  class Subscriber {
   public:
    Subscriber(const PageKey& ns, size_t capacity) : ns_(ns), capacity_(capacity) {}
    // Waits up to `timeout` for an event or a drop, then moves up to `most`
    // events into *out (cleared first) and returns the events dropped since
    // the previous Take (0: none).
    uint64_t Take(absl::Duration timeout, size_t most, std::vector<Event>* out) ABSL_LOCKS_EXCLUDED(mu_);

   private:
    friend class PageEvents;
    // Take's condition. REQUIRES: mu_ held (Await evaluates it so).
    static bool Ready(Subscriber* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return !s->queue_.empty() || s->dropped_ > 0; }
    const PageKey ns_;
    const size_t capacity_;
    absl::Mutex mu_;
    std::deque<Event> queue_ ABSL_GUARDED_BY(mu_);
    uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  };

  // A subscriber of `ns` with a buffer of `capacity` (>= 1) events, until
  // Unsubscribe; RESOURCE_EXHAUSTED past kMaxSubscribers.
  absl::StatusOr<std::shared_ptr<Subscriber>> Subscribe(const PageKey& ns, size_t capacity) ABSL_LOCKS_EXCLUDED(mu_);
  void Unsubscribe(const std::shared_ptr<Subscriber>& s) ABSL_LOCKS_EXCLUDED(mu_);
  // Hands the event to every subscriber of `ns`; a few nanoseconds when
  // there are none.
  void Publish(const PageKey& ns, const Event& event) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<int> count_{0};  // subscribers, read without mu_ by Publish
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Subscriber>> subscribers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PAGE_EVENTS_H_
