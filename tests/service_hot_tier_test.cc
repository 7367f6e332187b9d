// The hot tier through the handler, CPU backend (docs/hot_tier.md,
// "Service"): Attend and Read give the same bits from either tier (against a
// handler without a hot tier fed the same tokens), before promotion, after
// it and after a demotion and a second promotion; per-tier accounting;
// least-recently-attended demotion when the budget is short; idle demotion
// on an injected clock; Append into a hot layer (the page goes hot, other
// layers demote for it, or the layer itself does); async promotion; WUSH
// transforms; concurrent Attends while layers move. The hot tier's
// config: tests/service_hot_tier_config_test.cc.
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "codec/dquant_kv_codec.h"
#include "codec/level_page.h"
#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/hot_tier_test_server.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

// The fixture of tests/hot_tier_test_server.h, named as the tests name it.
using namespace hot_tier_test;  // NOLINT(build/namespaces)
using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

TEST(HotTier, AttendBitIdenticalColdHotAndAfterDemoteRepromote) {
  Server cold(ColdOptions()), hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 1);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("a", 1, kv, 0, kTokens).ok());
  EXPECT_FALSE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(Resident(hot.Stats()), static_cast<uint64_t>(kPages));
  absl::StatusOr<Answer> want = cold.Attend1("a", 1);
  ASSERT_TRUE(want.ok()) << want.status();
  // Sync: the first Attend promotes, then attends the level pages.
  absl::StatusOr<Answer> first = hot.Attend1("a", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
  EXPECT_TRUE(*first == *want);
  absl::StatusOr<Answer> again = hot.Attend1("a", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == *want);
  // Idle demotion, then promotion again: still the same bits.
  hot.Advance(61);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 1));
  absl::StatusOr<Answer> cold_again = hot.Attend1("a", 1);  // promotes again
  ASSERT_TRUE(cold_again.ok());
  EXPECT_TRUE(*cold_again == *want);
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(hot.Stats().promotions(), 2u);
  EXPECT_EQ(hot.Stats().demotions(), 1u);
  // And a different query, for good measure.
  absl::StatusOr<Answer> other_cold = cold.Attend1("a", 1, 99), other_hot = hot.Attend1("a", 1, 99);
  ASSERT_TRUE(other_cold.ok() && other_hot.ok());
  EXPECT_TRUE(*other_cold == *other_hot);
  EXPECT_FALSE(*other_hot == *want);
}

// driftkv_attention_items_by_route_total: the CPU backend's cold items
// are "cold_host", a hot layer's "hot" (its first Attend promotes first).
TEST(HotTier, ItemsCountedByRoute) {
  Server cold(ColdOptions()), hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 1);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("a", 1, kv, 0, kTokens).ok());
  auto count = [](const Server& s, AttendRoute r) {
    return s.metrics.attention_items_by_route[static_cast<int>(r)]->Value();
  };
  for (int rep = 0; rep < 2; ++rep) {
    ASSERT_TRUE(cold.Attend1("a", 1).ok());
    ASSERT_TRUE(hot.Attend1("a", 1).ok());
  }
  EXPECT_EQ(count(cold, AttendRoute::kColdHost), 2);
  EXPECT_EQ(count(cold, AttendRoute::kHot), 0);
  EXPECT_EQ(count(hot, AttendRoute::kHot), 2);
  EXPECT_EQ(count(hot, AttendRoute::kColdHost), 0);
  EXPECT_EQ(count(hot, AttendRoute::kColdLevels) + count(hot, AttendRoute::kColdFused), 0);
  EXPECT_EQ(cold.metrics.attention_items->Value(), 2);
}

// 20 pages and 4 threads: one item is split over its pages (split-KV) and
// the parts merged; the hot path must split and merge the same way.
TEST(HotTier, SplitKvBitIdentical) {
  ServiceOptions co = ColdOptions(), ho = HotOptions(24);
  co.backend_threads = ho.backend_threads = 4;
  Server cold(co), hot(ho);
  const int tokens = 20 * kP + kR + 5;
  const testing::Kv kv = SyntheticKv(tokens, kN, 2);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("long", 0, kv, 0, tokens, 400).ok());
  absl::StatusOr<Answer> want = cold.Attend1("long", 0), got = hot.Attend1("long", 0);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(hot.h->LayerIsHot("long", 0));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 20u);
  EXPECT_TRUE(*got == *want);
}

TEST(HotTier, ReadIdenticalFromBothTiers) {
  Server cold(ColdOptions()), hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 3);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("r", 0, kv, 0, kTokens).ok());
  const std::string want = cold.Read("r", 0);
  ASSERT_EQ(want.size(), 2u * kTokens * kN * sizeof(float));
  EXPECT_EQ(hot.Read("r", 0), want);  // cold
  ASSERT_TRUE(hot.Attend1("r", 0).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("r", 0));
  EXPECT_EQ(hot.Read("r", 0), want);  // hot
  // A read starting inside a page and spanning several, from the hot tier.
  v1::ReadRequest req;
  req.set_sequence_id("r");
  req.set_layer(0);
  req.set_first_token(100);
  req.set_token_count(300);
  std::string part[2];
  Server* servers[2] = {&cold, &hot};
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(servers[i]
                    ->h
                    ->Read(req,
                           [&](const v1::ReadChunk& c) {
                             part[i] += c.keys() + c.values();
                             return true;
                           })
                    .ok());
  }
  EXPECT_EQ(part[1], part[0]);
  EXPECT_EQ(part[0].size(), 2u * 300 * kN * sizeof(float));
  hot.Advance(61);
  hot.h->ExpireIdle();
  ASSERT_FALSE(hot.h->LayerIsHot("r", 0));
  EXPECT_EQ(hot.Read("r", 0), want);  // cold again (demoted)
}

TEST(HotTier, PoolAccountingPerTier) {
  Server hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 4);
  ASSERT_TRUE(hot.Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Push("a", 1, kv, 0, kTokens).ok());
  v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(Resident(s), 2u * kPages);
  EXPECT_EQ(s.hot_pages_in_use(), 0u);
  EXPECT_EQ(s.hot_capacity_pages(), 16u);
  EXPECT_EQ(s.hot_capacity_bytes(), 16 * LevelPageBytes());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  s = hot.Stats();
  EXPECT_EQ(Resident(s), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.hot_pages_in_use(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.hot_bytes_in_use(), kPages * LevelPageBytes());
  EXPECT_EQ(s.hot_layers(), 1u);
  EXPECT_EQ(s.promotions(), 1u);
  EXPECT_EQ(s.pages_promoted(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.tokens_compressed(), 2u * kPages * kP);  // tokens do not move
  // The promoted layer's cold pages stay as its copies, charged to no one.
  EXPECT_EQ(s.cold_copy_pages(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.cold_copy_bytes(), kPages * s.bytes_in_use() / s.pages_in_use());
  EXPECT_EQ(s.pages_in_use(), 2u * kPages);
  EXPECT_EQ(hot.metrics.tier_cold_copies->Value(), kPages);
  hot.Advance(61);
  hot.h->ExpireIdle();
  s = hot.Stats();
  EXPECT_EQ(Resident(s), 2u * kPages);
  EXPECT_EQ(s.hot_pages_in_use(), 0u);
  EXPECT_EQ(s.hot_layers(), 0u);
  EXPECT_EQ(s.demotions(), 1u);
  EXPECT_EQ(s.pages_demoted(), static_cast<uint64_t>(kPages));
  // ... and the demotion took them back instead of coding the pages.
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  EXPECT_EQ(s.pages_demoted_from_copies(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(hot.metrics.tier_pages_demoted_from_copies->Value(), kPages);
  ASSERT_TRUE(hot.Attend({{"a", 0}, {"a", 1}}, 5).ok());
  s = hot.Stats();
  EXPECT_EQ(Resident(s), 0u);
  EXPECT_EQ(s.cold_copy_pages(), 2u * kPages);
  EXPECT_EQ(s.hot_pages_in_use(), 2u * kPages);
  EXPECT_EQ(s.hot_layers(), 2u);
  v1::ReleaseRequest rel;
  rel.set_sequence_id("a");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(hot.h->Release(rel, &rr).ok());
  EXPECT_EQ(rr.pages_freed(), 2u * kPages);
  s = hot.Stats();
  EXPECT_EQ(s.pages_in_use(), 0u);  // the copies went with the sequence
  EXPECT_EQ(s.cold_copy_pages(), 0u);
  EXPECT_EQ(s.hot_pages_in_use(), 0u);
  EXPECT_EQ(s.hot_layers(), 0u);
  // Info reports the tier.
  v1::InfoResponse info;
  hot.h->Info(&info);
  EXPECT_TRUE(info.hot_tier());
  EXPECT_EQ(info.hot_page_bytes(), LevelPageBytes());
  EXPECT_EQ(info.hot_capacity_pages(), 16u);
  EXPECT_EQ(info.hot_capacity_bytes(), 16 * LevelPageBytes());
  EXPECT_EQ(info.hot_promotion(), "sync");
  EXPECT_EQ(info.hot_idle_seconds(), 60.0);
  EXPECT_TRUE(info.hot_keep_cold_copies());
  Server cold(ColdOptions());
  v1::InfoResponse cold_info;
  cold.h->Info(&cold_info);
  EXPECT_FALSE(cold_info.hot_tier());
  EXPECT_EQ(cold_info.hot_capacity_bytes(), 0u);
}

// Length counts a layer's tokens the same in either tier.

TEST(HotTier, LengthIsTheSameInBothTiers) {
  Server hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 8);
  ASSERT_TRUE(hot.Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Push("a", 1, kv, 0, 100).ok());
  v1::LengthRequest req;
  req.set_sequence_id("a");
  auto length = [&] {
    v1::LengthResponse r;
    EXPECT_TRUE(hot.h->Length(req, &r).ok());
    return r.DebugString();
  };
  const std::string cold = length();
  v1::LengthResponse r;
  ASSERT_TRUE(hot.h->Length(req, &r).ok());
  EXPECT_EQ(r.layers(0).tokens(), static_cast<uint64_t>(kTokens));
  EXPECT_EQ(r.layers(0).compressed_tokens(), static_cast<uint64_t>(kPages * kP));
  EXPECT_EQ(r.layers(1).window_tokens(), 100u);
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_EQ(length(), cold);
}

// Budget for two sequences of 4 pages, three attended in turn: the least
// recently attended one goes cold each time, and answers never change.
TEST(HotTier, LruDemotionWhenBudgetShort) {
  Server cold(ColdOptions()), hot(HotOptions(2 * kPages));
  const std::vector<std::string> ids = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    const testing::Kv kv = SyntheticKv(kTokens, kN, 10 + i);
    for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push(ids[i], 0, kv, 0, kTokens).ok());
  }
  auto attend = [&](const std::string& id) {
    hot.Advance(1);
    absl::StatusOr<Answer> want = cold.Attend1(id, 0), got = hot.Attend1(id, 0);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_TRUE(*got == *want) << id;
  };
  attend("a");
  attend("b");
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  attend("c");  // a is the least recently attended
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("c", 0));
  attend("b");
  attend("a");  // now c is
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  EXPECT_FALSE(hot.h->LayerIsHot("c", 0));
  v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.hot_pages_in_use(), 2u * kPages);
  EXPECT_EQ(Resident(s), static_cast<uint64_t>(kPages));
  EXPECT_EQ(s.promotions(), 4u);
  EXPECT_EQ(s.demotions(), 2u);
  EXPECT_EQ(hot.metrics.tier_demotions[kDemoteBudget]->Value(), 2);
  // A batch of all three: the batch's own layers are never demoted for each
  // other, so one stays cold and is attended cold, with the same answer.
  hot.Advance(1);
  absl::StatusOr<std::vector<Answer>> want = cold.Attend({{"a", 0}, {"b", 0}, {"c", 0}}, 3);
  absl::StatusOr<std::vector<Answer>> got = hot.Attend({{"a", 0}, {"b", 0}, {"c", 0}}, 3);
  ASSERT_TRUE(want.ok() && got.ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE((*got)[i] == (*want)[i]) << i;
  EXPECT_FALSE(hot.h->LayerIsHot("c", 0));
  EXPECT_GE(hot.metrics.tier_promotions_skipped->Value(), 1);
}

TEST(HotTier, IdleDemotionWithInjectedClock) {
  ServiceOptions o = HotOptions(16);
  o.hot_idle_seconds = 30;
  Server hot(o);
  const testing::Kv kv = SyntheticKv(kTokens, kN, 5);
  ASSERT_TRUE(hot.Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Push("b", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  hot.Advance(20);
  ASSERT_TRUE(hot.Attend1("b", 0).ok());
  hot.Advance(20);                    // a idle 40 s, b 20 s
  EXPECT_EQ(hot.h->ExpireIdle(), 0);  // no TTL: nothing expires
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  EXPECT_EQ(hot.metrics.tier_demotions[kDemoteIdle]->Value(), 1);
  hot.Advance(5);
  ASSERT_TRUE(hot.Attend1("b", 0).ok());  // attending resets b's idle time
  hot.Advance(29);
  hot.h->ExpireIdle();
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  hot.Advance(2);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("b", 0));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), 0u);
  EXPECT_EQ(Resident(hot.Stats()), 2u * kPages);

  // hot_idle_seconds 0: never demoted for idling.
  o.hot_idle_seconds = 0;
  Server keep(o);
  ASSERT_TRUE(keep.Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(keep.Attend1("a", 0).ok());
  keep.Advance(1e6);
  keep.h->ExpireIdle();
  EXPECT_TRUE(keep.h->LayerIsHot("a", 0));
}

// A sequence's idle layers demote together (one hot checksum pass, one
// move, one cold checksum pass): a corrupt hot page keeps its layer hot,
// and the other layer is coded back to its original cold bytes all the
// same. Repaired, the layer demotes on the next pass.
TEST(HotTier, IdleLayersOfASequenceDemoteTogether) {
  ServiceOptions o = HotOptions(16);
  o.hot_keep_cold_copies = false;
  Server hot(o), cold(ColdOptions());
  std::vector<std::string> original;
  ASSERT_NO_FATAL_FAILURE(PushTwoLayers(hot, cold, "a", 50, &original));
  ASSERT_TRUE(hot.Attend({{"a", 0}, {"a", 1}}, 7).ok());
  std::vector<PageId> hot_pages;
  hot.h->WithLayerForTest("a", 1, [&](LayerState& l) { hot_pages = l.pages; });
  ASSERT_EQ(hot_pages.size(), static_cast<size_t>(kPages));
  uint8_t* byte = hot.h->hot_pool()->page(hot_pages[2]) + 999;
  *byte ^= 0x04;
  const uint64_t failures = hot.Stats().checksum_failures();
  hot.Advance(61);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(hot.Stats().checksum_failures(), failures + 1);
  EXPECT_EQ(hot.Stats().pages_demoted(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(ColdBytes(*hot.h, "a", 0), original[0]);
  *byte ^= 0x04;
  hot.Advance(61);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(ColdBytes(*hot.h, "a", 1), original[1]);
  const v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.pages_demoted(), 2u * kPages);
  EXPECT_EQ(s.pages_in_use(), 2u * kPages);
  EXPECT_EQ(s.hot_pages_in_use(), 0u);
  ExpectSameAnswer(cold, hot, "a", 2);
}

TEST(HotTier, AppendIntoHotLayerGoesHot) {
  ServiceOptions ho = HotOptions(16);
  ho.hot_idle_seconds = 30;
  Server cold(ColdOptions()), hot(ho);
  const int total = kTokens + 2 * kP;
  const testing::Kv kv = SyntheticKv(total, kN, 6);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  ASSERT_TRUE(hot.h->LayerIsHot("a", 0));
  // Two more pages' worth of tokens: both pages go hot at once.
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("a", 0, kv, kTokens, 2 * kP, 50).ok());
  v1::StatsResponse s = hot.Stats();
  EXPECT_EQ(s.hot_pages_in_use(), kPages + 2u);
  EXPECT_EQ(Resident(s), 0u);
  EXPECT_EQ(s.pages_promoted(), kPages + 2u);
  // The new pages were encoded straight into level pages, not promoted.
  EXPECT_EQ(s.pages_encoded_hot(), 2u);
  EXPECT_EQ(hot.metrics.tier_pages_encoded_hot->Value(), 2);
  EXPECT_EQ(s.promotions(), 1u);
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  absl::StatusOr<Answer> want = cold.Attend1("a", 0), got = hot.Attend1("a", 0);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(*got == *want);
  EXPECT_EQ(hot.Read("a", 0), cold.Read("a", 0));
  // Demoted, the pages that were never cold become the cold pages the
  // server without a hot tier holds: each passes its checksum (the one
  // the straight encoding reported) and answers alike.
  hot.Advance(60);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_EQ(Resident(hot.Stats()), kPages + 2u);
  EXPECT_EQ(hot.Read("a", 0), cold.Read("a", 0));
  want = cold.Attend1("a", 0, 9);
  got = hot.Attend1("a", 0, 9);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(*got == *want);
}

// Decode steps (Attend with a new token) that fill a page of a hot layer.
TEST(HotTier, DecodeStepsIntoHotLayer) {
  Server cold(ColdOptions()), hot(HotOptions(16));
  const int steps = 80;  // window 188 -> 268 tokens: one more page
  const testing::Kv kv = SyntheticKv(kTokens + steps, kN, 7);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("d", 0, kv, 0, kTokens).ok());
  for (int i = 0; i < steps; ++i) {
    std::vector<std::string> outs;
    for (Server* s : {&cold, &hot}) {
      v1::AttendRequest req;
      v1::AttendItem* it = req.add_items();
      *it = QueryItem("d", 0, SyntheticQuery(kQHeads, kD, 100 + i), kQHeads);
      const size_t at = static_cast<size_t>(kTokens + i) * kN;
      FloatToTensor(kv.keys.data() + at, kN, v1::DTYPE_F32, it->mutable_new_key());
      FloatToTensor(kv.values.data() + at, kN, v1::DTYPE_F32, it->mutable_new_value());
      v1::AttendResponse resp;
      ASSERT_TRUE(s->h->Attend(req, &resp).ok());
      outs.push_back(resp.results(0).output() +
                     std::string(reinterpret_cast<const char*>(resp.results(0).lse().data()), kQHeads * sizeof(float)));
    }
    EXPECT_EQ(outs[0], outs[1]) << "step " << i;
  }
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), kPages + 1u);
  EXPECT_EQ(Resident(hot.Stats()), 0u);
  EXPECT_EQ(hot.Stats().pages_encoded_hot(), 1u);
  EXPECT_EQ(hot.Read("d", 0), cold.Read("d", 0));
}

TEST(HotTier, AppendDemotesOtherLayersThenItself) {
  Server cold(ColdOptions()), hot(HotOptions(2 * kPages));
  const int total = kTokens + kP;
  const testing::Kv ka = SyntheticKv(total, kN, 8), kb = SyntheticKv(total, kN, 9);
  for (Server* s : {&cold, &hot}) {
    ASSERT_TRUE(s->Push("a", 0, ka, 0, kTokens).ok());
    ASSERT_TRUE(s->Push("b", 0, kb, 0, kTokens).ok());
  }
  ASSERT_TRUE(hot.Attend1("a", 0).ok());
  hot.Advance(1);
  ASSERT_TRUE(hot.Attend1("b", 0).ok());
  ASSERT_EQ(hot.Stats().hot_pages_in_use(), 2u * kPages);  // full
  // b's new page: a (least recently attended) is demoted to make room.
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("b", 0, kb, kTokens, kP).ok());
  EXPECT_FALSE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("b", 0));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), kPages + 1u);
  EXPECT_EQ(hot.metrics.tier_demotions[kDemoteBudget]->Value(), 1);
  // Fill the hot tier with a and b (b: 5 pages, a: 3 of its 4 do not fit,
  // so a stays cold) and then append to b until nothing else is hot: b
  // demotes itself and the Append succeeds.
  Server solo(HotOptions(kPages));
  ASSERT_TRUE(solo.Push("a", 0, ka, 0, kTokens).ok());
  ASSERT_TRUE(solo.Attend1("a", 0).ok());
  ASSERT_TRUE(solo.h->LayerIsHot("a", 0));
  ASSERT_EQ(solo.Stats().hot_pages_in_use(), static_cast<uint64_t>(kPages));
  ASSERT_TRUE(solo.Push("a", 0, ka, kTokens, kP).ok());  // 5th page: no hot page anywhere
  EXPECT_FALSE(solo.h->LayerIsHot("a", 0));
  EXPECT_EQ(solo.Stats().hot_pages_in_use(), 0u);
  EXPECT_EQ(Resident(solo.Stats()), kPages + 1u);
  EXPECT_EQ(solo.metrics.tier_demotions[kDemoteAppend]->Value(), 1);
  // 5 pages never fit a 4-page tier: attended cold, same answer.
  absl::StatusOr<Answer> want = cold.Attend1("a", 0);
  ASSERT_TRUE(cold.Push("a", 0, ka, kTokens, kP).ok());
  want = cold.Attend1("a", 0);
  absl::StatusOr<Answer> got = solo.Attend1("a", 0);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(*got == *want);
  EXPECT_FALSE(solo.h->LayerIsHot("a", 0));
}

TEST(HotTier, AsyncPromotesInTheBackground) {
  ServiceOptions o = HotOptions(16);
  o.hot_promotion = HotPromotion::kAsync;
  Server cold(ColdOptions()), hot(o);
  const testing::Kv kv = SyntheticKv(kTokens, kN, 11);
  for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
  absl::StatusOr<Answer> want = cold.Attend1("a", 0);
  ASSERT_TRUE(want.ok());
  // Answered from whichever tier holds the layer at the time: the same bits.
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<Answer> got = hot.Attend1("a", 0);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == *want);
  }
  hot.h->DrainPromotions();
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_EQ(hot.Stats().promotions(), 1u);  // requests coalesce or find it hot
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), static_cast<uint64_t>(kPages));
  absl::StatusOr<Answer> got = hot.Attend1("a", 0);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == *want);
  v1::InfoResponse info;
  hot.h->Info(&info);
  EXPECT_EQ(info.hot_promotion(), "async");
}

// Prefetch makes every layer holding tokens hot in one go (sync), and the
// answers are the cold handler's; a second Prefetch has nothing to do, an
// empty layer stays cold, and a server without a hot tier promotes none.
TEST(HotTier, PrefetchPromotesEveryLayerWithTokens) {
  Server cold(ColdOptions()), hot(HotOptions(16));
  const testing::Kv kv = SyntheticKv(kTokens, kN, 31);
  for (Server* s : {&cold, &hot}) {
    ASSERT_TRUE(s->Push("a", 0, kv, 0, kTokens).ok());
    ASSERT_TRUE(s->Push("a", 1, kv, 0, kTokens).ok());
    ASSERT_TRUE(s->Push("e", 0, kv, 0, 100).ok());  // a window, no page: stays cold
  }
  v1::PrefetchRequest p;
  p.set_sequence_id("a");
  v1::PrefetchResponse r;
  ASSERT_TRUE(hot.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.layers_promoted(), 2u);
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(hot.Stats().hot_pages_in_use(), static_cast<uint64_t>(2 * kPages));
  r.Clear();
  ASSERT_TRUE(hot.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.layers_promoted(), 0u);
  EXPECT_EQ(hot.Stats().promotions(), 2u);
  for (uint32_t layer : {0u, 1u}) {
    absl::StatusOr<Answer> want = cold.Attend1("a", layer), got = hot.Attend1("a", layer);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_TRUE(*got == *want) << layer;
  }
  p.set_sequence_id("e");
  r.Clear();
  ASSERT_TRUE(hot.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.layers_promoted(), 0u);
  EXPECT_FALSE(hot.h->LayerIsHot("e", 0));
  p.set_sequence_id("a");
  r.Clear();
  ASSERT_TRUE(cold.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.layers_promoted(), 0u);
  p.set_sequence_id("nope");
  EXPECT_EQ(hot.h->Prefetch(p, &r).code(), absl::StatusCode::kNotFound);
}

// With asynchronous promotion Prefetch queues the layers: none promoted by
// the call, all hot once the queue drained.
TEST(HotTier, AsyncPrefetchQueues) {
  ServiceOptions o = HotOptions(16);
  o.hot_promotion = HotPromotion::kAsync;
  Server hot(o);
  const testing::Kv kv = SyntheticKv(kTokens, kN, 32);
  ASSERT_TRUE(hot.Push("a", 0, kv, 0, kTokens).ok());
  ASSERT_TRUE(hot.Push("a", 1, kv, 0, kTokens).ok());
  v1::PrefetchRequest p;
  p.set_sequence_id("a");
  v1::PrefetchResponse r;
  ASSERT_TRUE(hot.h->Prefetch(p, &r).ok());
  hot.h->DrainPromotions();
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
}

// Threads attend three layers over a budget of two while the tiers churn;
// every answer must be the cold handler's.
TEST(HotTier, ConcurrentAttendsWhileLayersMove) {
  ServiceOptions o = HotOptions(2 * kPages);
  o.backend_threads = 2;
  Server cold(ColdOptions()), hot(o);
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::vector<Answer> want;
  ASSERT_NO_FATAL_FAILURE(PushThree(ids, cold, hot, &want));
  AttendFromFourThreads(hot, ids, want);
  v1::StatsResponse s = hot.Stats();
  EXPECT_LE(s.hot_pages_in_use(), 2u * kPages);
  EXPECT_EQ(s.hot_pages_in_use() + Resident(s), 3u * kPages);
  EXPECT_GE(s.promotions(), 2u);
}

// WUSH transforms of 128-token pages, random but well conditioned.
std::shared_ptr<const TransformSet> WushSet(int layers) {
  TransformSet s;
  s.layers = layers;
  s.kv_heads = 2;
  s.head_dim = kD;
  s.gamma = kWushDefaultGamma;
  s.calibration_tokens = 1000;
  s.Resize();
  std::mt19937_64 rng(5);
  std::normal_distribution<double> g;
  auto spd = [&] {
    std::vector<double> a(kD * kD), m(kD * kD, 0.0);
    for (double& x : a) x = g(rng);
    for (int i = 0; i < kD; ++i) {
      for (int j = 0; j < kD; ++j) {
        for (int k = 0; k < kD; ++k) m[i * kD + j] += a[i * kD + k] * a[j * kD + k] / kD;
      }
      m[i * kD + i] += 0.5;
    }
    return m;
  };
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < 2; ++h) {
      for (Mat m : {Mat::kKey, Mat::kValue}) {
        absl::StatusOr<WushTransform> t = BuildWushTransform(spd(), spd(), kD);
        EXPECT_TRUE(t.ok()) << t.status();
        const Mat inv = m == Mat::kKey ? Mat::kKeyInverse : Mat::kValueInverse;
        for (int i = 0; i < kD * kD; ++i) {
          s.matrix(l, h, m)[i] = static_cast<float>(t->t[i]);
          s.matrix(l, h, inv)[i] = static_cast<float>(t->inv[i]);
        }
      }
    }
  }
  return std::make_shared<const TransformSet>(std::move(s));
}

TEST(HotTier, WushTransformsBitIdentical) {
  for (bool folded : {false, true}) {
    ServiceOptions co = ColdOptions(), ho = HotOptions(24);
    for (ServiceOptions* o : {&co, &ho}) {
      o->transform = TransformKind::kWush;
      o->codec.hadamard = false;
      o->transforms = WushSet(o->layers);
      o->transforms_file = "test.xfm";
      o->values_folded = folded;
      o->backend_threads = 4;
    }
    Server cold(co), hot(ho);
    const int tokens = 17 * kP + kR + 9;  // split-KV over 4 threads too
    const testing::Kv kv = SyntheticKv(tokens, kN, 30);
    for (Server* s : {&cold, &hot}) {
      ASSERT_TRUE(s->Push("w", 0, kv, 0, kTokens).ok());
      ASSERT_TRUE(s->Push("w", 1, kv, 0, tokens, 500).ok());
    }
    absl::StatusOr<std::vector<Answer>> want = cold.Attend({{"w", 0}, {"w", 1}}, 40);
    absl::StatusOr<std::vector<Answer>> got = hot.Attend({{"w", 0}, {"w", 1}}, 40);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
    EXPECT_TRUE(hot.h->LayerIsHot("w", 0));
    EXPECT_TRUE(hot.h->LayerIsHot("w", 1));
    EXPECT_TRUE((*got)[0] == (*want)[0]) << folded;
    EXPECT_TRUE((*got)[1] == (*want)[1]) << folded;
    EXPECT_EQ(hot.Read("w", 1), cold.Read("w", 1)) << folded;
  }
}

// Byte identity through the backend: cold -> hot -> cold gives the page
// the encoder wrote, byte for byte.
TEST(HotTier, CpuBackendDemotionGivesTheColdPageBack) {
  DQuantConfig c;
  c.kv_heads = 2;
  c.head_dim = kD;
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
  ASSERT_TRUE(codec.ok());
  const LevelPageLayout level = *MakeLevelPageLayout(*codec);
  auto pool = *PagePool::Create(codec->page_layout(), 4 * codec->page_layout().page_bytes);
  auto hot_pool = *PagePool::CreateOpaque(level.page_bytes, kLevelPageTokens, 2 * level.page_bytes);
  DQuantKvCodec kv_codec(*codec);
  BackendArgs args;
  args.codec = &kv_codec;
  args.pool = pool.get();
  args.threads = 2;
  args.hot_pool = hot_pool.get();
  absl::StatusOr<std::unique_ptr<Backend>> backend = MakeCpuBackend(args);
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_TRUE((*backend)->SupportsHotTier());
  const testing::Kv kv = SyntheticKv(kP, kN, 12);
  std::vector<PageId> cold = *pool->Reserve(2), hot = *hot_pool->Reserve(1);
  std::vector<EncodeJob> jobs(1);
  jobs[0].keys = kv.keys.data();
  jobs[0].values = kv.values.data();
  jobs[0].page = cold[0];
  ASSERT_TRUE((*backend)->EncodePages(absl::MakeSpan(jobs)).ok());
  const TierMove up{cold[0], hot[0], kP}, down{hot[0], cold[1], kP};
  ASSERT_TRUE((*backend)->PromotePages({&up, 1}).ok());
  ASSERT_TRUE((*backend)->DemotePages({&down, 1}).ok());
  const size_t bytes = pool->page_stride();
  EXPECT_EQ(std::memcmp(pool->key_records(cold[0]), pool->key_records(cold[1]), bytes), 0);
  // Read of the hot page equals Read of the cold one, float for float.
  std::vector<float> k1(kP * kN), v1(kP * kN), k2(kP * kN), v2(kP * kN);
  ASSERT_TRUE((*backend)->DecodeTokens(cold[0], 0, 0, kP, k1.data(), v1.data()).ok());
  ASSERT_TRUE((*backend)->DecodeHotTokens(hot[0], 0, 0, kP, k2.data(), v2.data()).ok());
  EXPECT_EQ(std::memcmp(k1.data(), k2.data(), k1.size() * 4), 0);
  EXPECT_EQ(std::memcmp(v1.data(), v2.data(), v1.size() * 4), 0);
  // A backend made without a hot pool has no hot tier.
  absl::StatusOr<std::unique_ptr<Backend>> plain = MakeCpuBackend(&*codec, pool.get(), 1);
  EXPECT_FALSE((*plain)->SupportsHotTier());
  EXPECT_EQ((*plain)->PromotePages({&up, 1}).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace driftkv
