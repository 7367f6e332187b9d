// HotTier (service/hot_tier.h) on its own, without requests or a handler:
// real D-Quant pages encoded by the CPU backend, moved between a cold pool
// and a small hot pool. The rules: promotion and demotion keep the bytes'
// cold form; least recently attended layers are demoted first; a held
// layer is never demoted; a busy layer is skipped (TryLock); ReserveHot
// demotes until the pages fit, then says RESOURCE_EXHAUSTED; idle layers
// go cold; queued async promotions of one layer coalesce; a move changes
// the tenant's bytes by the difference of the page sizes.
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "backends/page_checksum.h"
#include "backends/page_format.h"
#include "backends/registry.h"
#include "codec/dquant_kv_codec.h"
#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "service/hot_tier.h"
#include "service/metrics.h"
#include "service/page_verifier.h"
#include "service/sequence.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

// 2 KV heads x 64 (n = 128); level pages need P = 128.
constexpr int kN = 128, kP = 128, kLayers = 2;

// A cold pool, a hot pool of `hot_pages` level pages, the CPU backend and a
// HotTier over them, on a clock the test moves.
class Tier {
 public:
  Tier(int hot_pages, HotPromotion promotion = HotPromotion::kSync, double idle_seconds = 0.0,
       std::function<void()> after_move = nullptr) {
    ServiceOptions o = testing::SmallOptions(4u << 20);
    o.codec.mean_window = kP;
    codec_ = *MakeKvCodec(o.codec_options());
    cold_ = *PagePool::Create(*MakePageLayoutFor(o.page_format, *codec_), o.pool_bytes, 1);
    const auto* dq = dynamic_cast<const DQuantKvCodec*>(codec_.get());
    const uint64_t level_bytes = MakeLevelPageLayout(dq->codec())->page_bytes;
    hot_ = *PagePool::CreateOpaque(level_bytes, kLevelPageTokens, hot_pages * level_bytes);
    BackendArgs args;
    args.codec = codec_.get();
    args.page_format = o.page_format;
    args.pool = cold_.get();
    args.hot_pool = hot_.get();
    backend_ = *MakeBackend("cpu", args);
    verifier_ = std::make_unique<PageVerifier>(*cold_, hot_.get(), *backend_, &metrics_, kN);
    tier_ = std::make_unique<HotTier>(
        *cold_, *hot_, *backend_, *verifier_, &metrics_, [this] { return now_; }, promotion, idle_seconds,
        std::move(after_move));
  }

  // A sequence whose every layer holds `pages` encoded cold pages (and no
  // window), with their checksums; `usage` (default: a tenant without
  // quotas) is its tenant's, not charged here.
  SequencePtr NewSequence(int pages, uint32_t seed, TenantUsage* usage = nullptr) {
    auto seq = std::make_shared<Sequence>("s" + std::to_string(seed), kLayers, usage ? usage : &usage_, 0);
    for (int l = 0; l < kLayers; ++l) {
      LayerState& layer = seq->layers[l];
      const testing::Kv kv = testing::SyntheticKv(pages * kP, kN, seed * 7 + l);
      layer.pages = *cold_->Reserve(pages);
      std::vector<EncodeJob> jobs(pages);
      for (int i = 0; i < pages; ++i) {
        jobs[i].keys = kv.keys.data() + static_cast<size_t>(i) * kP * kN;
        jobs[i].values = kv.values.data() + static_cast<size_t>(i) * kP * kN;
        jobs[i].page = layer.pages[i];
        jobs[i].layer = l;
      }
      EXPECT_TRUE(backend_->EncodePages(absl::MakeSpan(jobs)).ok());
      for (PageId p : layer.pages) layer.page_sums.push_back(Crc32c(cold_->page(p), cold_->page_stride()));
      layer.length = static_cast<int64_t>(pages) * kP;
    }
    return seq;
  }
  bool IsHot(const SequencePtr& seq, int layer) {
    absl::ReaderMutexLock lock(&seq->layers[layer].mu);
    return seq->layers[layer].hot;
  }
  uint64_t Id(const SequencePtr& seq, int layer) const { return seq->layers[layer].id; }
  // Promotes at `seconds` on the clock.
  bool Promote(const SequencePtr& seq, int layer, double seconds) {
    now_ = absl::UnixEpoch() + absl::Seconds(seconds);
    return tier_->PromoteLayer(seq, layer, {});
  }

  HotTier& tier() { return *tier_; }
  PagePool& cold() { return *cold_; }
  PagePool& hot() { return *hot_; }
  absl::Time now_ = absl::UnixEpoch();

 private:
  Metrics metrics_;
  TenantUsage usage_{"", TenantQuota{}};
  std::unique_ptr<KvCodec> codec_;
  std::unique_ptr<PagePool> cold_, hot_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<PageVerifier> verifier_;
  std::unique_ptr<HotTier> tier_;
};

// The tenant of a layer holds its pages at their tier's page size: a
// promotion charges the difference, a demotion gives it back, and a
// promotion that does not fit the tenant's max_bytes leaves the layer cold.
TEST(HotTierTest, TierMovesChargeTheDifferenceOfThePageSizes) {
  Tier t(8);
  const int64_t cold = static_cast<int64_t>(t.cold().page_stride());
  const int64_t hot = static_cast<int64_t>(t.hot().page_stride());
  ASSERT_GT(hot, cold);  // level pages are the larger: the tight case below relies on it
  TenantUsage usage("t", TenantQuota{});
  SequencePtr s = t.NewSequence(2, 1, &usage);
  usage.AddBytes({2 * kLayers * cold, 0, 0});  // as the Appends charged them
  ASSERT_TRUE(t.Promote(s, 0, 1));
  EXPECT_EQ(usage.held_bytes().cold_pages, 2 * cold);
  EXPECT_EQ(usage.held_bytes().hot_pages, 2 * hot);
  EXPECT_EQ(usage.bytes(), 2 * cold + 2 * hot);
  {
    absl::ReaderMutexLock seq_lock(&s->mu);
    absl::MutexLock lock(&s->layers[0].mu);
    ASSERT_TRUE(t.tier().DemoteLocked(&s->layers[0], s->usage, LayerName{s->id, 0}, kDemoteBudget).ok());
  }
  EXPECT_EQ(usage.bytes(), 2 * kLayers * cold);
  EXPECT_EQ(usage.held_bytes().hot_pages, 0);

  TenantQuota quota;
  quota.max_bytes = static_cast<uint64_t>(2 * kLayers * cold + hot - cold);  // one page moved, not two
  TenantUsage tight("u", quota);
  SequencePtr u = t.NewSequence(2, 2, &tight);
  tight.AddBytes({2 * kLayers * cold, 0, 0});
  EXPECT_FALSE(t.Promote(u, 0, 2));
  EXPECT_FALSE(t.IsHot(u, 0));
  EXPECT_EQ(tight.bytes(), 2 * kLayers * cold);
  EXPECT_EQ(t.hot().pages_in_use(), 0);
}

TEST(HotTierTest, PromotionAndDemotionKeepTheColdForm) {
  Tier t(8);
  SequencePtr s = t.NewSequence(2, 1);
  const std::vector<PageChecksum> sums = s->layers[0].page_sums;
  ASSERT_TRUE(t.Promote(s, 0, 1));
  EXPECT_TRUE(t.IsHot(s, 0));
  EXPECT_FALSE(t.IsHot(s, 1));
  EXPECT_EQ(t.hot().pages_in_use(), 2);
  EXPECT_EQ(t.cold().pages_in_use(), 2);  // layer 1 only
  EXPECT_EQ(t.tier().promotions(), 1u);
  EXPECT_EQ(t.tier().pages_promoted(), 2u);
  EXPECT_EQ(t.tier().layers(), 1u);
  {
    absl::ReaderMutexLock seq_lock(&s->mu);
    absl::MutexLock lock(&s->layers[0].mu);
    // Demotion verifies every page against its cold checksum.
    ASSERT_TRUE(t.tier().DemoteLocked(&s->layers[0], s->usage, LayerName{s->id, 0}, kDemoteBudget).ok());
  }
  EXPECT_FALSE(t.IsHot(s, 0));
  EXPECT_EQ(t.hot().pages_in_use(), 0);
  EXPECT_EQ(t.tier().layers(), 0u);
  EXPECT_EQ(t.tier().demotions(), 1u);
  for (size_t i = 0; i < sums.size(); ++i) {
    EXPECT_EQ(Crc32c(t.cold().page(s->layers[0].pages[i]), t.cold().page_stride()), sums[i]);
  }
}

TEST(HotTierTest, LruOrderFollowsAttends) {
  Tier t(8);
  SequencePtr s = t.NewSequence(1, 2), u = t.NewSequence(1, 3);
  ASSERT_TRUE(t.Promote(s, 0, 1));
  ASSERT_TRUE(t.Promote(s, 1, 2));
  ASSERT_TRUE(t.Promote(u, 0, 3));
  EXPECT_EQ(t.tier().LruOrder(), (std::vector<uint64_t>{t.Id(s, 0), t.Id(s, 1), t.Id(u, 0)}));
  t.tier().Touch(t.Id(s, 0), absl::ToUnixNanos(absl::UnixEpoch() + absl::Seconds(4)));
  EXPECT_EQ(t.tier().LruOrder(), (std::vector<uint64_t>{t.Id(s, 1), t.Id(u, 0), t.Id(s, 0)}));
  // An older time does not move a layer back.
  t.tier().Touch(t.Id(u, 0), absl::ToUnixNanos(absl::UnixEpoch() + absl::Seconds(1)));
  EXPECT_EQ(t.tier().LruOrder(), (std::vector<uint64_t>{t.Id(s, 1), t.Id(u, 0), t.Id(s, 0)}));
  // The least recently attended goes first.
  absl::flat_hash_set<uint64_t> tried;
  ASSERT_TRUE(t.tier().DemoteVictim({}, 0, &tried));
  EXPECT_FALSE(t.IsHot(s, 1));
  EXPECT_TRUE(t.IsHot(u, 0));
  EXPECT_TRUE(t.IsHot(s, 0));
}

TEST(HotTierTest, NeverDemotesAHeldLayer) {
  Tier t(8);
  SequencePtr s = t.NewSequence(1, 4);
  ASSERT_TRUE(t.Promote(s, 0, 1));
  ASSERT_TRUE(t.Promote(s, 1, 2));
  HotTier::Held held;
  held.layers.insert(t.Id(s, 0));  // the oldest
  absl::flat_hash_set<uint64_t> tried;
  ASSERT_TRUE(t.tier().DemoteVictim(held, 0, &tried));
  EXPECT_TRUE(t.IsHot(s, 0));
  EXPECT_FALSE(t.IsHot(s, 1));
  tried.clear();
  EXPECT_FALSE(t.tier().DemoteVictim(held, 0, &tried));  // only the held one is left
  EXPECT_TRUE(t.IsHot(s, 0));
}

TEST(HotTierTest, SkipsABusyLayer) {
  Tier t(8);
  SequencePtr s = t.NewSequence(1, 5), u = t.NewSequence(1, 6);
  ASSERT_TRUE(t.Promote(s, 0, 1));  // the oldest, but busy below
  ASSERT_TRUE(t.Promote(u, 0, 2));
  absl::Notification locked, done;
  std::thread reader([&] {
    absl::ReaderMutexLock seq_lock(&s->mu);
    absl::ReaderMutexLock lock(&s->layers[0].mu);  // an Attend in flight
    locked.Notify();
    done.WaitForNotification();
  });
  locked.WaitForNotification();
  absl::flat_hash_set<uint64_t> tried;
  EXPECT_TRUE(t.tier().DemoteVictim({}, 0, &tried));  // returns instead of waiting
  EXPECT_TRUE(t.IsHot(u, 0) == false);
  tried.clear();
  EXPECT_FALSE(t.tier().DemoteVictim({}, 0, &tried));  // the busy one is all that is left
  done.Notify();
  reader.join();
  EXPECT_TRUE(t.IsHot(s, 0));
  tried.clear();
  EXPECT_TRUE(t.tier().DemoteVictim({}, 0, &tried));  // free now
  EXPECT_FALSE(t.IsHot(s, 0));
}

TEST(HotTierTest, ReserveHotDemotesUntilItFitsThenIsExhausted) {
  Tier t(4);
  SequencePtr s = t.NewSequence(2, 7);
  ASSERT_TRUE(t.Promote(s, 0, 1));
  ASSERT_TRUE(t.Promote(s, 1, 2));
  EXPECT_EQ(t.hot().pages_in_use(), 4);
  // More than the tier holds: refused at once, nothing demoted.
  absl::StatusOr<std::vector<PageId>> too_many = t.tier().ReserveHot(5, {}, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(too_many.status())) << too_many.status();
  EXPECT_TRUE(t.IsHot(s, 0));
  // 3 pages: both layers go, oldest first.
  absl::StatusOr<std::vector<PageId>> three = t.tier().ReserveHot(3, {}, 0);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->size(), 3u);
  EXPECT_FALSE(t.IsHot(s, 0));
  EXPECT_FALSE(t.IsHot(s, 1));
  EXPECT_EQ(t.tier().demotions(), 2u);
  t.hot().Free(*three);
  // 2 pages while the only hot layer is held: nothing to demote.
  ASSERT_TRUE(t.Promote(s, 0, 3));
  ASSERT_TRUE(t.Promote(s, 1, 4));
  HotTier::Held held;
  held.layers = {t.Id(s, 0), t.Id(s, 1)};
  absl::StatusOr<std::vector<PageId>> none = t.tier().ReserveHot(1, held, 0);
  EXPECT_TRUE(absl::IsResourceExhausted(none.status())) << none.status();
  EXPECT_TRUE(t.IsHot(s, 0));
  EXPECT_TRUE(t.IsHot(s, 1));
}

TEST(HotTierTest, PromotionMakesRoomButNotFromItsExclusions) {
  Tier t(2);
  SequencePtr s = t.NewSequence(2, 8);
  ASSERT_TRUE(t.Promote(s, 0, 1));
  // Layer 1 needs both hot pages: layer 0 is excluded, so it stays cold.
  EXPECT_FALSE(t.tier().PromoteLayer(s, 1, {t.Id(s, 0)}));
  EXPECT_TRUE(t.IsHot(s, 0));
  EXPECT_FALSE(t.IsHot(s, 1));
  // Without the exclusion layer 0 makes room.
  EXPECT_TRUE(t.tier().PromoteLayer(s, 1, {}));
  EXPECT_FALSE(t.IsHot(s, 0));
  EXPECT_TRUE(t.IsHot(s, 1));
}

TEST(HotTierTest, IdleLayersGoCold) {
  Tier t(8, HotPromotion::kSync, /*idle_seconds=*/10.0);
  SequencePtr s = t.NewSequence(1, 9);
  ASSERT_TRUE(t.Promote(s, 0, 0));
  ASSERT_TRUE(t.Promote(s, 1, 5));
  t.now_ = absl::UnixEpoch() + absl::Seconds(9);
  EXPECT_FALSE(t.tier().DemoteIdle());  // nothing idle for 10 s yet
  t.now_ = absl::UnixEpoch() + absl::Seconds(12);
  EXPECT_TRUE(t.tier().DemoteIdle());
  EXPECT_FALSE(t.IsHot(s, 0));
  EXPECT_TRUE(t.IsHot(s, 1));
  // An attend resets the idle time.
  t.tier().Touch(t.Id(s, 1), absl::ToUnixNanos(t.now_));
  t.now_ = absl::UnixEpoch() + absl::Seconds(20);
  t.tier().DemoteIdle();
  EXPECT_TRUE(t.IsHot(s, 1));
}

TEST(HotTierTest, QueuedPromotionsOfOneLayerCoalesce) {
  absl::Notification first_moved, go_on;
  std::atomic<int> moves{0};
  Tier t(8, HotPromotion::kAsync, 0.0, [&] {
    if (moves.fetch_add(1) == 0) {
      first_moved.Notify();
      go_on.WaitForNotification();  // holds the thread: later jobs queue up
    }
  });
  SequencePtr s = t.NewSequence(1, 10);
  EXPECT_TRUE(t.tier().Prepare({{s, 0}}, {t.Id(s, 0)}).ok());
  first_moved.WaitForNotification();
  EXPECT_TRUE(t.IsHot(s, 0));
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(t.tier().Prepare({{s, 1}}, {t.Id(s, 1)}).ok());
  go_on.Notify();
  t.tier().DrainPromotions();
  EXPECT_TRUE(t.IsHot(s, 1));
  EXPECT_EQ(moves.load(), 2);  // one job for layer 0, one for layer 1
  EXPECT_EQ(t.tier().promotions(), 2u);
  EXPECT_FALSE(s->layers[1].promotion_queued.load());
}

}  // namespace
}  // namespace driftkv
