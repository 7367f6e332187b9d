// Handler::WatchPages: the prefix index's stored / evicted events of the
// caller's tenant, in batches, for routers (service/page_events.h). The
// subscription lives exactly as long as the call.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"

namespace driftkv {

namespace {

constexpr uint32_t kDefaultBatch = 256, kMostBatch = 4096;
constexpr uint32_t kDefaultBuffer = 65536, kMostBuffer = 1u << 20;

}  // namespace

absl::Status Handler::WatchPages(const v1::WatchPagesRequest& request,
                                 const std::function<bool(const v1::PageEventBatch&)>& sink,
                                 const std::function<bool()>& stop, const std::string& tenant, absl::Duration poll) {
  if (request.max_batch() > kMostBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", request.max_batch(), " exceeds ", kMostBatch, " events per message"));
  }
  if (request.buffer_events() > kMostBuffer) {
    return absl::InvalidArgumentError(
        absl::StrCat("buffer_events ", request.buffer_events(), " exceeds ", kMostBuffer, " events"));
  }
  const size_t batch = request.max_batch() == 0 ? kDefaultBatch : request.max_batch();
  const size_t buffer = request.buffer_events() == 0 ? kDefaultBuffer : request.buffer_events();
  absl::StatusOr<std::shared_ptr<PageEvents::Subscriber>> sub = events_->Subscribe(NamespaceOf(tenant), buffer);
  if (!sub.ok()) return sub.status();
  std::vector<PageEvents::Event> events;
  v1::PageEventBatch message;
  absl::Status st;
  while (!stop()) {
    const uint64_t dropped = (*sub)->Take(poll, batch, &events);
    if (events.empty() && dropped == 0) continue;
    message.Clear();
    message.set_dropped(dropped);
    for (const PageEvents::Event& e : events) {
      v1::PageEvent* m = message.add_events();
      m->set_kind(e.stored ? v1::PAGE_STORED : v1::PAGE_EVICTED);
      m->set_page_key(std::string(e.key.view()));
      m->set_layer(static_cast<uint32_t>(e.layer));
    }
    if (!sink(message)) {
      st = absl::CancelledError("WatchPages: the client stopped reading");
      break;
    }
  }
  events_->Unsubscribe(*sub);
  return st.ok() ? absl::CancelledError("WatchPages: the call ended") : st;
}

}  // namespace driftkv
