// libFuzzer: Handler::Fork (service/handler_fork.cc) of a ForkRequest read
// from the input, against the handler of fuzz_handler.h (sequence "s",
// kFuzzTokens tokens per layer, pages of 16 tokens). The first byte says
// what happens to a fork that was made:
//   bits 0-1  0: released at once; 1: a few tokens appended, then
//             released; 2: attended, then released; 3: kept (a later input
//             may fork it again; the handler is rebuilt every 4096 uses)
// the rest is the ForkRequest's wire bytes. Checks: every input is
// answered with a status; a refused Fork changes no count; a fork takes no
// page of the pool and reads back, layer by layer, as its source's first
// `tokens` tokens; releasing it gives back every page it added.
#include <cstdint>
#include <string>

#include "fuzz/fuzz_handler.h"
#include "service/handler.h"

using namespace driftkv;

namespace {

// Tokens [0, count) of one layer as Read answers them ("" on an error).
std::string Prefix(Handler& h, const std::string& id, uint32_t layer, uint64_t count) {
  v1::ReadRequest r;
  r.set_sequence_id(id);
  r.set_layer(layer);
  r.set_token_count(count);
  r.set_dtype(v1::DTYPE_BF16);
  std::string all;
  absl::Status st = h.Read(r, [&](const v1::ReadChunk& c) {
    all += c.keys();
    all += c.values();
    return true;
  });
  return st.ok() ? all : "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Handler& h = fuzz::FreshHandler();
  const int then = data[0] & 3;
  v1::ForkRequest req;
  if (!req.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  const v1::StatsResponse before = fuzz::StatsOf(h);
  v1::ForkResponse resp;
  const absl::Status st = h.Fork(req, &resp);
  const v1::StatsResponse after = fuzz::StatsOf(h);
  if (after.pages_in_use() != before.pages_in_use()) __builtin_trap();  // shared, never copied
  if (!st.ok()) {
    if (after.sequences() != before.sequences() || after.tokens_compressed() != before.tokens_compressed() ||
        after.tenant_bytes() != before.tenant_bytes() || after.tenant_pages() != before.tenant_pages()) {
      __builtin_trap();
    }
    return 0;
  }
  const std::string& id = req.sequence_id();
  // A fork from a prefix (fuzz_lookup covers those) has no source to read.
  for (uint32_t layer = 0; layer < 2 && !req.source_sequence_id().empty(); ++layer) {
    const std::string got = Prefix(h, id, layer, req.tokens());
    if (got.empty() || got != Prefix(h, req.source_sequence_id(), layer, req.tokens())) __builtin_trap();
  }
  if (then == 1) {
    v1::AppendChunk c;
    c.set_sequence_id(id);
    c.set_first_token(req.tokens());
    c.set_token_count(20);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(std::string(20 * 64 * 2, '\x3d'));
    c.set_values(std::string(20 * 64 * 2, '\x3a'));
    v1::AppendResponse r;
    (void)h.Append(c, &r);
  } else if (then == 2) {
    v1::AttendRequest a;
    v1::AttendItem* it = a.add_items();
    it->set_sequence_id(id);
    it->set_dtype(v1::DTYPE_BF16);
    it->set_q_heads(1);
    it->set_query(std::string(64 * 2, '\x3c'));
    v1::AttendResponse r;
    (void)h.Attend(a, &r);
  }
  if (then != 3) {
    v1::ReleaseRequest rel;
    rel.set_sequence_id(id);
    v1::ReleaseResponse r;
    if (!h.Release(rel, &r).ok()) __builtin_trap();
    const v1::StatsResponse released = fuzz::StatsOf(h);
    if (released.pages_in_use() != before.pages_in_use() || released.sequences() != before.sequences() ||
        released.tenant_bytes() != before.tenant_bytes()) {
      __builtin_trap();
    }
  }
  if (after.pages_in_use() > after.capacity_pages() || after.sequences() > 16) __builtin_trap();
  return 0;
}
