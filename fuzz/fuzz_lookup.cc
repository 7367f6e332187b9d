// libFuzzer: Handler::Lookup (service/handler_lookup.cc) of a
// LookupRequest read from the input, then a Fork from the same prefix,
// against the handler of fuzz_handler.h to which sequence "p" was appended
// with token ids 0..47 on both layers (pages of 16 tokens, 2 sealed per
// layer, so the prefix index holds the prompt's first 2 pages). The first
// byte: bit 0 set asks for the prompt as page keys (ChainPageKeys of the
// request's token ids) instead of ids; the rest is the request's wire
// bytes. Checks: every input is answered OK or INVALID_ARGUMENT; an answer
// is consistent (pages = min over layers <= prompt pages, tokens = pages x
// 16, a miss reason iff a page is missing); ids and their keys get the
// same answer; a Fork from the prefix takes exactly the pages Lookup said
// (NOT_FOUND when none) without a new page, and its release gives them
// back; Lookup changes no count.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_handler.h"
#include "service/handler.h"
#include "service/page_key.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Handler& h = fuzz::FreshHandler();
  fuzz::SeedWithIds(h, "p");
  v1::LookupRequest req;
  if (!req.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  if ((data[0] & 1) != 0 && req.page_keys().empty()) {
    std::vector<PageKey> keys;
    ChainPageKeys(req.token_ids(), 16, &keys);
    req.clear_token_ids();
    for (const PageKey& k : keys) req.add_page_keys(std::string(k.view()));
    if (req.page_keys().empty()) return 0;
  }
  const v1::StatsResponse before = fuzz::StatsOf(h);
  v1::LookupResponse resp;
  const absl::Status st = h.Lookup(req, &resp);
  const v1::StatsResponse after = fuzz::StatsOf(h);
  if (after.pages_in_use() != before.pages_in_use() || after.sequences() != before.sequences()) __builtin_trap();
  if (!st.ok()) {
    if (st.code() != absl::StatusCode::kInvalidArgument) __builtin_trap();
    return 0;
  }
  if (resp.layer_pages_size() != 2) __builtin_trap();
  const uint64_t least = std::min(resp.layer_pages(0), resp.layer_pages(1));
  if (resp.pages() != least || resp.pages() > resp.prompt_pages() || resp.tokens() != resp.pages() * 16) {
    __builtin_trap();
  }
  if ((resp.miss_reason() == v1::MISS_NONE) != (resp.pages() == resp.prompt_pages())) __builtin_trap();
  if (resp.miss_reason() != v1::MISS_NONE && (resp.miss_page() != resp.pages() || resp.miss_message().empty())) {
    __builtin_trap();
  }
  if (!req.token_ids().empty()) {
    // The same prompt by its keys: the same answer.
    std::vector<PageKey> keys;
    ChainPageKeys(req.token_ids(), 16, &keys);
    if (!keys.empty()) {
      v1::LookupRequest by_keys;
      for (const PageKey& k : keys) by_keys.add_page_keys(std::string(k.view()));
      v1::LookupResponse again;
      if (!h.Lookup(by_keys, &again).ok() || again.SerializeAsString() != resp.SerializeAsString()) __builtin_trap();
    }
  }
  if (resp.prompt_pages() == 0) return 0;
  v1::ForkRequest f;
  f.set_sequence_id("lf");
  f.set_new_incarnation(true);  // released (tombstoned) by an earlier input
  *f.mutable_prefix_token_ids() = req.token_ids();
  *f.mutable_prefix_page_keys() = req.page_keys();
  v1::ForkResponse fr;
  const absl::Status forked = h.Fork(f, &fr);
  if (resp.pages() == 0) {
    if (forked.code() != absl::StatusCode::kNotFound) __builtin_trap();
    return 0;
  }
  if (!forked.ok() || fr.tokens() != resp.tokens() || fuzz::StatsOf(h).pages_in_use() != before.pages_in_use()) {
    __builtin_trap();
  }
  v1::ReleaseRequest rel;
  rel.set_sequence_id("lf");
  v1::ReleaseResponse rr;
  if (!h.Release(rel, &rr).ok()) __builtin_trap();
  if (fuzz::StatsOf(h).pages_in_use() != before.pages_in_use() || fuzz::StatsOf(h).sequences() != before.sequences()) {
    __builtin_trap();
  }
  return 0;
}
