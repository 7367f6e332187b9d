// The page checksum (backends/page_checksum.h) and its checks in the
// handler: CRC-32C test vectors; a flipped bit in a stored cold page makes
// Read answer DATA_LOSS naming the page, layer and sequence (Attend too
// with verify_pages_on_attend, and the failure is counted), and nothing
// else is affected; a hot page whose demoted form differs is refused.
// On both tiers (TierChecksumTest): a flipped bit in a bf16 window is
// DATA_LOSS on Read, on Attend with verify_pages_on_attend, when its
// tokens would be encoded into a page and when the snapshot is written; a
// flipped bit in a hot page is DATA_LOSS on Read, on Attend with
// verify_pages_on_attend and on demotion; a corrupt cold page is never
// promoted. Faults are injected with Handler::WithLayerForTest and the
// pools' bytes, as memory corruption would reach them.
#include "backends/page_checksum.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "codec/level_page.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

TEST(Crc32c, KnownVectors) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32c(reinterpret_cast<const uint8_t*>(digits.data()), digits.size()), 0xE3069283u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32c, ContinuesAcrossSplitsAtEveryOffset) {
  std::vector<uint8_t> data(1031);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  const uint32_t whole = Crc32c(data.data(), data.size());
  for (size_t cut = 0; cut <= data.size(); cut += 13) {
    EXPECT_EQ(Crc32c(data.data() + cut, data.size() - cut, Crc32c(data.data(), cut)), whole) << cut;
  }
}

class ChecksumHandlerTest : public testing::HandlerFixture {
 protected:
  ChecksumHandlerTest() : HandlerFixture(testing::FixtureClock::kReal) {}

  void Make(bool verify_attend) {
    ServiceOptions o = testing::SmallOptions();
    o.verify_pages_on_attend = verify_attend;
    HandlerFixture::Make(o);
    if (HasFatalFailure()) return;
    // 100 tokens: pages of 32 and a window of 32 make 2 pages (ids 0 and 1).
    testing::Kv kv = testing::SyntheticKv(100, 128, 5);
    v1::AppendResponse r;
    ASSERT_TRUE(h_->Append(testing::ChunkOf("seq", 1, 0, 100, kv), &r).ok());
    ASSERT_EQ(h_->pool().pages_in_use(), 2);
  }
  absl::Status Read() {
    v1::ReadRequest r;
    r.set_sequence_id("seq");
    r.set_layer(1);
    return h_->Read(r, [](const v1::ReadChunk&) { return true; });
  }
  absl::Status Attend() {
    v1::AttendRequest a;
    *a.add_items() = testing::QueryItem("seq", 1, testing::SyntheticQuery(2, 64, 1), 2);
    v1::AttendResponse resp;
    return h_->Attend(a, &resp);
  }
  uint64_t Failures() { return Stats().checksum_failures(); }
};

TEST_F(ChecksumHandlerTest, IntactPagesReadAndAttend) {
  Make(true);
  EXPECT_TRUE(Read().ok());
  EXPECT_TRUE(Attend().ok());
  EXPECT_EQ(Failures(), 0u);
}

TEST_F(ChecksumHandlerTest, FlippedBitInAColdPageIsDataLossOnRead) {
  Make(false);
  h_->pool().page(1)[777] ^= 0x04;  // one of the two pages, whichever holds tokens [32, 64) or [0, 32)
  absl::Status st = Read();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "of layer 1 of sequence_id \"seq\" fails its checksum")) << st;
  EXPECT_EQ(Failures(), 1u);
  // Without verify_pages_on_attend Attend does not compare checksums (the
  // rANS decoder may still notice; that is not counted here).
  Attend().IgnoreError();
  EXPECT_EQ(Failures(), 1u);
  h_->pool().page(1)[777] ^= 0x04;
  EXPECT_TRUE(Read().ok());
}

TEST_F(ChecksumHandlerTest, FlippedBitIsDataLossOnAttendWhenVerifying) {
  Make(true);
  h_->pool().page(0)[h_->pool().page_stride() - 1] ^= 0x80;  // the last byte (the mean record)
  absl::Status st = Attend();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[0]: page ")) << st;
  EXPECT_EQ(Failures(), 1u);
  v1::InfoResponse info;
  h_->Info(&info);
  EXPECT_TRUE(info.verify_pages_on_attend());
}

// A decode step in an Attend that finds a corrupt page is not stored: the
// call changes nothing, and succeeds, step and all, once the page is
// intact.
TEST_F(ChecksumHandlerTest, AttendThatFindsACorruptPageStoresNoDecodeStep) {
  Make(true);
  const testing::Kv kv = testing::SyntheticKv(101, 128, 5);
  v1::AttendRequest a;
  v1::AttendItem* it = a.add_items();
  *it = testing::QueryItem("seq", 1, testing::SyntheticQuery(2, 64, 1), 2);
  FloatToTensor(kv.keys.data() + 100 * 128, 128, v1::DTYPE_F32, it->mutable_new_key());
  FloatToTensor(kv.values.data() + 100 * 128, 128, v1::DTYPE_F32, it->mutable_new_value());
  it->set_new_token_index(100);
  auto length = [&] {
    v1::LengthRequest req;
    req.set_sequence_id("seq");
    v1::LengthResponse resp;
    EXPECT_TRUE(h_->Length(req, &resp).ok());
    return resp.layers(1).tokens();
  };
  h_->pool().page(0)[h_->pool().page_stride() - 1] ^= 0x80;
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(a, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_EQ(length(), 100u);
  h_->pool().page(0)[h_->pool().page_stride() - 1] ^= 0x80;
  st = h_->Attend(a, &resp);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(length(), 101u);
}

// A layer of 700 tokens (4 pages of 128 and a 188-token window, R = 128)
// on the cold tier or, promoted by a first Attend, on the hot tier (sync
// promotion, room for 16 level pages).
class TierChecksumTest : public testing::HandlerFixture, public ::testing::WithParamInterface<bool> {
 protected:
  static constexpr int kP = 128, kTokens = 700, kPages = 4;

  TierChecksumTest() : HandlerFixture(testing::FixtureClock::kReal) {}

  static ServiceOptions Options(bool hot, bool verify_attend, int hot_pages = 16, bool copies = true) {
    ServiceOptions o = testing::SmallOptions(4u << 20);
    o.codec.mean_window = kP;
    o.window_tokens = kP;
    o.hot_tier_bytes = hot ? hot_pages * MakeLevelPageLayout(2, 64)->page_bytes : 0;
    o.hot_keep_cold_copies = copies;
    o.verify_pages_on_attend = verify_attend;
    return o;
  }
  // Pages held for sequences in both pools (the cold pool's copies of hot
  // pages are a cache, not held).
  uint64_t Held() {
    const v1::StatsResponse s = Stats();
    return s.pages_in_use() - s.cold_copy_pages() + s.hot_pages_in_use();
  }
  // The layer stored (and, for the hot tier, promoted) with `verify_attend`;
  // `copies`: the hot tier keeps cold copies.
  void Make(bool hot, bool verify_attend, int hot_pages = 16, bool copies = true) {
    HandlerFixture::Make(Options(hot, verify_attend, hot_pages, copies));
    if (HasFatalFailure()) return;
    kv_ = testing::SyntheticKv(kTokens + 2 * kP, testing::kSmallN, 9);
    ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, 0, kTokens).ok());
    if (hot) {
      ASSERT_TRUE(Attend().ok());
      ASSERT_TRUE(h_->LayerIsHot("seq", 1));
    }
    ASSERT_EQ(Failures(), 0u);
  }
  absl::Status Read() {
    v1::ReadRequest r;
    r.set_sequence_id("seq");
    r.set_layer(1);
    return h_->Read(r, [](const v1::ReadChunk&) { return true; });
  }
  absl::Status Attend(std::string* output = nullptr) {
    v1::AttendRequest a;
    *a.add_items() = testing::QueryItem("seq", 1, testing::SyntheticQuery(4, 64, 3), 4);
    v1::AttendResponse resp;
    absl::Status st = h_->Attend(a, &resp);
    if (st.ok() && output != nullptr) *output = resp.results(0).output() + resp.results(0).SerializeAsString();
    return st;
  }
  // Flips one bit of window token `token` (a key byte).
  void FlipWindow(int token) {
    ASSERT_TRUE(
        h_->WithLayerForTest("seq", 1, [&](LayerState& l) { l.window_keys[token * testing::kSmallN + 5] ^= 0x10; }));
  }
  // The page ids of the layer, in its tier.
  std::vector<PageId> Pages() {
    std::vector<PageId> pages;
    EXPECT_TRUE(h_->WithLayerForTest("seq", 1, [&](LayerState& l) { pages = l.pages; }));
    return pages;
  }
  uint64_t Failures() { return Stats().checksum_failures(); }
  double Counted(ChecksumSite site) { return metrics_.checksum_failures[site]->Value(); }
  int64_t Length(const char* id = "seq") {
    v1::LengthRequest r;
    r.set_sequence_id(id);
    v1::LengthResponse resp;
    EXPECT_TRUE(h_->Length(r, &resp).ok());
    return static_cast<int64_t>(resp.layers(1).tokens());
  }

  testing::Kv kv_;
};

INSTANTIATE_TEST_SUITE_P(Tiers, TierChecksumTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Hot" : "Cold"; });

TEST_P(TierChecksumTest, ChecksOnEveryPathChangeNoAnswer) {
  std::string unverified, verified;
  Make(GetParam(), false);
  ASSERT_TRUE(Attend(&unverified).ok());
  const std::string read_unverified = testing::ReadLayerBytes(*h_, "seq", 1);
  Make(GetParam(), true);
  ASSERT_TRUE(Attend(&verified).ok());
  EXPECT_EQ(verified, unverified);
  EXPECT_EQ(testing::ReadLayerBytes(*h_, "seq", 1), read_unverified);
  EXPECT_EQ(Failures(), 0u);
}

TEST_P(TierChecksumTest, FlippedWindowBitIsDataLossOnRead) {
  Make(GetParam(), false);
  FlipWindow(37);
  absl::Status st = Read();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(
      absl::StrContains(st.message(),
                        "token 549 (window token 37 of tokens [512, 700)) of the bf16 window of layer 1 of sequence_id "
                        "\"seq\" fails its checksum"))
      << st;
  EXPECT_EQ(Failures(), 1u);
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
  // A Read that stops before the window is served.
  v1::ReadRequest r;
  r.set_sequence_id("seq");
  r.set_layer(1);
  r.set_token_count(512);
  EXPECT_TRUE(h_->Read(r, [](const v1::ReadChunk&) { return true; }).ok());
  FlipWindow(37);
  EXPECT_TRUE(Read().ok());
}

TEST_P(TierChecksumTest, FlippedWindowBitIsDataLossOnAttendWhenVerifying) {
  Make(GetParam(), true);
  FlipWindow(187);  // the newest token
  absl::Status st = Attend();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "items[0]: token 699 (window token 187")) << st;
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
}

TEST_P(TierChecksumTest, CorruptWindowIsNotEncodedIntoAPage) {
  Make(GetParam(), false);
  FlipWindow(0);  // the oldest: the next page takes it
  // 128 more tokens make the window 316 >= R + P: its oldest 128 tokens
  // would be encoded into page 4 with a fresh, valid checksum.
  absl::Status st = testing::PushTokens(*h_, "seq", 1, kv_, kTokens, kP, kP);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "the window is corrupt and is not encoded into a page")) << st;
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
  EXPECT_EQ(Length(), kTokens);  // nothing stored
  EXPECT_EQ(Pages().size(), static_cast<size_t>(kPages));
  // A decode step that would encode the page is refused the same way.
  FlipWindow(0);                                                           // intact again
  ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, kTokens, 67).ok());  // window 255 = R + P - 1
  const int step = kTokens + 67;
  v1::AttendRequest a;
  v1::AttendItem* it = a.add_items();
  *it = testing::QueryItem("seq", 1, testing::SyntheticQuery(4, 64, 3), 4);
  const size_t n = testing::kSmallN;
  it->set_new_key(std::string(reinterpret_cast<const char*>(kv_.keys.data() + step * n), n * 4));
  it->set_new_value(std::string(reinterpret_cast<const char*>(kv_.values.data() + step * n), n * 4));
  FlipWindow(3);
  v1::AttendResponse resp;
  st = h_->Attend(a, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "(window token 3 of tokens [512, 767)) of the bf16 window")) << st;
  EXPECT_EQ(Counted(kCheckWindow), 2.0);
  EXPECT_EQ(Length(), step);
  FlipWindow(3);
  ASSERT_TRUE(h_->Attend(a, &resp).ok());  // intact: the step encodes page 4
  EXPECT_EQ(Pages().size(), static_cast<size_t>(kPages + 1));
  EXPECT_EQ(Length(), step + 1);
  EXPECT_TRUE(Read().ok());
}

// Steps of several layers that each fill a page: a corrupt window among
// them is refused before anything of the batch is stored.
TEST_P(TierChecksumTest, CorruptWindowInABatchOfFillingStepsIsNotEncoded) {
  Make(GetParam(), false);
  ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, kTokens, 67).ok());  // window 255 = R + P - 1
  ASSERT_TRUE(testing::PushTokens(*h_, "other", 1, kv_, 0, kTokens + 67).ok());
  const int step = kTokens + 67;
  const size_t n = testing::kSmallN;
  v1::AttendRequest a;
  for (const char* id : {"seq", "other"}) {
    v1::AttendItem* it = a.add_items();
    *it = testing::QueryItem(id, 1, testing::SyntheticQuery(4, 64, 3), 4);
    it->set_new_key(std::string(reinterpret_cast<const char*>(kv_.keys.data() + step * n), n * 4));
    it->set_new_value(std::string(reinterpret_cast<const char*>(kv_.values.data() + step * n), n * 4));
  }
  const size_t pages_before = Pages().size();
  const uint64_t in_use = Held();
  FlipWindow(3);
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(a, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[0]")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "(window token 3 of tokens [512, 767)) of the bf16 window")) << st;
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
  EXPECT_EQ(Length(), step);  // nothing stored, on either layer
  EXPECT_EQ(Pages().size(), pages_before);
  EXPECT_EQ(Held(), in_use);
  FlipWindow(3);
  ASSERT_TRUE(h_->Attend(a, &resp).ok());  // intact: both steps encode a page
  EXPECT_EQ(Pages().size(), pages_before + 1);
  EXPECT_EQ(Length(), step + 1);
  EXPECT_TRUE(Read().ok());
}

// Steps that fill pages on three layers, stored together: a corrupt window
// in the middle one fails it by name after the first is stored; the last
// stores nothing, and each failure is counted once.
TEST_P(TierChecksumTest, CorruptWindowAmongFillingStepsStoresThoseBeforeIt) {
  Make(GetParam(), false);
  ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, kTokens, 67).ok());  // window 255 = R + P - 1
  ASSERT_TRUE(testing::PushTokens(*h_, "first", 1, kv_, 0, kTokens + 67).ok());
  ASSERT_TRUE(testing::PushTokens(*h_, "last", 1, kv_, 0, kTokens + 67).ok());
  const int step = kTokens + 67;
  const size_t n = testing::kSmallN;
  v1::AttendRequest a;
  for (const char* id : {"first", "seq", "last"}) {
    v1::AttendItem* it = a.add_items();
    *it = testing::QueryItem(id, 1, testing::SyntheticQuery(4, 64, 3), 4);
    it->set_new_key(std::string(reinterpret_cast<const char*>(kv_.keys.data() + step * n), n * 4));
    it->set_new_value(std::string(reinterpret_cast<const char*>(kv_.values.data() + step * n), n * 4));
    it->set_new_token_index(step);  // a retry repeats the step
  }
  const uint64_t in_use = Held();
  FlipWindow(3);
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(a, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[1]")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "(window token 3 of tokens [512, 767)) of the bf16 window")) << st;
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
  EXPECT_EQ(Length("first"), step + 1);
  EXPECT_EQ(Length("seq"), step);
  EXPECT_EQ(Length("last"), step);
  EXPECT_EQ(Held(), in_use + 1);
  FlipWindow(3);
  ASSERT_TRUE(h_->Attend(a, &resp).ok());  // the first step repeats; the others store
  EXPECT_EQ(Length("first"), step + 1);
  EXPECT_EQ(Length("seq"), step + 1);
  EXPECT_EQ(Length("last"), step + 1);
  EXPECT_EQ(Held(), in_use + 3);
  EXPECT_TRUE(Read().ok());
}

TEST_P(TierChecksumTest, CorruptWindowIsNotWrittenToTheSnapshot) {
  Make(GetParam(), false);
  FlipWindow(100);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/window_snapshot_", GetParam());
  std::filesystem::create_directories(dir);
  Handler::SnapshotSummary written;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.sequences, 0u);
  EXPECT_EQ(written.dropped_sequences, 1u);
  EXPECT_EQ(Counted(kCheckWindow), 1.0);
}

// A cold page whose bytes changed after encoding stays cold: promotion
// would turn it into a level page with a valid-looking hot checksum. The
// Attend that promotes (sync) answers DATA_LOSS, verifying or not.
TEST_F(TierChecksumTest, CorruptColdPageIsNotPromoted) {
  for (bool verify : {false, true}) {
    SCOPED_TRACE(verify);
    HandlerFixture::Make(Options(true, verify));
    kv_ = testing::SyntheticKv(kTokens, testing::kSmallN, 9);
    ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, 0, kTokens).ok());
    const std::vector<PageId> pages = Pages();
    const double counted = Counted(kCheckPromote);                    // metrics_ outlives each handler
    h_->pool().page(pages[2])[h_->pool().page_stride() - 1] ^= 0x80;  // page 2's mean record
    absl::Status st = Attend();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "items[0]: page 2 (tokens [256, 384)) of layer 1 of sequence_id"))
        << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "the page is corrupt and is not promoted")) << st;
    EXPECT_FALSE(h_->LayerIsHot("seq", 1));
    EXPECT_EQ(Counted(kCheckPromote), counted + 1.0);
    EXPECT_EQ(h_->hot_pool()->pages_in_use(), 0);
    h_->pool().page(pages[2])[h_->pool().page_stride() - 1] ^= 0x80;
    EXPECT_TRUE(Attend().ok());
    EXPECT_TRUE(h_->LayerIsHot("seq", 1));
  }
}

// An Attend's cold layers are promoted together: a corrupt cold page in
// the second of three stops it and the third; the first goes hot; each
// failure is counted once; once mended, all three promote.
TEST_F(TierChecksumTest, CorruptColdPageAmongLayersPromotedTogether) {
  HandlerFixture::Make(Options(true, false));
  kv_ = testing::SyntheticKv(kTokens, testing::kSmallN, 9);
  v1::AttendRequest a;
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(testing::PushTokens(*h_, id, 1, kv_, 0, kTokens).ok());
    *a.add_items() = testing::QueryItem(id, 1, testing::SyntheticQuery(2, 64, 1), 2);
  }
  std::vector<PageId> b_pages;
  ASSERT_TRUE(h_->WithLayerForTest("b", 1, [&](LayerState& l) { b_pages = l.pages; }));
  const double counted = Counted(kCheckPromote);
  h_->pool().page(b_pages[3])[h_->pool().page_stride() - 1] ^= 0x80;
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(a, &resp);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[1]: page 3 (tokens [384, 512)) of layer 1 of sequence_id \"b\""))
      << st;
  EXPECT_EQ(Counted(kCheckPromote), counted + 1.0);
  EXPECT_TRUE(h_->LayerIsHot("a", 1));
  EXPECT_FALSE(h_->LayerIsHot("b", 1));
  EXPECT_FALSE(h_->LayerIsHot("c", 1));
  EXPECT_EQ(h_->hot_pool()->pages_in_use(), static_cast<int64_t>(b_pages.size()));
  h_->pool().page(b_pages[3])[h_->pool().page_stride() - 1] ^= 0x80;
  ASSERT_TRUE(h_->Attend(a, &resp).ok());
  for (const char* id : {"a", "b", "c"}) EXPECT_TRUE(h_->LayerIsHot(id, 1)) << id;
  EXPECT_EQ(h_->hot_pool()->pages_in_use(), static_cast<int64_t>(3 * b_pages.size()));
}

// Prefetch promotes a sequence's layers together: a corrupt cold page of
// the second layer is DATA_LOSS naming it, the first layer goes hot, the
// second stays cold; repaired, a second Prefetch promotes it.
TEST_F(TierChecksumTest, PrefetchNamesACorruptColdPageAndPromotesTheLayersBefore) {
  HandlerFixture::Make(Options(true, false));
  kv_ = testing::SyntheticKv(kTokens, testing::kSmallN, 9);
  for (uint32_t layer : {0u, 1u}) ASSERT_TRUE(testing::PushTokens(*h_, "seq", layer, kv_, 0, kTokens).ok());
  const std::vector<PageId> pages = Pages();  // layer 1's
  h_->pool().page(pages[3])[h_->pool().page_stride() - 1] ^= 0x80;
  v1::PrefetchRequest p;
  p.set_sequence_id("seq");
  v1::PrefetchResponse r;
  absl::Status st = h_->Prefetch(p, &r);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "page 3 (tokens [384, 512)) of layer 1 of sequence_id \"seq\"")) << st;
  EXPECT_TRUE(h_->LayerIsHot("seq", 0));
  EXPECT_FALSE(h_->LayerIsHot("seq", 1));
  h_->pool().page(pages[3])[h_->pool().page_stride() - 1] ^= 0x80;
  r.Clear();
  ASSERT_TRUE(h_->Prefetch(p, &r).ok());
  EXPECT_EQ(r.layers_promoted(), 1u);
  EXPECT_TRUE(h_->LayerIsHot("seq", 1));
}

TEST_F(TierChecksumTest, FlippedHotPageBitIsDataLossOnRead) {
  Make(true, false);
  const std::vector<PageId> pages = Pages();
  h_->hot_pool()->page(pages[1])[4321] ^= 0x01;
  absl::Status st = Read();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(),
                                "hot page 1 (tokens [128, 256)) of layer 1 of sequence_id \"seq\" "
                                "fails the checksum of its hot form"))
      << st;
  EXPECT_EQ(Counted(kCheckRead), 1.0);
  h_->hot_pool()->page(pages[1])[4321] ^= 0x01;
  EXPECT_TRUE(Read().ok());
}

TEST_F(TierChecksumTest, FlippedHotPageBitIsDataLossOnAttendWhenVerifying) {
  Make(true, true);
  const std::vector<PageId> pages = Pages();
  h_->hot_pool()->page(pages[3])[h_->hot_pool()->page_stride() - 1] ^= 0x40;
  absl::Status st = Attend();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StartsWith(st.message(), "items[0]: hot page 3 (tokens [384, 512)) of layer 1")) << st;
  EXPECT_EQ(Counted(kCheckAttend), 1.0);
}

// Demotion checks the hot form before converting it back: an Append that
// needs a hot page when the tier is full demotes the layer, and answers
// the DATA_LOSS naming the hot page; the layer stays hot. (Without cold
// copies: a page with a copy is not converted; the next test.)
TEST_F(TierChecksumTest, FlippedHotPageBitIsRefusedOnDemotion) {
  Make(true, false, kPages, /*copies=*/false);
  const std::vector<PageId> pages = Pages();
  h_->hot_pool()->page(pages[0])[777] ^= 0x02;
  absl::Status st = testing::PushTokens(*h_, "seq", 1, kv_, kTokens, kP, kP);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(),
                                "hot page 0 (tokens [0, 128)) of layer 1 of sequence_id \"seq\" "
                                "fails the checksum of its hot form"))
      << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "is not demoted")) << st;
  EXPECT_TRUE(h_->LayerIsHot("seq", 1));
  EXPECT_EQ(Length(), kTokens);
  EXPECT_EQ(Counted(kCheckDemote), 1.0);
}

// With cold copies the same demotion goes back to the copies, whose own
// checksums hold: the corrupt hot page is dropped unread, nothing is lost,
// and the layer's pages answer as before.
TEST_F(TierChecksumTest, FlippedHotPageBitWithACopyIsDemotedToTheCopy) {
  Make(true, false, kPages);
  ASSERT_EQ(Stats().cold_copy_pages(), static_cast<uint64_t>(kPages));
  const std::vector<PageId> pages = Pages();
  h_->hot_pool()->page(pages[0])[777] ^= 0x02;
  ASSERT_TRUE(testing::PushTokens(*h_, "seq", 1, kv_, kTokens, kP, kP).ok());
  EXPECT_FALSE(h_->LayerIsHot("seq", 1));
  EXPECT_EQ(Length(), kTokens + kP);
  EXPECT_EQ(Stats().pages_demoted_from_copies(), static_cast<uint64_t>(kPages));
  EXPECT_EQ(Failures(), 0u);
  EXPECT_TRUE(Read().ok());  // every cold page against its checksum
}

}  // namespace
}  // namespace driftkv
