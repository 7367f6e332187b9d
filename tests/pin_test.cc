// Pins through the handler, CPU backend (docs/prefix_cache.md, "Pins"):
// pinned pages survive eviction under pressure and live sequences read
// back bit for bit; a lease ends by itself and Unpin ends it early, both
// giving back every reference and charge; pins count against the tenant's
// max_pages (RESOURCE_EXHAUSTED naming it) and a renewal at the quota is
// not counted twice; another tenant's prefix is NOT_FOUND in the words of
// an unknown one; refusals name their field and change nothing.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN, kLayers = 2;

std::vector<uint32_t> Ids(int count, uint32_t seed) {
  std::vector<uint32_t> ids(count);
  for (int i = 0; i < count; ++i) ids[i] = (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 50000u;
  return ids;
}

// Tokens [0, count) of `kv` to every layer in one chunk each, with `ids`
// (none when null).
absl::Status Push(Handler& h, const std::string& seq, const Kv& kv, const std::vector<uint32_t>* ids, int first,
                  int count, const std::string& tenant = "") {
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::AppendChunk c = testing::ChunkOf(seq, l, first, count, kv);
    if (ids != nullptr) {
      for (int i = first; i < first + count; ++i) c.add_token_ids((*ids)[i]);
    }
    if (absl::Status st = h.Append(c, &r, tenant); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::PinResponse> Pin(Handler& h, const std::string& id, const std::vector<uint32_t>& ids,
                                    uint64_t tokens, double ttl, const std::string& tenant = "") {
  v1::PinRequest req;
  req.set_pin_id(id);
  for (uint32_t t : ids) req.add_prefix_token_ids(t);
  req.set_tokens(tokens);
  req.set_ttl_seconds(ttl);
  v1::PinResponse resp;
  if (absl::Status st = h.Pin(req, &resp, tenant); !st.ok()) return st;
  return resp;
}

absl::StatusOr<uint64_t> Unpin(Handler& h, const std::string& id, const std::string& tenant = "") {
  v1::UnpinRequest req;
  req.set_pin_id(id);
  v1::UnpinResponse resp;
  if (absl::Status st = h.Unpin(req, &resp, tenant); !st.ok()) return st;
  return resp.pages_unpinned();
}

absl::Status Release(Handler& h, const std::string& id, const std::string& tenant = "") {
  v1::ReleaseRequest req;
  req.set_sequence_id(id);
  v1::ReleaseResponse resp;
  return h.Release(req, &resp, tenant);
}

uint64_t LookupPages(Handler& h, const std::vector<uint32_t>& ids, const std::string& tenant = "") {
  v1::LookupRequest req;
  for (uint32_t id : ids) req.add_token_ids(id);
  v1::LookupResponse resp;
  EXPECT_TRUE(h.Lookup(req, &resp, tenant).ok());
  return resp.pages();
}

size_t Stride() {
  TestHandler probe(SmallOptions());
  return probe.h->pool().page_stride();
}

// A pool of 40 pages: a released sequence's pinned pages stay however
// hard another sequence pushes; its unpinned ones go; an Append is
// refused when only pinned pages are left; Unpin makes them evictable and
// every count returns to zero.
TEST(Pins, PinnedPagesAreNeverEvicted) {
  TestHandler t(SmallOptions(40 * Stride()));
  const Kv a = SyntheticKv(300, kN, 8), c = SyntheticKv(1000, kN, 10);
  const std::vector<uint32_t> ids_a = Ids(300, 8);
  ASSERT_TRUE(Push(*t.h, "a", a, &ids_a, 0, 300).ok());  // 8 pages per layer
  absl::StatusOr<v1::PinResponse> p = Pin(*t.h, "sys", ids_a, 128, 60);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tokens(), 128u);
  EXPECT_EQ(p->pages_pinned(), 8u);
  EXPECT_FALSE(p->replaced());
  EXPECT_EQ(p->expire_unix_ms(), absl::ToUnixMillis(t.now + absl::Seconds(60)));
  EXPECT_EQ(t.metrics.prefix_pinned_pages->Value(), 8.0);
  ASSERT_TRUE(Release(*t.h, "a").ok());
  // 16 pages in use (8 pinned, 8 cached only); c needs 32 pages, 24 are
  // free: the 8 cached go, never the pinned ones.
  ASSERT_TRUE(Push(*t.h, "c", c, nullptr, 0, 17 * 32).ok());
  EXPECT_EQ(t.h->prefix_index().evictions(), 8u);
  EXPECT_EQ(LookupPages(*t.h, ids_a), 4u);
  EXPECT_EQ(t.Stats().pages_in_use(), 40u);
  const std::string live_c = testing::ReadLayerBytes(*t.h, "c", 0);
  absl::Status st = Push(*t.h, "c", c, nullptr, 544, 64);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_EQ(LookupPages(*t.h, ids_a), 4u);
  EXPECT_TRUE(testing::ReadLayerBytes(*t.h, "c", 0) == live_c);
  // Unpinned, the pages are cache again: the next Append evicts them.
  absl::StatusOr<uint64_t> u = Unpin(*t.h, "sys");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(*u, 8u);
  EXPECT_EQ(t.metrics.prefix_pinned_pages->Value(), 0.0);
  ASSERT_TRUE(Push(*t.h, "c", c, nullptr, 544, 64).ok());
  EXPECT_LT(LookupPages(*t.h, ids_a), 4u);
  EXPECT_EQ(t.h->prefix_index().evictions(), 12u);
  ASSERT_TRUE(Release(*t.h, "c").ok());
  t.h->prefix_index().EvictAll();
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  for (PageId q = 0; q < 40; ++q) EXPECT_EQ(t.h->pool().references(q), 0) << q;
}

// The lease ends by itself (the reaper's ExpireIdle), giving back pages
// and charge; an expired pin is not found; a repeat renews.
TEST(Pins, ALeaseEndsByItselfAndARepeatRenewsIt) {
  TestHandler t(SmallOptions());
  const Kv a = SyntheticKv(200, kN, 3);
  const std::vector<uint32_t> ids = Ids(200, 3);
  ASSERT_TRUE(Push(*t.h, "a", a, &ids, 0, 200).ok());
  ASSERT_TRUE(Release(*t.h, "a").ok());
  ASSERT_TRUE(Pin(*t.h, "p", ids, 0, 10).ok());
  EXPECT_EQ(t.h->pins().pages(), 10);  // 5 pages per layer
  EXPECT_EQ(t.Stats().tenant_pages(), 10u);
  t.Advance(9);
  absl::StatusOr<v1::PinResponse> again = Pin(*t.h, "p", ids, 64, 10);  // renewed, and shortened
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->replaced());
  EXPECT_EQ(t.h->pins().pages(), 4);
  EXPECT_EQ(t.Stats().tenant_pages(), 4u);
  t.Advance(9);
  t.h->ExpireIdle();
  EXPECT_EQ(t.h->pins().pins(), 1);
  t.Advance(1);
  // Past its time, before the reaper: not live.
  EXPECT_EQ(Unpin(*t.h, "p").status().code(), C::kNotFound);
  t.h->ExpireIdle();
  EXPECT_EQ(t.h->pins().pins(), 0);
  EXPECT_EQ(t.h->pins().pages(), 0);
  EXPECT_EQ(t.Stats().tenant_pages(), 0u);
  EXPECT_EQ(t.h->prefix_index().EvictAll(), 10);
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
}

// Pins count against max_pages: past it RESOURCE_EXHAUSTED naming the
// quota and nothing changes; renewing a pin at the quota fits (its own
// pages are not counted twice). Another tenant's prefix and an unknown
// one are NOT_FOUND in the same words.
TEST(Pins, QuotasChargePinsAndTenantsSeeOnlyTheirOwn) {
  absl::StatusOr<ServiceOptions> o = testing::TenantOptions("pins", "", {"alice max_pages=20", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  const Kv a = SyntheticKv(300, kN, 5);
  const std::vector<uint32_t> ids = Ids(300, 5);
  ASSERT_TRUE(Push(*t.h, "a", a, &ids, 0, 300, "alice").ok());  // 16 pages charged
  ASSERT_TRUE(Release(*t.h, "a", "alice").ok());
  ASSERT_TRUE(Pin(*t.h, "p1", ids, 256, 60, "alice").ok());                      // 16
  EXPECT_TRUE(Pin(*t.h, "p1", ids, 256, 60, "alice").ok());                      // renewed at 16 of 20
  absl::StatusOr<v1::PinResponse> over = Pin(*t.h, "p2", ids, 96, 60, "alice");  // 6 more
  EXPECT_EQ(over.status().code(), C::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(over.status().message(), "pin_id \"p2\": tenant \"alice\" quota max_pages 20"))
      << over.status();
  EXPECT_EQ(t.h->pins().pins(), 1);
  EXPECT_EQ(t.h->pins().pages(), 16);
  ASSERT_TRUE(Pin(*t.h, "p2", ids, 64, 60, "alice").ok());  // 4 more: exactly 20
  absl::StatusOr<v1::PinResponse> bob = Pin(*t.h, "p1", ids, 0, 60, "bob");
  absl::StatusOr<v1::PinResponse> unknown = Pin(*t.h, "p1", Ids(300, 77), 0, 60, "bob");
  EXPECT_EQ(bob.status().code(), C::kNotFound);
  EXPECT_EQ(bob.status(), unknown.status());
  EXPECT_EQ(bob.status().message(),
            "no stored prefix of the prompt for pin_id \"p1\": page 0 (tokens [0, 32)) of layer 0 was never stored "
            "with token_ids by this tenant under this codec");
  // Bob cannot remove alice's pin either: it is not his.
  EXPECT_EQ(Unpin(*t.h, "p1", "bob").status().code(), C::kNotFound);
  EXPECT_TRUE(Unpin(*t.h, "p1", "alice").ok());
  EXPECT_TRUE(Unpin(*t.h, "p2", "alice").ok());
  EXPECT_EQ(t.h->pins().pages(), 0);
}

TEST(Pins, RefusalsNameTheFieldAndChangeNothing) {
  TestHandler t(SmallOptions());
  const Kv a = SyntheticKv(100, kN, 4);
  const std::vector<uint32_t> ids = Ids(100, 4);
  ASSERT_TRUE(Push(*t.h, "a", a, &ids, 0, 100).ok());
  EXPECT_EQ(Pin(*t.h, "", ids, 0, 10).status(),
            absl::InvalidArgumentError("pin_id has 0 bytes; it must have 1 to 256"));
  EXPECT_EQ(Pin(*t.h, "p", ids, 0, 0).status(),
            absl::InvalidArgumentError("ttl_seconds 0 is outside (0, 604800]; a pin needs a lease (repeat the Pin to "
                                       "renew)"));
  EXPECT_EQ(Pin(*t.h, "p", ids, 0, 1e9).status().code(), C::kInvalidArgument);
  EXPECT_EQ(Pin(*t.h, "p", ids, 33, 10).status(),
            absl::InvalidArgumentError("tokens 33 is not a multiple of page_tokens 32; it bounds the whole pages "
                                       "pinned (0: no bound)"));
  EXPECT_EQ(Pin(*t.h, "p", {1, 2, 3}, 0, 10).status().code(), C::kInvalidArgument);
  EXPECT_EQ(Unpin(*t.h, "p").status(),
            absl::NotFoundError("pin_id \"p\" is not a live pin (never made, removed, or its lease ended)"));
  EXPECT_EQ(t.h->pins().pins(), 0);
  const uint64_t in_use = t.Stats().pages_in_use();
  ASSERT_TRUE(Release(*t.h, "a").ok());
  EXPECT_EQ(t.h->prefix_index().EvictAll(), static_cast<int64_t>(in_use));
}

}  // namespace
}  // namespace driftkv
