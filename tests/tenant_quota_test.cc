// Tenants' quotas with tokens, through the handler without a network, from
// a config and a tokens file as a server reads them (tests/tenant_config.h):
// every tenant is guaranteed its share of max_sequences, and tenants are
// charged in bytes for what they hold (cold and hot pages at their page
// size, bf16 windows), before the memory is taken, refunded when it is
// freed, and again after a snapshot restore.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "tests/tenant_config.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::ChunkOf;
using testing::SyntheticKv;
using testing::TenantOptions;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN;
constexpr int64_t kWindowToken = 4 * kN;  // bf16 keys and values of one window token

absl::Status Append(Handler& h, const std::string& tenant, const std::string& seq, uint32_t layer, uint64_t first,
                    uint32_t count, const testing::Kv& kv) {
  v1::AppendResponse r;
  return h.Append(ChunkOf(seq, layer, first, count, kv), &r, tenant);
}

v1::StatsResponse StatsOf(Handler& h, const std::string& tenant) {
  v1::StatsResponse s;
  h.Stats(&s, tenant);
  return s;
}

absl::Status Release(Handler& h, const std::string& tenant, const std::string& seq) {
  v1::ReleaseRequest req;
  req.set_sequence_id(seq);
  v1::ReleaseResponse r;
  return h.Release(req, &r, tenant);
}

// The documented setup (only tenant_max_pages) and max_sequences 8: a tenant
// holding no page opens one-token sequences until it is refused, and the
// other tenant still creates its first.
TEST(TenantQuotaTest, OneTenantCannotTakeEverySequence) {
  absl::StatusOr<ServiceOptions> o =
      TenantOptions("share", "max_sequences: 8 tenant_max_pages: 20000", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->QuotaOf("alice").max_sequences, 4u);
  TestHandler t(*o);
  ASSERT_NE(t.h, nullptr);
  const testing::Kv kv = SyntheticKv(1, kN, 1);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Append(*t.h, "alice", absl::StrCat(i), 0, 0, 1, kv).ok()) << i;
  absl::Status st = Append(*t.h, "alice", "4", 0, 0, 1, kv);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(), "tenant \"alice\" quota max_sequences 4: it holds 4 sequences and this call needs 1 more"))
      << st;
  st = Append(*t.h, "bob", "0", 0, 0, 1, kv);
  EXPECT_TRUE(st.ok()) << st;
}

TEST(TenantQuotaTest, SharesLeaveOutTenantsWithTheirOwnLimit) {
  absl::StatusOr<ServiceOptions> o =
      TenantOptions("lines", "max_sequences: 10", {"alice max_sequences=6", "bob", "carol"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->QuotaOf("alice").max_sequences, 6u);
  EXPECT_EQ(o->QuotaOf("bob").max_sequences, 2u);
  EXPECT_EQ(o->QuotaOf("carol").max_sequences, 2u);
  // An explicit default that fits is every tenant's.
  o = TenantOptions("fits", "max_sequences: 10 tenant_max_sequences: 5", {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->QuotaOf("bob").max_sequences, 5u);
}

// Limits that cannot all be met are refused at start, naming the fields
// and their values.
TEST(TenantQuotaTest, LimitsThatBreakTheGuaranteeAreRefusedAtStart) {
  struct Case {
    std::string config;
    std::vector<std::string> lines;
    std::string message;
  };
  const Case cases[] = {
      {"max_sequences: 8 tenant_max_sequences: 0", {"alice", "bob"}, "tenant_max_sequences 0 (unlimited) with"},
      {"max_sequences: 8", {"alice max_sequences=0", "bob"}, "tenant \"alice\" max_sequences=0 (unlimited)"},
      {"max_sequences: 8 tenant_max_sequences: 5",
       {"alice", "bob"},
       "add up to 10 (alice 5, bob 5; tenant_max_sequences 5 where no max_sequences= line is given) but "
       "max_sequences is 8"},
      {"max_sequences: 8", {"alice max_sequences=8", "bob"}, "max_sequences 8 leaves no share for the 1 tenants"},
  };
  int i = 0;
  for (const Case& c : cases) {
    absl::StatusOr<ServiceOptions> o = TenantOptions(absl::StrCat("bad", i++), c.config, c.lines);
    EXPECT_EQ(o.status().code(), C::kInvalidArgument) << c.config << ": " << o.status();
    EXPECT_TRUE(absl::StrContains(o.status().message(), c.message)) << o.status();
  }
}

// One-token sequences hold nothing in the pool but a window token per
// layer each: charged in bytes as the windows grow, refused before they
// grow past tenant_max_bytes, refunded on release.
TEST(TenantQuotaTest, WindowTokensAreChargedInBytes) {
  absl::StatusOr<ServiceOptions> o =
      TenantOptions("windows", absl::StrCat("tenant_max_bytes: ", 5 * kWindowToken), {"alice", "bob"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  ASSERT_NE(t.h, nullptr);
  const testing::Kv kv = SyntheticKv(8, kN, 2);
  ASSERT_TRUE(Append(*t.h, "alice", "a", 0, 0, 1, kv).ok());
  ASSERT_TRUE(Append(*t.h, "alice", "a", 1, 0, 1, kv).ok());
  ASSERT_TRUE(Append(*t.h, "alice", "b", 0, 0, 3, kv).ok());
  absl::Status st = Append(*t.h, "alice", "b", 0, 3, 1, kv);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(), absl::StrCat("tenant \"alice\" quota max_bytes ", 5 * kWindowToken, ": it holds ", 5 * kWindowToken,
                                 " bytes (cold pages 0, hot pages 0, windows ", 5 * kWindowToken,
                                 ") and this call needs ", kWindowToken, " more (windows +", kWindowToken, ")")))
      << st;
  // A new sequence's first chunk is refused the same way, and the sequence
  // is not left behind.
  st = Append(*t.h, "alice", "c", 0, 0, 1, kv);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_EQ(StatsOf(*t.h, "alice").sequences(), 2u);
  // Stats shows the caller's bytes and quota.
  EXPECT_EQ(StatsOf(*t.h, "alice").tenant_bytes(), static_cast<uint64_t>(5 * kWindowToken));
  EXPECT_EQ(StatsOf(*t.h, "alice").tenant_max_bytes(), static_cast<uint64_t>(5 * kWindowToken));
  // Another tenant has its own quota.
  EXPECT_TRUE(Append(*t.h, "bob", "b", 0, 0, 5, kv).ok());
  // Releasing gives the bytes back.
  ASSERT_TRUE(Release(*t.h, "alice", "b").ok());
  EXPECT_EQ(StatsOf(*t.h, "alice").tenant_bytes(), static_cast<uint64_t>(2 * kWindowToken));
  EXPECT_TRUE(Append(*t.h, "alice", "c", 0, 0, 3, kv).ok());
  EXPECT_EQ(Append(*t.h, "alice", "c", 0, 3, 1, kv).code(), C::kResourceExhausted);
}

// A page is charged at the cold page size and takes its tokens out of the
// window: a step that encodes a page shrinks what the tenant holds, and is
// accepted even at the quota.
TEST(TenantQuotaTest, PagesAreChargedAtThePageSize) {
  int64_t stride = 0;
  {
    absl::StatusOr<ServiceOptions> probe = TenantOptions("probe", "", {"alice"});
    ASSERT_TRUE(probe.ok()) << probe.status();
    TestHandler t(*probe);
    ASSERT_NE(t.h, nullptr);
    stride = static_cast<int64_t>(t.h->pool().page_stride());
  }
  // 63 tokens: R + P - 1 window tokens, no page yet.
  const int64_t limit = 63 * kWindowToken;
  absl::StatusOr<ServiceOptions> o = TenantOptions("pages", absl::StrCat("tenant_max_bytes: ", limit), {"alice"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  ASSERT_NE(t.h, nullptr);
  const testing::Kv kv = SyntheticKv(66, kN, 3);
  ASSERT_TRUE(Append(*t.h, "alice", "s", 0, 0, 63, kv).ok());
  // The 64th token encodes a page of 32 tokens: stride - 31 window tokens.
  ASSERT_LT(stride, 31 * kWindowToken);
  absl::Status st = Append(*t.h, "alice", "s", 0, 63, 1, kv);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(t.Stats().pages_in_use(), 1u);
  const int64_t held = stride + 32 * kWindowToken;
  EXPECT_EQ(StatsOf(*t.h, "alice").tenant_bytes(), static_cast<uint64_t>(held));
  // Another layer's 31 tokens fit; the next does not, and the message
  // shows the page.
  const int64_t room = (limit - held) / kWindowToken;
  ASSERT_TRUE(Append(*t.h, "alice", "s", 1, 0, static_cast<uint32_t>(room), kv).ok());
  st = Append(*t.h, "alice", "s", 1, static_cast<uint64_t>(room), 1, kv);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(
      absl::StrContains(st.message(), absl::StrCat("it holds ", held + room * kWindowToken, " bytes (cold pages ",
                                                   stride, ", hot pages 0, windows ", (32 + room) * kWindowToken, ")")))
      << st;
}

// A decode step (an Attend item with a new token) grows a window: charged
// like an Append.
TEST(TenantQuotaTest, ADecodeStepIsChargedForItsToken) {
  absl::StatusOr<ServiceOptions> o =
      TenantOptions("step", absl::StrCat("tenant_max_bytes: ", 2 * kWindowToken), {"alice"});
  ASSERT_TRUE(o.ok()) << o.status();
  TestHandler t(*o);
  ASSERT_NE(t.h, nullptr);
  const testing::Kv kv = SyntheticKv(3, kN, 4);
  ASSERT_TRUE(Append(*t.h, "alice", "d", 0, 0, 2, kv).ok());
  const std::vector<float> q = testing::SyntheticQuery(2, 64, 5);
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  *it = testing::QueryItem("d", 0, q, 2);
  FloatToTensor(kv.keys.data() + 2 * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
  FloatToTensor(kv.values.data() + 2 * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
  v1::AttendResponse resp;
  absl::Status st = t.h->Attend(req, &resp, "alice");
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(), absl::StrCat("quota max_bytes ", 2 * kWindowToken, ": it holds ", 2 * kWindowToken, " bytes")))
      << st;
  v1::LengthRequest lr;
  lr.set_sequence_id("d");
  v1::LengthResponse len;
  ASSERT_TRUE(t.h->Length(lr, &len, "alice").ok());
  EXPECT_EQ(len.layers(0).tokens(), 2u);
}

// A restored sequence is charged again for its pages and windows: the
// quota holds across a warm restart.
TEST(TenantQuotaTest, SnapshotRestoreChargesTheBytesAgain) {
  const int64_t limit = 80 * kWindowToken;
  absl::StatusOr<ServiceOptions> o = TenantOptions("restore", absl::StrCat("tenant_max_bytes: ", limit), {"alice"});
  ASSERT_TRUE(o.ok()) << o.status();
  const std::string dir = absl::StrCat(::testing::TempDir(), "/tenant-quota-restore");
  ASSERT_EQ(std::system(absl::StrCat("rm -rf ", dir, " && mkdir -p ", dir).c_str()), 0);
  const testing::Kv kv = SyntheticKv(100, kN, 6);
  std::string refused;
  {
    TestHandler t(*o);
    ASSERT_NE(t.h, nullptr);
    ASSERT_TRUE(Append(*t.h, "alice", "s", 0, 0, 70, kv).ok());
    ASSERT_TRUE(Append(*t.h, "alice", "s", 1, 0, 20, kv).ok());
    absl::Status st = Append(*t.h, "alice", "t", 0, 0, 100, kv);
    ASSERT_EQ(st.code(), C::kResourceExhausted) << st;
    refused = std::string(st.message());
    Handler::SnapshotSummary s;
    ASSERT_TRUE(t.h->WriteSnapshot(dir, &s).ok());
  }
  TestHandler t(*o);
  ASSERT_NE(t.h, nullptr);
  Handler::SnapshotSummary s;
  ASSERT_TRUE(t.h->LoadSnapshot(dir, &s).ok());
  EXPECT_EQ(s.sequences, 1u);
  absl::Status st = Append(*t.h, "alice", "t", 0, 0, 100, kv);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_EQ(st.message(), refused);
  // Idle expiry gives the bytes back too.
  EXPECT_GT(StatsOf(*t.h, "alice").tenant_bytes(), 0u);
  ServiceOptions expiring = *o;
  expiring.ttl_seconds = 10;
  TestHandler e(expiring);
  ASSERT_NE(e.h, nullptr);
  ASSERT_TRUE(Append(*e.h, "alice", "s", 0, 0, 70, kv).ok());
  e.Advance(11);
  EXPECT_EQ(e.h->ExpireIdle(), 1);
  EXPECT_EQ(StatsOf(*e.h, "alice").tenant_bytes(), 0u);
}

}  // namespace
}  // namespace driftkv
