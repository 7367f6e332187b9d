// libFuzzer: request handling, proto bytes to the handler (CPU backend,
// small shape, a small pool). The first byte picks the method, the rest is
// that request's wire bytes: every input is answered with a status, never a
// crash, and the handler's invariants hold after it (Stats: pages in use
// within capacity). The handler is rebuilt every 4096 inputs so that state
// stays small.
#include <memory>
#include <string>

#include "fuzz/fuzz_handler.h"
#include "service/handler.h"

using namespace driftkv;

namespace {

std::unique_ptr<Metrics> g_metrics;
std::unique_ptr<Handler> g_handler;

Handler& Fresh() {
  static int uses = 0;
  if (g_handler == nullptr || ++uses % 4096 == 0) {
    g_handler.reset();
    g_metrics = std::make_unique<Metrics>();
    const ServiceOptions o = fuzz::FuzzOptions();
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, g_metrics.get());
    if (!h.ok()) std::abort();
    g_handler = *std::move(h);
  }
  return *g_handler;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Handler& h = Fresh();
  const uint8_t method = data[0] % 7;
  ++data;
  --size;
  switch (method) {
    case 0: {
      v1::AppendChunk c;
      if (!c.ParseFromArray(data, static_cast<int>(size))) return 0;
      v1::AppendResponse r;
      (void)h.Append(c, &r);
      break;
    }
    case 1: {
      v1::AttendRequest a;
      if (!a.ParseFromArray(data, static_cast<int>(size))) return 0;
      v1::AttendResponse r;
      (void)h.Attend(a, &r);
      break;
    }
    case 2: {
      v1::ReadRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(size))) return 0;
      if (q.token_count() == 0 || q.token_count() > 4096) q.set_token_count(64);  // bounded answers
      (void)h.Read(q, [](const v1::ReadChunk&) { return true; });
      break;
    }
    case 3: {
      v1::ReleaseRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(size))) return 0;
      v1::ReleaseResponse r;
      (void)h.Release(q, &r);
      break;
    }
    case 4: {
      v1::LengthRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(size))) return 0;
      v1::LengthResponse r;
      (void)h.Length(q, &r);
      break;
    }
    case 5: {
      v1::PrefetchRequest q;
      if (!q.ParseFromArray(data, static_cast<int>(size))) return 0;
      v1::PrefetchResponse r;
      (void)h.Prefetch(q, &r);
      break;
    }
    default: {
      h.ExpireIdle();
      break;
    }
  }
  v1::StatsResponse s;
  h.Stats(&s);
  if (s.pages_in_use() > s.capacity_pages() || s.sequences() > 16) __builtin_trap();
  return 0;
}
