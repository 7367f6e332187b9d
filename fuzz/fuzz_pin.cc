// libFuzzer: Handler::Pin (service/handler_pin.cc) of a PinRequest read
// from the input, then Unpin, against the handler of fuzz_handler.h to
// which sequence "q" was appended with token ids 0..47 on both layers
// (pages of 16 tokens, 2 sealed per layer). The input is the request's
// wire bytes. Checks: every input is answered OK, INVALID_ARGUMENT or
// NOT_FOUND (never a crash, never another code); an OK pin holds exactly
// the pages Lookup of the same prompt says are held (at most `tokens`),
// takes no new page, and its Unpin (or, for a lease already over, the
// reaper) gives every reference and charge back;
// a refused Pin leaves no pin; after each input no pin is left.
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_handler.h"
#include "service/handler.h"

using namespace driftkv;

namespace {

constexpr int kIdTokens = 48;

v1::StatsResponse StatsOf(Handler& h) {
  v1::StatsResponse s;
  h.Stats(&s);
  return s;
}

void Seed(Handler& h) {
  static const Handler* seeded = nullptr;
  if (seeded == &h) return;
  seeded = &h;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    v1::AppendChunk c;
    c.set_sequence_id("q");
    c.set_layer(layer);
    c.set_token_count(kIdTokens);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(std::string(kIdTokens * 64 * 2, '\x3d'));
    c.set_values(std::string(kIdTokens * 64 * 2, '\x3a'));
    for (int i = 0; i < kIdTokens; ++i) c.add_token_ids(i);
    v1::AppendResponse r;
    if (!h.Append(c, &r).ok()) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Handler& h = fuzz::FreshHandler();
  Seed(h);
  v1::PinRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const v1::StatsResponse before = StatsOf(h);
  v1::PinResponse resp;
  const absl::Status st = h.Pin(req, &resp);
  if (!st.ok()) {
    if (st.code() != absl::StatusCode::kInvalidArgument && st.code() != absl::StatusCode::kNotFound) __builtin_trap();
    if (h.pins().pins() != 0 || h.pins().pages() != 0) __builtin_trap();
    return 0;
  }
  if (StatsOf(h).pages_in_use() != before.pages_in_use()) __builtin_trap();
  v1::LookupRequest l;
  *l.mutable_token_ids() = req.prefix_token_ids();
  *l.mutable_page_keys() = req.prefix_page_keys();
  v1::LookupResponse lr;
  if (!h.Lookup(l, &lr).ok()) __builtin_trap();
  uint64_t expected = lr.tokens();
  if (req.tokens() != 0) expected = std::min(expected, req.tokens());
  if (resp.tokens() != expected || resp.pages_pinned() != expected / 16 * 2) __builtin_trap();
  if (h.pins().pages() != static_cast<int64_t>(resp.pages_pinned())) __builtin_trap();
  v1::UnpinRequest u;
  u.set_pin_id(req.pin_id());
  v1::UnpinResponse ur;
  const absl::Status unpinned = h.Unpin(u, &ur);
  if (unpinned.code() == absl::StatusCode::kNotFound) {
    // A lease as short as a nanosecond may end before the Unpin: then the
    // pin is not live, and the reaper removes it.
    if (resp.expire_unix_ms() > absl::ToUnixMillis(absl::Now()) + 1) __builtin_trap();
    h.ExpireIdle();
  } else if (!unpinned.ok() || ur.pages_unpinned() != resp.pages_pinned()) {
    __builtin_trap();
  }
  if (h.pins().pins() != 0 || h.pins().pages() != 0) __builtin_trap();
  if (StatsOf(h).pages_in_use() != before.pages_in_use() || StatsOf(h).tenant_pages() != before.tenant_pages()) {
    __builtin_trap();
  }
  return 0;
}
