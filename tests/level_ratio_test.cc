// The levels below the pool at the ratio of 1 : 8 : 32 (pool, host memory,
// disk) with pages of the production shape, on the CPU backend: the
// capacity the three give (docs/tiers.md, "Capacity") and every sequence
// checked after its moves. The same fill as bench/level_capacity_bench.cc
// at 1/128 of its size. Its own target: 30-40 s, too long for the
// ThreadSanitizer suite.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/disk_test_util.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::FixtureClock;
using testing::SmallOptions;
using testing::TestHandler;
using tiers::testing::ScratchDir;

constexpr int kLayers = 2, kN = 8 * 128, kPage = 128, kTokens = 9 * kPage;  // 8 pages and a window a layer
constexpr int kSeqPages = kLayers * 8;

absl::Status Add(TestHandler& t, const std::string& id, uint32_t seed) {
  for (int l = 0; l < kLayers; ++l) {
    const testing::Kv kv = testing::SyntheticKv(kTokens, kN, seed * 7 + static_cast<uint32_t>(l));
    v1::AppendResponse r;
    if (absl::Status st =
            t.h->Append(testing::ChunkOfRows(id, l, 0, kTokens, kv.keys.data(), kv.values.data(), kN), &r);
        !st.ok()) {
      return st;
    }
  }
  return absl::OkStatus();
}

// Both layers attended and read.
std::string Answer(TestHandler& t, const std::string& id) {
  v1::AttendRequest req;
  for (int l = 0; l < kLayers; ++l) {
    *req.add_items() = testing::QueryItem(id, l, testing::SyntheticQuery(32, 128, 11 + l), 32);
  }
  v1::AttendResponse resp;
  absl::Status st = t.h->Attend(req, &resp);
  if (!st.ok()) return st.ToString();
  std::string out;
  for (const v1::AttendResult& r : resp.results()) {
    out += r.output();
    out.append(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * sizeof(float));
  }
  return out + t.Read(id, 0) + t.Read(id, 1);
}

// Pages of the production shape (8 KV heads x 128, 128 tokens: 74,304
// bytes; on disk 74,752 in 512-byte blocks, 77,824 where the device needs
// 4096-byte blocks, plus a footer entry), a pool of 7 sequences of 16
// pages, a host level of 8 pools' bytes and a disk level of 32. Filled as
// the capacity benchmark does: s0, forks of all its pages (each fork that
// moves below gets its own copy), then distinct sequences until Append is
// refused. Counted in sequence-equivalents (the sequences below plus the
// pool's pages in use over 16): 40.7x by arithmetic with 512-byte blocks,
// 39.5x with 4096, less each level's swap room. Then every sequence
// checked against its answer from before the moves, newest first, each
// released after.
TEST(LevelRatioTest, PoolHostAndDiskAtOneToEightToThirtyTwo) {
  ServiceOptions o = SmallOptions(0);
  o.layers = kLayers;
  o.codec.kv_heads = 8;
  o.codec.head_dim = 128;
  o.codec.mean_window = kPage;
  o.window_tokens = kPage;
  o.max_sequences = 4096;
  uint64_t stride = 0;
  {
    ServiceOptions p = o;
    p.pool_bytes = 1u << 20;
    TestHandler probe(p);
    ASSERT_NE(probe.h, nullptr);
    stride = probe.h->pool().page_stride();
  }
  o.pool_bytes = 7 * kSeqPages * stride;
  o.host_level.budget_bytes = 8 * o.pool_bytes;
  o.disk_level.dir = ScratchDir("ratio");
  o.disk_level.budget_bytes = 32 * o.pool_bytes;
  o.disk_level.segment_bytes = 64u << 20;
  TestHandler t(o, FixtureClock::kReal);
  ASSERT_NE(t.h, nullptr);
  constexpr int kForks = 320;
  ASSERT_TRUE(Add(t, "s0", 0).ok());
  const std::string s0 = Answer(t, "s0");
  for (int i = 1; i <= kForks; ++i) {
    v1::ForkRequest f;
    f.set_source_sequence_id("s0");
    f.set_sequence_id(absl::StrCat("f", i));
    f.set_tokens(8 * kPage);
    v1::ForkResponse fr;
    ASSERT_TRUE(t.h->Fork(f, &fr).ok()) << i;
  }
  const std::string fork = Answer(t, "f1");
  std::vector<std::string> distinct;
  absl::Status refused;
  for (int d = 1; d < 100; ++d) {
    const std::string id = absl::StrCat("d", d);
    refused = Add(t, id, static_cast<uint32_t>(d));
    if (!refused.ok()) {
      v1::ReleaseRequest r;  // partly appended, or not at all
      r.set_sequence_id(id);
      v1::ReleaseResponse rr;
      t.h->Release(r, &rr).IgnoreError();
      break;
    }
    distinct.push_back(Answer(t, id));
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  SpillTier& tier = *t.h->spill_tier();
  const double held =
      static_cast<double>(tier.sequences_below()) + static_cast<double>(t.h->pool().pages_in_use(0)) / kSeqPages;
  const double ratio = held / 7;
  const uint32_t block = tier.disk_store()->block_bytes();
  std::printf(
      "pool of 7 sequences of %d pages of %llu bytes; host level 8x, disk 32x its bytes (blocks of %u bytes): "
      "%.2f sequence-equivalents held (%.2fx): %lld on the host level, %lld on disk, %lld pool pages\n",
      kSeqPages, static_cast<unsigned long long>(stride), block, held, ratio,
      static_cast<long long>(tier.sequences_on_host()),
      static_cast<long long>(tier.sequences_below() - tier.sequences_on_host()),
      static_cast<long long>(t.h->pool().pages_in_use(0)));
  EXPECT_GE(ratio, block == tiers::kMinBlock ? 40.0 : 39.0);
  auto check = [&](const std::string& id, const std::string& want) {
    EXPECT_EQ(Answer(t, id), want) << id;
    v1::ReleaseRequest r;
    r.set_sequence_id(id);
    v1::ReleaseResponse rr;
    EXPECT_TRUE(t.h->Release(r, &rr).ok()) << id;
  };
  for (size_t d = distinct.size(); d > 0; --d) check(absl::StrCat("d", d), distinct[d - 1]);
  for (int i = kForks; i >= 1; --i) check(absl::StrCat("f", i), fork);
  check("s0", s0);
}

}  // namespace
}  // namespace driftkv
