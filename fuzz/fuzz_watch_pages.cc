// libFuzzer: Handler::WatchPages (service/handler_watch.cc) of a
// WatchPagesRequest read from the input, against the handler of
// fuzz_handler.h. While the call runs, its stop function (asked between
// polls, on the call's own thread) appends sequence "w" with token ids
// 1000..1047 on both layers (pages of 16 tokens: 2 sealed per layer),
// releases it and evicts every cached page: 4 pages stored, then 4
// evicted. Checks: sizes out of range are INVALID_ARGUMENT and anything
// else ends CANCELLED; no message has more events than max_batch (256 when
// 0) or none at all without a drop; events plus drops add up to exactly 8,
// in order (every stored before any evicted), with 16-byte keys and
// layers 0 or 1.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_handler.h"
#include "service/handler.h"

using namespace driftkv;

namespace {

constexpr uint64_t kEvents = 8;

void Churn(Handler& h) {
  fuzz::AppendWithIds(h, "w", 1000, /*new_incarnation=*/true);  // released by an earlier input
  v1::ReleaseRequest rel;
  rel.set_sequence_id("w");
  v1::ReleaseResponse rr;
  if (!h.Release(rel, &rr).ok()) __builtin_trap();
  h.prefix_index().EvictAll();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Handler& h = fuzz::FreshHandler();
  v1::WatchPagesRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const uint64_t most = req.max_batch() == 0 ? 256 : req.max_batch();
  uint64_t seen = 0, polls = 0;
  bool evicted = false;
  const absl::Status st = h.WatchPages(
      req,
      [&](const v1::PageEventBatch& b) {
        if (static_cast<uint64_t>(b.events_size()) > most) __builtin_trap();
        if (b.events_size() == 0 && b.dropped() == 0) __builtin_trap();
        for (const v1::PageEvent& e : b.events()) {
          if (e.page_key().size() != 16 || e.layer() > 1) __builtin_trap();
          if (e.kind() == v1::PAGE_EVICTED) evicted = true;
          if (e.kind() == v1::PAGE_STORED && evicted) __builtin_trap();
          if (e.kind() != v1::PAGE_STORED && e.kind() != v1::PAGE_EVICTED) __builtin_trap();
        }
        seen += static_cast<uint64_t>(b.events_size()) + b.dropped();
        return true;
      },
      [&] {
        if (polls++ == 0) Churn(h);
        return seen >= kEvents || polls > 1000;
      },
      "", absl::ZeroDuration());
  if (st.code() == absl::StatusCode::kInvalidArgument) {
    if (req.max_batch() <= 4096 && req.buffer_events() <= (1u << 20)) __builtin_trap();
    return 0;
  }
  if (st.code() != absl::StatusCode::kCancelled || seen != kEvents) __builtin_trap();
  return 0;
}
