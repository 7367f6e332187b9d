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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Handler& h = fuzz::FreshHandler();
  fuzz::SeedWithIds(h, "q");
  v1::PinRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  const v1::StatsResponse before = fuzz::StatsOf(h);
  v1::PinResponse resp;
  const absl::Status st = h.Pin(req, &resp);
  if (!st.ok()) {
    if (st.code() != absl::StatusCode::kInvalidArgument && st.code() != absl::StatusCode::kNotFound) __builtin_trap();
    if (h.pins().pins() != 0 || h.pins().pages() != 0) __builtin_trap();
    return 0;
  }
  if (fuzz::StatsOf(h).pages_in_use() != before.pages_in_use()) __builtin_trap();
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
  if (fuzz::StatsOf(h).pages_in_use() != before.pages_in_use() ||
      fuzz::StatsOf(h).tenant_pages() != before.tenant_pages()) {
    __builtin_trap();
  }
  return 0;
}
