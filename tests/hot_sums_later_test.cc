// Level checksums that come after the promotion (Backend::
// PromotePagesCheckedLater, service/hot_sums.h), through the handler on a
// stand-in for the CUDA backend: the CPU backend registered as
// "later_sums", whose checked promotions hand their level sums back as a
// PendingChecksums that counts its waits and can be told to fail. An
// Attend that promotes does not wait for them; Read, a page check, a fork,
// an append into the hot layer and a demotion each see the same sums as a
// promotion that summed at once, a corrupt hot page is still caught, and
// sums that never came fail the reads that need them.
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "backends/backend.h"
#include "backends/registry.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/hot_tier_test_server.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using namespace hot_tier_test;  // NOLINT(build/namespaces)

std::atomic<int> g_promotions_later{0}, g_fetches{0};
std::atomic<bool> g_fail_fetch{false};

// Sums computed at promotion, handed over only when waited for.
class HeldSums : public PendingChecksums {
 public:
  explicit HeldSums(std::vector<PageChecksum> sums) : sums_(std::move(sums)) {}

 protected:
  absl::Status Fetch(std::vector<PageChecksum>* sums) override {
    ++g_fetches;
    if (g_fail_fetch) return absl::InternalError("level sums lost on the way");
    *sums = sums_;
    return absl::OkStatus();
  }

 private:
  const std::vector<PageChecksum> sums_;
};

class LaterSumsBackend : public Backend {
 public:
  explicit LaterSumsBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "later_sums"; }
  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override { return inner_->EncodePages(jobs); }
  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeTokens(page, layer, first, count, keys, values);
  }
  void Attend(absl::Span<AttendJob> jobs) override { inner_->Attend(jobs); }
  bool SupportsHotTier() const override { return inner_->SupportsHotTier(); }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override { return inner_->PromotePages(moves); }
  absl::Status DemotePages(absl::Span<const TierMove> moves) override { return inner_->DemotePages(moves); }
  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeHotTokens(page, layer, first, count, keys, values);
  }
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override {
    return inner_->ChecksumPages(pool, pages, sums);
  }
  absl::Status PromotePagesCheckedLater(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                        PageChecksum* cold_sums, PageChecksum*,
                                        std::shared_ptr<PendingChecksums>* later) override {
    std::vector<PageChecksum> sums(moves.size());
    absl::Status st = PromotePagesChecked(moves, cold, hot, cold_sums, sums.data());
    if (!st.ok()) return st;
    ++g_promotions_later;
    *later = std::make_shared<HeldSums>(std::move(sums));
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Backend> inner_;
};

const bool kRegistered = RegisterBackend("later_sums", [](const BackendArgs& args) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeBackend("cpu", args);
  if (!cpu.ok()) return cpu;
  return absl::StatusOr<std::unique_ptr<Backend>>(std::make_unique<LaterSumsBackend>(*std::move(cpu)));
});

ServiceOptions LaterOptions() {
  ServiceOptions o = HotOptions(16);
  o.backend = "later_sums";
  return o;
}

class HotSumsLaterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(kRegistered);
    g_promotions_later = 0;
    g_fetches = 0;
    g_fail_fetch = false;
  }
};

// The first Attend promotes both layers and answers without the level
// sums; the answers are the cold server's bit for bit. Read then waits for
// them once (one promotion, one fetch for both layers) and reads what a
// cold server reads; a flipped byte in a hot page is caught by Read as
// before, naming the page.
TEST_F(HotSumsLaterTest, AttendDoesNotWaitAndReadStillChecksHotPages) {
  Server hot(LaterOptions()), cold(ColdOptions());
  std::vector<std::string> original;
  ASSERT_NO_FATAL_FAILURE(PushTwoLayers(hot, cold, "a", 30, &original));
  ExpectSameAnswer(cold, hot, "a", 2);
  EXPECT_TRUE(hot.h->LayerIsHot("a", 0));
  EXPECT_TRUE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(g_promotions_later.load(), 1);
  EXPECT_EQ(g_fetches.load(), 0);
  for (uint32_t layer : {0u, 1u}) {
    EXPECT_EQ(testing::ReadLayerBytes(*hot.h, "a", layer), testing::ReadLayerBytes(*cold.h, "a", layer));
  }
  EXPECT_EQ(g_fetches.load(), 1);

  std::vector<PageId> pages;
  hot.h->WithLayerForTest("a", 1, [&](LayerState& l) { pages = l.pages; });
  ASSERT_EQ(pages.size(), static_cast<size_t>(kPages));
  uint8_t* byte = hot.h->hot_pool()->page(pages[2]) + 999;
  *byte ^= 0x10;
  v1::ReadRequest req;
  req.set_sequence_id("a");
  req.set_layer(1);
  absl::Status st = hot.h->Read(req, [](const v1::ReadChunk&) { return true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "page 2")) << st;
  *byte ^= 0x10;
  EXPECT_EQ(testing::ReadLayerBytes(*hot.h, "a", 1), testing::ReadLayerBytes(*cold.h, "a", 1));
}

// Pages appended to a hot layer whose promotion's sums are still pending
// follow them (service/hot_sums.h): the whole layer reads back checked; a
// fork takes them over; a demotion checks the hot pages against them and
// gives back the cold pages the promotion started from.
TEST_F(HotSumsLaterTest, AppendForkAndDemotionUseThePendingSums) {
  ServiceOptions o = LaterOptions();
  o.hot_keep_cold_copies = false;  // the demotion codes every page back
  Server hot(o), cold(ColdOptions());
  std::vector<std::string> original;
  ASSERT_NO_FATAL_FAILURE(PushTwoLayers(hot, cold, "a", 40, &original));
  ExpectSameAnswer(cold, hot, "a", 2);
  ASSERT_EQ(g_fetches.load(), 0);
  // 128 more tokens of layer 0: one more page, encoded into the hot tier.
  const testing::Kv more = SyntheticKv(kTokens + kP, kN, 40);
  for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push("a", 0, more, kTokens, kP).ok());
  size_t pages0 = 0;
  hot.h->WithLayerForTest("a", 0, [&](LayerState& l) {
    EXPECT_TRUE(l.hot);
    pages0 = l.pages.size();
    EXPECT_EQ(l.hot_sums.size(), l.pages.size());
  });
  EXPECT_EQ(pages0, static_cast<size_t>(kPages + 1));
  EXPECT_EQ(g_fetches.load(), 0);  // appending does not wait for them
  EXPECT_EQ(testing::ReadLayerBytes(*hot.h, "a", 0), testing::ReadLayerBytes(*cold.h, "a", 0));
  EXPECT_EQ(g_fetches.load(), 1);

  v1::ForkRequest f;
  f.set_source_sequence_id("a");
  f.set_sequence_id("b");
  f.set_tokens(static_cast<uint64_t>(kPages) * kP);
  v1::ForkResponse fr;
  ASSERT_TRUE(hot.h->Fork(f, &fr).ok());
  for (uint32_t layer : {0u, 1u}) {
    hot.h->WithLayerForTest("b", layer, [&](LayerState& l) {
      EXPECT_TRUE(l.hot);
      EXPECT_EQ(l.hot_sums.size(), static_cast<size_t>(kPages));
    });
    EXPECT_FALSE(testing::ReadLayerBytes(*hot.h, "b", layer).empty());
  }

  hot.Advance(61);
  hot.h->ExpireIdle();
  EXPECT_FALSE(hot.h->LayerIsHot("a", 1));
  EXPECT_EQ(ColdBytes(*hot.h, "a", 1), original[1]);
  EXPECT_EQ(testing::ReadLayerBytes(*hot.h, "a", 1), testing::ReadLayerBytes(*cold.h, "a", 1));
}

// Sums that never arrive: the Attend that promoted has answered, but
// whatever needs them fails with their error rather than trusting pages it
// cannot check.
TEST_F(HotSumsLaterTest, SumsThatNeverCameFailTheReadsThatNeedThem) {
  Server hot(LaterOptions()), cold(ColdOptions());
  std::vector<std::string> original;
  ASSERT_NO_FATAL_FAILURE(PushTwoLayers(hot, cold, "a", 50, &original));
  g_fail_fetch = true;
  ExpectSameAnswer(cold, hot, "a", 2);
  v1::ReadRequest req;
  req.set_sequence_id("a");
  req.set_layer(0);
  absl::Status st = hot.h->Read(req, [](const v1::ReadChunk&) { return true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "level sums lost")) << st;
  EXPECT_GE(g_fetches.load(), 1);
}

}  // namespace
}  // namespace driftkv
