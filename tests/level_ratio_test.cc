// The levels below the pool at the ratio of 1 : 8 : 32 (pool, host memory,
// disk) with pages of the production shape, on the CPU backend: the
// capacity the three give (docs/tiers.md, "Figures") and every token read
// back bit-identical after its moves. Its own target: 10-30 s, too long
// for the ThreadSanitizer suite.
#include <cstdint>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/disk_test_util.h"
#include "tests/handler_fixture.h"
#include "tests/level_test_util.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::FixtureClock;
using testing::LevelId;
using testing::SmallOptions;
using testing::TestHandler;
using tiers::testing::ScratchDir;

// The levels at the ratio of 1 : 8 : 32 (pool, host level, disk) with
// pages of the production shape (8 KV heads x 128, 128 tokens: 74,304
// bytes, 77,856 on disk with the record's header, padding to 4 KiB and
// footer entry), a pool of 8 pages: how many times the pool's sequences
// the three hold (39.5x by arithmetic: docs/tiers.md), and every one of
// them read back bit-identical afterwards.
TEST(LevelRatioTest, PoolHostAndDiskAtOneToEightToThirtyTwo) {
  ServiceOptions o = SmallOptions(0);
  o.layers = 1;
  o.codec.kv_heads = 8;
  o.codec.head_dim = 128;
  o.codec.mean_window = 128;
  o.window_tokens = 128;
  o.max_sequences = 4096;
  constexpr int kN = 8 * 128, kTokens = 3 * 128;  // two pages and a window
  uint64_t stride = 0;
  {
    ServiceOptions p = o;
    p.pool_bytes = 1u << 20;
    TestHandler probe(p);
    ASSERT_NE(probe.h, nullptr);
    stride = probe.h->pool().page_stride();
  }
  o.pool_bytes = 8 * stride;
  ServiceOptions never = o;
  never.pool_bytes = 400 * stride;
  o.host_level.budget_bytes = 8 * o.pool_bytes;
  o.disk_level.dir = ScratchDir("ratio");
  o.disk_level.budget_bytes = 32 * o.pool_bytes;
  o.disk_level.segment_bytes = 64u << 20;  // one segment: its overhead is one block and a trailer
  TestHandler levels(o, FixtureClock::kReal);
  TestHandler never_moved(never);
  auto add = [&](TestHandler& t, int i) {
    const testing::Kv kv = testing::SyntheticKv(kTokens, kN, 500 + i);
    v1::AppendResponse r;
    return t.h->Append(testing::ChunkOfRows(LevelId(i), 0, 0, kTokens, kv.keys.data(), kv.values.data(), kN), &r);
  };
  const int pool_only = static_cast<int>(o.pool_bytes / stride) / 2;
  int held = 0;
  absl::Status last;
  while ((last = add(levels, held)).ok()) {
    ASSERT_TRUE(add(never_moved, held).ok());
    ++held;
    ASSERT_LT(held, 60 * pool_only) << "the levels never filled";
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  const double ratio = static_cast<double>(held) / pool_only;
  std::printf(
      "pool of %d pages (%d sequences of 2 pages); host level 8x, disk 32x its bytes: %d sequences held "
      "(%.2fx), %lld on the host level, %lld on disk\n",
      static_cast<int>(o.pool_bytes / stride), pool_only, held, ratio,
      static_cast<long long>(levels.h->spill_tier()->sequences_on_host()),
      static_cast<long long>(levels.h->spill_tier()->sequences_below() - levels.h->spill_tier()->sequences_on_host()));
  EXPECT_GE(ratio, 39.0);
  // Each sequence read back, oldest first, then released. A read swaps
  // its sequence with one in the pool, which takes the host level's swap
  // room, whose sequence moves on to disk; the disk's swap room is used
  // once and not given back, because the space of erased records is kept
  // until their segment empties (one segment here; docs/tiers.md, "Not
  // built yet": compaction). The newest five go first; each read then
  // restores into the room the previous release left.
  auto release = [&](int i) {
    v1::ReleaseRequest r;
    r.set_sequence_id(LevelId(i));
    v1::ReleaseResponse rr;
    return levels.h->Release(r, &rr);
  };
  for (int i = held - 1; i >= held - 5; --i) ASSERT_TRUE(release(i).ok()) << i;
  for (int i = 0; i < held - 5; ++i) {
    ASSERT_EQ(levels.Read(LevelId(i), 0), never_moved.Read(LevelId(i), 0)) << "sequence " << i;
    ASSERT_TRUE(release(i).ok()) << i;
  }
}

}  // namespace
}  // namespace driftkv
