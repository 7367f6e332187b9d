// The hot tier's cold copies through the handler, CPU backend
// (docs/hot_tier.md, "Cold copies"): a promotion keeps the layer's cold
// pages, the pool takes them back when it needs room, and a demotion gives
// the copies that still match their checksums back instead of coding the
// pages again; a corrupt copy is coded again, pages gained while hot are
// coded, copies off frees the cold pages at promotion; idle layers of one
// sequence have their copies checked together; reclaims race with moves.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/hot_tier_test_server.h"

namespace driftkv {
namespace {

// The fixture of tests/hot_tier_test_server.h, named as the tests name it.
using namespace hot_tier_test;  // NOLINT(build/namespaces)
using testing::SyntheticKv;

// The pool takes a hot layer's copies back when it needs room, and the
// layer's demotion then codes its pages: the same bytes the copies held.
TEST(HotTier, ColdCopiesGiveWayAndDemotionThenCodesTheSameBytes) {
  Server hot(PoolOf(2 * kPages)), cold(ColdOptions());
  const testing::Kv kv = SyntheticKv(kTokens, kN, 4);
  for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
  const std::string original = ColdBytes(*hot.h, "a", 0);
  ASSERT_EQ(original.size(), kPages * hot.h->pool().page_stride());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_EQ(hot.Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  // b fills the pool beside the copies; c needs their room.
  ASSERT_TRUE(hot.Push("b", 0, kv, 0, kTokens).ok());
  EXPECT_EQ(hot.Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  ASSERT_TRUE(hot.Push("c", 0, kv, 0, kTokens).ok());
  v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  EXPECT_EQ(hot.metrics.tier_cold_copies_reclaimed->Value(), kPages);
  EXPECT_EQ(Resident(s), 2u * kPages);
  v1::ReleaseRequest rel;
  rel.set_sequence_id("c");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(hot.h->Release(rel, &rr).ok());
  hot.Advance(61);
  hot.h->ExpireIdle();
  ASSERT_FALSE(hot.h->LayerIsHot("a", 0));
  s = hot.Stats();
  EXPECT_EQ(s.pages_demoted(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.pages_demoted_from_copies(), 0u);
  EXPECT_EQ(ColdBytes(*hot.h, "a", 0), original);
  ExpectSameAnswer(cold, hot, "a");
}

// A kept copy whose bytes changed under it (memory corruption) fails its
// checksum at demotion: it is counted, freed, and the layer's pages are
// coded from their hot form instead, so nothing corrupt comes back.
TEST(HotTier, ACorruptColdCopyIsCodedAgainInstead) {
  Server hot(HotOptions(16)), cold(ColdOptions());
  const testing::Kv kv = SyntheticKv(kTokens, kN, 4);
  for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
  const std::string original = ColdBytes(*hot.h, "a", 0);
  std::vector<PageId> pages;
  hot.h->WithLayerForTest("a", 0, [&](LayerState& l) { pages = l.pages; });
  ASSERT_EQ(pages.size(), static_cast<size_t>(kPages));
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  ASSERT_EQ(hot.Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  hot.h->pool().page(pages[2])[100] ^= 0x10;  // a copy, not the layer's hot page
  const uint64_t failures = hot.Stats().checksum_failures();
  hot.Advance(61);
  hot.h->ExpireIdle();
  ASSERT_FALSE(hot.h->LayerIsHot("a", 0));
  const v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.checksum_failures(), failures + 1);
  EXPECT_EQ(s.pages_demoted_from_copies(), 0u);
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  EXPECT_EQ(Resident(s), static_cast<uint64_t>(kPages));
  EXPECT_EQ(ColdBytes(*hot.h, "a", 0), original);
  ExpectSameAnswer(cold, hot, "a");
}

// Pages a hot layer gained after its promotion have no copy: its demotion
// takes the copies back for the first pages and codes the new ones.
TEST(HotTier, DemotionCodesOnlyThePagesWithoutACopy) {
  Server hot(HotOptions(16)), cold(ColdOptions());
  const testing::Kv kv = SyntheticKv(kTokens + 2 * kP, kN, 9);
  for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push("a", 0, kv, kTokens, 2 * kP).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_EQ(hot.Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), kPages + 2u);
  hot.Advance(61);
  hot.h->ExpireIdle();
  ASSERT_FALSE(hot.h->LayerIsHot("a", 0));
  const v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.pages_demoted(), kPages + 2u);
  EXPECT_EQ(s.pages_demoted_from_copies(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(Resident(s), kPages + 2u);
  EXPECT_EQ(ColdBytes(*hot.h, "a", 0), ColdBytes(*cold.h, "a", 0));
  EXPECT_EQ(hot.Read("a", 0), cold.Read("a", 0));
  ExpectSameAnswer(cold, hot, "a");
}

// A sequence's idle layers demote together, their copies summed in one
// backend call: a corrupt copy of one layer has that layer coded again,
// and the other layer still gives its copies back.
TEST(HotTier, IdleLayersOfASequenceCheckTheirCopiesTogether) {
  Server hot(HotOptions(16)), cold(ColdOptions());
  std::vector<std::string> original;
  ASSERT_NO_FATAL_FAILURE(PushTwoLayers(hot, cold, "a", 40, &original));
  std::vector<PageId> pages;
  hot.h->WithLayerForTest("a", 1, [&](LayerState& l) { pages = l.pages; });
  ASSERT_EQ(pages.size(), static_cast<size_t>(kPages));
  ASSERT_TRUE(hot.Attend({{"a", 0}, {"a", 1}}, 7).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("a", 0) && hot.h->LayerIsHot("a", 1));
  ASSERT_EQ(hot.Stats().cold_copy_pages(), 2u * kPages);
  hot.h->pool().page(pages[1])[200] ^= 0x01;  // a copy of layer 1
  const uint64_t failures = hot.Stats().checksum_failures();
  hot.Advance(61);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_FALSE(hot.h->LayerIsHot("a", 1));
  const v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.checksum_failures(), failures + 1);
  EXPECT_EQ(s.pages_demoted(), 2u * kPages);
  EXPECT_EQ(s.pages_demoted_from_copies(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  EXPECT_EQ(Resident(s), 2u * kPages);
  for (uint32_t layer : {0u, 1u}) EXPECT_EQ(ColdBytes(*hot.h, "a", layer), original[layer]) << layer;
  ExpectSameAnswer(cold, hot, "a", 2);
}

// hot_keep_cold_copies false: a promotion frees the cold pages, as before.
TEST(HotTier, WithoutCopiesPromotionFreesTheColdPages) {
  ServiceOptions o = HotOptions(16);
  o.hot_keep_cold_copies = false;
  Server hot(o);
  ASSERT_TRUE(hot.Push("a", 0, SyntheticKv(kTokens, kN, 4), 0, kTokens).ok());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.pages_in_use(), 0u);
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  hot.Advance(61);
  hot.h->ExpireIdle();
  s = hot.Stats();
  EXPECT_EQ(s.pages_in_use(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.pages_demoted_from_copies(), 0u);
}

// The same with a cold pool two pages short of holding the three
// sequences and a fourth that a fifth thread pushes and releases over and
// over: its pages come from the hot layers' cold copies (reclaimed while
// layers move), and when none are left its push may be refused; every
// Attend still answers, bit for bit.
TEST(HotTier, ConcurrentReclaimOfCopiesWhileLayersMove) {
  ServiceOptions o = PoolOf(3 * kPages + kPages - 2);
  o.hot_tier_bytes = 2 * kPages * LevelPageBytes();
  o.backend_threads = 2;
  Server cold(ColdOptions()), hot(o);
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::vector<Answer> want;
  ASSERT_NO_FATAL_FAILURE(PushThree(ids, cold, hot, &want));
  const testing::Kv extra = SyntheticKv(kTokens, kN, 30);
  // Once before the threads: a's copies make the room for x.
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  ASSERT_EQ(hot.Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  ASSERT_TRUE(hot.Push("x", 0, extra, 0, kTokens).ok());
  EXPECT_EQ(hot.metrics.tier_cold_copies_reclaimed->Value(), kPages);
  {
    v1::ReleaseRequest rel;
    rel.set_sequence_id("x");
    v1::ReleaseResponse rr;
    ASSERT_TRUE(hot.h->Release(rel, &rr).ok());
  }
  std::atomic<int> pushed{0}, refused{0}, push_errors{0};
  std::atomic<bool> done{false};
  std::string push_error;  // the first unexpected one
  std::thread pusher([&] {
    for (int i = 0; !done.load(); ++i) {
      const std::string id = absl::StrCat("x", i);
      const absl::Status st = hot.Push(id, 0, extra, 0, kTokens);
      if (st.ok()) {
        ++pushed;
      } else if (absl::IsResourceExhausted(st)) {
        ++refused;
      } else if (push_errors++ == 0) {
        push_error = st.ToString();
      }
      v1::ReleaseRequest rel;
      rel.set_sequence_id(id);
      v1::ReleaseResponse rr;
      hot.h->Release(rel, &rr).IgnoreError();
    }
  });
  AttendFromFourThreads(hot, ids, want);
  done = true;
  pusher.join();
  EXPECT_EQ(push_errors.load(), 0) << push_error;
  EXPECT_GT(pushed.load() + refused.load(), 0);
  const v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.hot_pages_in_use() + Resident(s), 3u * kPages);
  EXPECT_LE(s.cold_copy_pages(), s.hot_pages_in_use());
  EXPECT_LE(s.pages_in_use(), static_cast<uint64_t>(4 * kPages - 2));
  for (int k = 0; k < 3; ++k) {
    absl::StatusOr<Answer> got = hot.Attend1(ids[k], 0);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == want[k]) << ids[k];
  }
}

}  // namespace
}  // namespace driftkv
