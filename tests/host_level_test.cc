// The host-memory level (service/spill_tier.h, docs/tiers.md) on the CPU
// backend, alone and above the disk level: capacity, every token and every
// Attend answer bit-identical to a handler that never moved a page, the
// least recently used sequences moving on from host memory to disk, a
// corrupted host slot reported as DATA_LOSS for its sequence only, moves
// under concurrent requests, the metrics by level and the config's checks.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/disk_test_util.h"
#include "tests/handler_fixture.h"
#include "tests/level_test_util.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::AddLevelSequence;
using testing::FixtureClock;
using testing::LevelAttendBytes;
using testing::LevelId;
using testing::LevelValue;
using testing::SmallOptions;
using testing::TestHandler;
using tiers::testing::ScratchDir;

constexpr uint64_t kPoolBytes = 160u << 10;  // a few sequences' pages
constexpr uint64_t kHostBytes = 2 * kPoolBytes;

ServiceOptions LevelOptions(uint64_t host_bytes, const std::string& disk_dir) {
  ServiceOptions o = SmallOptions(kPoolBytes);
  o.max_sequences = 4096;
  o.host_level.budget_bytes = host_bytes;
  if (!disk_dir.empty()) {
    o.disk_level.dir = disk_dir;
    o.disk_level.budget_bytes = 16u << 20;
    o.disk_level.segment_bytes = 1u << 20;
  }
  return o;
}

ServiceOptions NeverMovedOptions() {
  ServiceOptions big = SmallOptions(64u << 20);
  big.max_sequences = 4096;
  return big;
}

int PoolOnlyCapacity() {
  return testing::PoolOnlyCapacity(kPoolBytes);
}

void ExpectSameAsNeverMoved(TestHandler& moved, TestHandler& never_moved, int sequences) {
  for (int i = 0; i < sequences; ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(moved.Read(LevelId(i), layer), never_moved.Read(LevelId(i), layer))
          << "sequence " << i << " layer " << layer;
    }
  }
  for (int i = sequences - 1; i >= 0; --i) {
    absl::StatusOr<std::string> a = LevelAttendBytes(*moved.h, i);
    ASSERT_TRUE(a.ok()) << "sequence " << i << ": " << a.status();
    absl::StatusOr<std::string> b = LevelAttendBytes(*never_moved.h, i);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*a, *b) << "sequence " << i;
  }
}

TEST(HostLevelTest, AloneItHoldsItsBudgetMoreAndRefusesPastIt) {
  const int pool_only = PoolOnlyCapacity();
  ASSERT_GE(pool_only, 1);
  TestHandler host(LevelOptions(kHostBytes, ""), FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  int held = 0;
  absl::Status last;
  while ((last = AddLevelSequence(host, held)).ok()) {
    ASSERT_TRUE(AddLevelSequence(never_moved, held).ok());
    ++held;
    ASSERT_LT(held, 100 * pool_only) << "the host level never filled";
  }
  // Pool and host level together: about three pools' worth (the host
  // budget is two pools; windows stay in memory, so a little more).
  EXPECT_GE(held, 3 * pool_only - 1) << last;
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_GT(host.h->spill_tier()->sequences_on_host(), 0);
  EXPECT_EQ(host.h->spill_tier()->sequences_on_host(), host.h->spill_tier()->sequences_below());
  // With the pool and the level both full (Append refused above), every
  // sequence below still comes back: the level's swap room takes the
  // least recently used one from the pool, and the restored one's slots
  // give the room back (SWAPS in service/spill_tier.h).
  v1::ReleaseRequest r;
  r.set_sequence_id(LevelId(held));  // the one that did not fit, partly stored
  v1::ReleaseResponse rr;
  ASSERT_TRUE(host.h->Release(r, &rr).ok());
  ExpectSameAsNeverMoved(host, never_moved, held);
  EXPECT_EQ(AddLevelSequence(host, held + 1).code(), absl::StatusCode::kResourceExhausted)
      << "the swap room is not for Append";
  EXPECT_GT(LevelValue(host.metrics, "driftkv_level_moved_pages_total", "host", "down"), 0);
  EXPECT_GT(LevelValue(host.metrics, "driftkv_level_moved_pages_total", "host", "up"), 0);
  EXPECT_EQ(LevelValue(host.metrics, "driftkv_level_checksum_failures_total", "host"), 0);
  EXPECT_EQ(LevelValue(host.metrics, "driftkv_level_capacity_bytes", "host"),
            static_cast<double>(host.h->spill_tier()->host_store()->block_bytes()));
  std::printf("pool alone: %d sequences; with the host level: %d (%.1fx)\n", pool_only, held,
              static_cast<double>(held) / pool_only);
}

TEST(HostLevelTest, AboveTheDiskLevelTheOldestMoveOnToDiskAndAllComeBack) {
  const int pool_only = PoolOnlyCapacity();
  const int sequences = 12 * pool_only;
  TestHandler levels(LevelOptions(kHostBytes, ScratchDir("host_above_disk")), FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  for (int i = 0; i < sequences; ++i) {
    ASSERT_TRUE(AddLevelSequence(levels, i).ok()) << "sequence " << i;
    ASSERT_TRUE(AddLevelSequence(never_moved, i).ok());
  }
  SpillTier& tier = *levels.h->spill_tier();
  const int64_t on_host = tier.sequences_on_host();
  const int64_t on_disk = tier.sequences_below() - on_host;
  EXPECT_GT(on_host, 0);
  EXPECT_GT(on_disk, sequences / 2);
  EXPECT_EQ(LevelValue(levels.metrics, "driftkv_level_sequences", "host"), static_cast<double>(on_host));
  EXPECT_EQ(LevelValue(levels.metrics, "driftkv_level_sequences", "disk"), static_cast<double>(on_disk));
  // Least recently used first: the oldest sequence went on to disk, the
  // newest one below is on the host level. Each read brings it up from
  // where it is.
  const double disk_up = LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "disk", "up");
  const double host_up = LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "host", "up");
  EXPECT_EQ(levels.Read(LevelId(0), 0), never_moved.Read(LevelId(0), 0));
  EXPECT_GT(LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "disk", "up"), disk_up);
  EXPECT_EQ(LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "host", "up"), host_up);
  const int newest_below = sequences - pool_only - 1;
  EXPECT_EQ(levels.Read(LevelId(newest_below), 0), never_moved.Read(LevelId(newest_below), 0));
  EXPECT_GT(LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "host", "up"), host_up);
  ExpectSameAsNeverMoved(levels, never_moved, sequences);
  EXPECT_EQ(LevelValue(levels.metrics, "driftkv_level_checksum_failures_total", "host"), 0);
  EXPECT_EQ(LevelValue(levels.metrics, "driftkv_level_checksum_failures_total", "disk"), 0);
  std::printf(
      "pool alone: %d sequences; %d held with a host level of 2 pools and a disk level (%lld on host, %lld on "
      "disk after the adds)\n",
      pool_only, sequences, static_cast<long long>(on_host), static_cast<long long>(on_disk));
}

TEST(HostLevelTest, CorruptHostSlotIsDataLossForItsSequenceOnly) {
  const int pool_only = PoolOnlyCapacity();
  TestHandler host(LevelOptions(kHostBytes, ""), FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  const int n = 2 * pool_only;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(AddLevelSequence(host, i).ok());
    ASSERT_TRUE(AddLevelSequence(never_moved, i).ok());
  }
  ASSERT_GT(host.h->spill_tier()->sequences_on_host(), 0);
  // s0 moved down first, into the first slots: flip a byte of its first page.
  host.h->spill_tier()->host_store()->slot(0)[100] ^= 0x10;
  v1::ReadRequest req;
  req.set_sequence_id(LevelId(0));
  absl::Status st = host.h->Read(req, [](const v1::ReadChunk&) { return true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("host level"), std::string::npos) << st;
  EXPECT_NE(st.message().find("not served"), std::string::npos) << st;
  v1::PrefetchRequest p;
  p.set_sequence_id(LevelId(0));
  v1::PrefetchResponse pr;
  EXPECT_EQ(host.h->Prefetch(p, &pr).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(LevelAttendBytes(*host.h, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_GE(LevelValue(host.metrics, "driftkv_level_checksum_failures_total", "host"), 3);
  for (int i = 1; i < n; ++i) {
    EXPECT_EQ(host.Read(LevelId(i), 1), never_moved.Read(LevelId(i), 1)) << "sequence " << i;
  }
  // Released, its slots are free again.
  const int64_t used = host.h->spill_tier()->host_store()->in_use();
  v1::ReleaseRequest r;
  r.set_sequence_id(LevelId(0));
  v1::ReleaseResponse rr;
  EXPECT_TRUE(host.h->Release(r, &rr).ok());
  EXPECT_LT(host.h->spill_tier()->host_store()->in_use(), used);
}

TEST(HostLevelTest, ConcurrentAppendsAndReadsMoveThroughBothLevelsAndLoseNothing) {
  constexpr int kThreads = 4, kEach = 8;
  ServiceOptions o = LevelOptions(kPoolBytes, ScratchDir("host_threads"));
  o.pool_bytes = 2 * kPoolBytes;
  TestHandler levels(o, FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  std::vector<std::string> want(kThreads * kEach);
  for (int i = 0; i < kThreads * kEach; ++i) {
    ASSERT_TRUE(AddLevelSequence(never_moved, i).ok());
    want[i] = never_moved.Read(LevelId(i), 1);
  }
  const std::vector<std::string> errors = testing::AppendAndReadBack(levels, want, kThreads, kEach);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_GT(LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "host", "up"), 0);
  EXPECT_GT(LevelValue(levels.metrics, "driftkv_level_moved_pages_total", "disk", "down"), 0);
}

absl::Status Resolve(const std::string& text) {
  v1::ServerConfig c;
  const std::string base = "model { layers: 2 kv_heads: 2 head_dim: 64 } pool_bytes: 8388608 ";
  if (!google::protobuf::TextFormat::ParseFromString(base + text, &c)) return absl::InternalError("parse");
  return ResolveConfig(c).status();
}

TEST(HostLevelTest, ConfigNamesTheFieldAndTheValue) {
  EXPECT_TRUE(Resolve("host_level { budget_bytes: 1048576 }").ok());
  EXPECT_TRUE(
      Resolve("host_level { budget_bytes: 1048576 } disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 }").ok());
  // A drain's snapshot holds what is below (docs/tiers.md, "Restart").
  EXPECT_TRUE(Resolve("host_level { budget_bytes: 1048576 } snapshot_dir: \"/tmp/s\"").ok());
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"host_level { }", "host_level.budget_bytes 0 must be >= 65536"},
           {"host_level { budget_bytes: 4096 }", "host_level.budget_bytes 4096 must be >= 65536"},
       }) {
    absl::Status st = Resolve(text);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(want), std::string::npos) << st << " | " << text;
  }
}

}  // namespace
}  // namespace driftkv
