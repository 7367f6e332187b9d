// The disk level under the pool (service/spill_tier.h, docs/tiers.md): a
// CPU-backend handler with a tiny pool and a disk budget holds many times
// the sequences the pool alone holds, every token reads back bit-identical
// and Attend answers equal those of a handler that never moved a page; a
// corrupted page on disk is DATA_LOSS for its sequence only; Prefetch's
// statuses; the config's checks.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/level_page.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/disk_test_util.h"
#include "tests/handler_fixture.h"
#include "tests/level_test_util.h"
#include "tests/service_test_util.h"
#include "tiers/file_io.h"

namespace driftkv {
namespace {

using testing::FixtureClock;
using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::TestHandler;
using tiers::testing::ScratchDir;
using tiers::testing::SegmentFiles;

constexpr int kTokens = testing::kLevelTokens;
constexpr int kD = testing::kLevelD;
constexpr uint64_t kPoolBytes = 160u << 10;  // a few sequences' pages

ServiceOptions DiskOptions(const std::string& dir, uint64_t budget = 16u << 20) {
  ServiceOptions o = SmallOptions(kPoolBytes);
  o.max_sequences = 4096;
  o.disk_level.dir = dir;
  o.disk_level.budget_bytes = budget;
  o.disk_level.segment_bytes = 1u << 20;
  return o;
}

int PoolOnlyCapacity() {
  return testing::PoolOnlyCapacity(kPoolBytes);
}

// A disk level's metric.
double Counter(Metrics& m, const std::string& name, const std::string& direction = "") {
  return testing::LevelValue(m, name, "disk", direction);
}

TEST(DiskLevelTest, HoldsManyTimesThePoolAndEveryTokenComesBackBitIdentical) {
  const int pool_only = PoolOnlyCapacity();
  ASSERT_GE(pool_only, 1);
  const int sequences = 10 * pool_only;
  TestHandler disk(DiskOptions(ScratchDir("level_capacity")), FixtureClock::kReal);
  ServiceOptions big = SmallOptions(64u << 20);
  big.max_sequences = 4096;
  TestHandler never_moved(big);
  for (int i = 0; i < sequences; ++i) {
    ASSERT_TRUE(testing::AddLevelSequence(disk, i).ok())
        << "sequence " << i << " of " << sequences << " (the pool alone holds " << pool_only
        << "): " << testing::AddLevelSequence(disk, i);
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, i).ok());
  }
  EXPECT_GT(disk.h->spill_tier()->sequences_below(), sequences / 2);
  // Every sequence, oldest first: each read brings it back up (moving
  // others down), and answers as if it never moved.
  for (int i = 0; i < sequences; ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(disk.Read(testing::LevelId(i), layer), never_moved.Read(testing::LevelId(i), layer))
          << "sequence " << i << " layer " << layer;
    }
  }
  for (int i = sequences - 1; i >= 0; --i) {
    absl::StatusOr<std::string> a = testing::LevelAttendBytes(*disk.h, i);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<std::string> b = testing::LevelAttendBytes(*never_moved.h, i);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(*a, *b) << "sequence " << i;
  }
  EXPECT_GT(Counter(disk.metrics, "driftkv_level_moved_pages_total", "down"), 0);
  EXPECT_GT(Counter(disk.metrics, "driftkv_level_moved_pages_total", "up"), 0);
  EXPECT_EQ(Counter(disk.metrics, "driftkv_level_checksum_failures_total"), 0);
  std::printf("pool alone: %d sequences; with the disk level: %d (%.1fx), %lld below at the end\n", pool_only,
              sequences, static_cast<double>(sequences) / pool_only,
              static_cast<long long>(disk.h->spill_tier()->sequences_below()));
}

// The hot tier and the disk level together (level pages need P = 128):
// many sequences over a pool of a few and a hot tier of six level pages,
// the oldest prefetched (back from the disk and promoted), each attended
// in turn (brought back from the disk, promoted, demoted
// again for the next ones, moved down again), with sync and async
// promotion: every answer and every token read back equal those of a
// handler that never moved a page.
TEST(DiskLevelTest, HotTierAndDiskLevelTogether) {
  auto p128 = [](uint64_t pool_bytes) {
    ServiceOptions o = SmallOptions(pool_bytes);
    o.codec.mean_window = 128;
    o.window_tokens = 128;
    o.max_sequences = 4096;
    return o;
  };
  constexpr int kLong = 300;  // per layer: a page of 128 and a 172-token window
  auto add = [&](TestHandler& t, int i) -> absl::Status {
    const Kv kv = SyntheticKv(kLong, testing::kSmallN, 2000 + i);
    for (uint32_t layer = 0; layer < 2; ++layer) {
      if (absl::Status st = t.Push(testing::LevelId(i), layer, kv, 0, kLong); !st.ok()) return st;
    }
    return absl::OkStatus();
  };
  constexpr uint64_t kPool = 400u << 10;
  int pool_only = 0;
  {
    TestHandler t(p128(kPool));
    while (add(t, pool_only).ok()) ++pool_only;
  }
  ASSERT_GE(pool_only, 1);
  const int sequences = 6 * pool_only;
  TestHandler never_moved(p128(64u << 20));
  for (int i = 0; i < sequences; ++i) ASSERT_TRUE(add(never_moved, i).ok());
  for (HotPromotion promotion : {HotPromotion::kSync, HotPromotion::kAsync}) {
    SCOPED_TRACE(promotion == HotPromotion::kSync ? "sync" : "async");
    ServiceOptions o = p128(kPool);
    o.disk_level.dir = ScratchDir(promotion == HotPromotion::kSync ? "level_hot_sync" : "level_hot_async");
    o.disk_level.budget_bytes = 16u << 20;
    o.disk_level.segment_bytes = 1u << 20;
    o.hot_tier_bytes = 6 * MakeLevelPageLayout(2, kD)->page_bytes;
    o.hot_promotion = promotion;
    TestHandler disk(o, FixtureClock::kReal);
    for (int i = 0; i < sequences; ++i) ASSERT_TRUE(add(disk, i).ok()) << "sequence " << i;
    EXPECT_GT(disk.h->spill_tier()->sequences_below(), 0);
    {
      // Prefetch of the oldest (below by now): back from the disk, then
      // both layers promoted (sync) or queued (async).
      v1::PrefetchRequest p;
      p.set_sequence_id(testing::LevelId(0));
      v1::PrefetchResponse r;
      ASSERT_TRUE(disk.h->Prefetch(p, &r).ok());
      EXPECT_EQ(r.pages_restored(), 2u);  // a page a layer
      EXPECT_EQ(r.layers_promoted(), promotion == HotPromotion::kSync ? 2u : 0u);
      disk.h->DrainPromotions();
      EXPECT_TRUE(disk.h->LayerIsHot(testing::LevelId(0), 0));
      EXPECT_TRUE(disk.h->LayerIsHot(testing::LevelId(0), 1));
    }
    for (int round = 0; round < 2; ++round) {
      for (int i = 0; i < sequences; ++i) {
        absl::StatusOr<std::string> a = testing::LevelAttendBytes(*disk.h, i),
                                    b = testing::LevelAttendBytes(*never_moved.h, i);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_TRUE(b.ok()) << b.status();
        EXPECT_EQ(*a, *b) << "round " << round << " sequence " << i;
        disk.h->DrainPromotions();
      }
    }
    for (int i = 0; i < sequences; ++i) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        EXPECT_EQ(disk.Read(testing::LevelId(i), layer), never_moved.Read(testing::LevelId(i), layer))
            << "sequence " << i << " layer " << layer;
      }
    }
    EXPECT_GT(disk.Stats().promotions(), 0u);
    EXPECT_GT(disk.Stats().demotions(), 0u);
    EXPECT_GT(Counter(disk.metrics, "driftkv_level_moved_pages_total", "down"), 0);
    EXPECT_GT(Counter(disk.metrics, "driftkv_level_moved_pages_total", "up"), 0);
    EXPECT_EQ(Counter(disk.metrics, "driftkv_level_checksum_failures_total"), 0);
    std::printf("%s: %d sequences over a pool of %d: %llu promotions, %llu demotions, pages moved down %.0f, up %.0f\n",
                promotion == HotPromotion::kSync ? "sync" : "async", sequences, pool_only,
                static_cast<unsigned long long>(disk.Stats().promotions()),
                static_cast<unsigned long long>(disk.Stats().demotions()),
                Counter(disk.metrics, "driftkv_level_moved_pages_total", "down"),
                Counter(disk.metrics, "driftkv_level_moved_pages_total", "up"));
  }
}

TEST(DiskLevelTest, AppendAndForkOfASequenceBelowContinueWhereItStopped) {
  TestHandler disk(DiskOptions(ScratchDir("level_append")), FixtureClock::kReal);
  ServiceOptions big = SmallOptions(64u << 20);
  TestHandler never_moved(big);
  const int n = 2 * PoolOnlyCapacity() + 2;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(testing::AddLevelSequence(disk, i).ok());
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, i).ok());
  }
  // Sequence 0 is the least recently used: below by now.
  ASSERT_GT(disk.h->spill_tier()->sequences_below(), 0);
  const Kv more = SyntheticKv(kTokens + 64, testing::kSmallN, 77);  // rows [kTokens, kTokens + 64) appended
  for (TestHandler* t : {&disk, &never_moved}) {
    ASSERT_TRUE(t->Push(testing::LevelId(0), 0, more, kTokens, 64).ok());
    v1::ForkRequest f;
    f.set_sequence_id("fork");
    f.set_source_sequence_id(testing::LevelId(1));
    f.set_tokens(128);
    v1::ForkResponse fr;
    ASSERT_TRUE(t->h->Fork(f, &fr).ok());
  }
  EXPECT_EQ(disk.Read(testing::LevelId(0), 0), never_moved.Read(testing::LevelId(0), 0));
  EXPECT_EQ(disk.Read("fork", 1), never_moved.Read("fork", 1));
}

TEST(DiskLevelTest, CorruptPageOnDiskIsDataLossForItsSequenceOnly) {
  const std::string dir = ScratchDir("level_corrupt");
  TestHandler disk(DiskOptions(dir), FixtureClock::kReal);
  ServiceOptions big = SmallOptions(64u << 20);
  TestHandler never_moved(big);
  const int n = 4 * PoolOnlyCapacity() + 2;
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(testing::AddLevelSequence(disk, i).ok());
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, i).ok());
  }
  // The first record of the first segment is a page of s0 (the first
  // sequence moved down): flip a byte of its payload.
  std::vector<std::string> segments = SegmentFiles(dir);
  ASSERT_FALSE(segments.empty());
  {
    const int fd = open(segments[0].c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    const off_t at = static_cast<off_t>(tiers::kRecordHeaderBytes + 100);
    ASSERT_EQ(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
    close(fd);
  }
  v1::ReadRequest req;
  req.set_sequence_id(testing::LevelId(0));
  absl::Status st = disk.h->Read(req, [](const v1::ReadChunk&) { return true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(st.message().find("not served"), std::string::npos) << st;
  v1::PrefetchRequest p;
  p.set_sequence_id(testing::LevelId(0));
  v1::PrefetchResponse pr;
  EXPECT_EQ(disk.h->Prefetch(p, &pr).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(testing::LevelAttendBytes(*disk.h, 0).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_GE(Counter(disk.metrics, "driftkv_level_checksum_failures_total"), 3);
  // Every other sequence, below or not, is served as before.
  for (int i = 1; i < n; ++i) {
    EXPECT_EQ(disk.Read(testing::LevelId(i), 1), never_moved.Read(testing::LevelId(i), 1)) << "sequence " << i;
  }
  // The broken one can still be released.
  v1::ReleaseRequest r;
  r.set_sequence_id(testing::LevelId(0));
  v1::ReleaseResponse rr;
  EXPECT_TRUE(disk.h->Release(r, &rr).ok());
}

TEST(DiskLevelTest, PrefetchBringsASequenceBackAndNamesBadInput) {
  TestHandler disk(DiskOptions(ScratchDir("level_prefetch")), FixtureClock::kReal);
  const int n = 3 * PoolOnlyCapacity() + 1;
  for (int i = 0; i < n; ++i) ASSERT_TRUE(testing::AddLevelSequence(disk, i).ok());
  v1::PrefetchRequest p;
  v1::PrefetchResponse r;
  p.set_sequence_id(testing::LevelId(0));
  ASSERT_TRUE(disk.h->Prefetch(p, &r).ok());
  EXPECT_GT(r.pages_restored(), 0u);
  ASSERT_TRUE(disk.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.pages_restored(), 0u);  // already in the pool
  p.set_sequence_id("");
  EXPECT_EQ(disk.h->Prefetch(p, &r).code(), absl::StatusCode::kInvalidArgument);
  p.set_sequence_id("nope");
  EXPECT_EQ(disk.h->Prefetch(p, &r).code(), absl::StatusCode::kNotFound);
  p.set_sequence_id(testing::LevelId(1));
  absl::Status foreign = disk.h->Prefetch(p, &r, "another-tenant");
  EXPECT_EQ(foreign.code(), absl::StatusCode::kNotFound) << foreign;
  // Release of a sequence below erases its pages from the disk.
  p.set_sequence_id(testing::LevelId(0));
  const uint64_t before = disk.h->spill_tier()->disk_store()->stats().pages;
  ASSERT_GT(before, 0u);
  for (int i = 0; i < n; ++i) {
    v1::ReleaseRequest rel;
    rel.set_sequence_id(testing::LevelId(i));
    v1::ReleaseResponse rr;
    ASSERT_TRUE(disk.h->Release(rel, &rr).ok());
  }
  disk.h->spill_tier()->DrainErases();
  EXPECT_EQ(disk.h->spill_tier()->disk_store()->stats().pages, 0u);
  EXPECT_EQ(disk.h->spill_tier()->sequences_below(), 0);
  // Without a disk level: nothing to bring back.
  TestHandler plain(SmallOptions(kPoolBytes));
  ASSERT_TRUE(testing::AddLevelSequence(plain, 0).ok());
  p.set_sequence_id(testing::LevelId(0));
  ASSERT_TRUE(plain.h->Prefetch(p, &r).ok());
  EXPECT_EQ(r.pages_restored(), 0u);
}

TEST(DiskLevelTest, FullDiskBudgetIsResourceExhaustedUntilRoomIsMade) {
  // 2 MiB of disk: some sequences' pages, then Append is refused again.
  ServiceOptions o = DiskOptions(ScratchDir("level_budget"), 2u << 20);
  o.disk_level.segment_bytes = 256u << 10;
  TestHandler disk(o, FixtureClock::kReal);
  absl::Status st;
  int held = 0;
  for (; held < 1000; ++held) {
    st = testing::AddLevelSequence(disk, held);
    if (!st.ok()) break;
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_GT(held, PoolOnlyCapacity());
  // A sequence in the pool is served; one below needs room on the disk
  // for whatever it displaces: RESOURCE_EXHAUSTED naming the disk level,
  // nothing lost.
  v1::ReadRequest req;
  req.set_sequence_id(testing::LevelId(held - 1));
  EXPECT_TRUE(disk.h->Read(req, [](const v1::ReadChunk&) { return true; }).ok());
  req.set_sequence_id(testing::LevelId(0));
  st = disk.h->Read(req, [](const v1::ReadChunk&) { return true; });
  if (!st.ok()) {
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
    EXPECT_NE(st.message().find("disk level"), std::string::npos) << st;
  }
  // Releasing others makes room: then it comes back.
  for (int i = 1; i < held; ++i) {
    v1::ReleaseRequest rel;
    rel.set_sequence_id(testing::LevelId(i));
    v1::ReleaseResponse rr;
    ASSERT_TRUE(disk.h->Release(rel, &rr).ok());
  }
  disk.h->spill_tier()->DrainErases();
  st = disk.h->Read(req, [](const v1::ReadChunk&) { return true; });
  EXPECT_TRUE(st.ok()) << st;
  std::printf("2 MiB disk level: %d sequences before the budget refused (the pool alone: %d); s0: %s\n", held,
              PoolOnlyCapacity(), st.ToString().c_str());
}

TEST(DiskLevelTest, ConcurrentAppendsAndReadsMoveSequencesAndLoseNothing) {
  // 4 threads, each appending its own sequences and reading earlier ones
  // back, over a pool of a few sequences: moves down run inside other
  // threads' Appends while sequences are pinned, locked and restored.
  constexpr int kThreads = 4, kEach = 8;
  ServiceOptions o = DiskOptions(ScratchDir("level_threads"));
  o.pool_bytes = 2 * kPoolBytes;
  TestHandler disk(o, FixtureClock::kReal);
  ServiceOptions big = SmallOptions(64u << 20);
  big.max_sequences = 4096;
  TestHandler never_moved(big);
  std::vector<std::string> want(kThreads * kEach);
  for (int i = 0; i < kThreads * kEach; ++i) {
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, i).ok());
    want[i] = never_moved.Read(testing::LevelId(i), 1);
  }
  const std::vector<std::string> errors = testing::AppendAndReadBack(disk, want, kThreads, kEach);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_GT(Counter(disk.metrics, "driftkv_level_moved_pages_total", "up"), 0);
}

absl::Status Resolve(const std::string& text) {
  v1::ServerConfig c;
  const std::string base = "model { layers: 2 kv_heads: 2 head_dim: 64 } pool_bytes: 8388608 ";
  if (!google::protobuf::TextFormat::ParseFromString(base + text, &c)) return absl::InternalError("parse");
  return ResolveConfig(c).status();
}

// A handler whose pool holds every sequence of these tests.
ServiceOptions NeverMovedOptions() {
  ServiceOptions big = SmallOptions(64u << 20);
  big.max_sequences = 4096;
  return big;
}

// Sequences 0 .. n - 1 added to both handlers.
void AddToBoth(TestHandler& disk, TestHandler& never_moved, int n) {
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(testing::AddLevelSequence(disk, i).ok()) << "sequence " << i;
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, i).ok()) << "sequence " << i;
  }
}

// The POSIX calls, but writes fail with ENOSPC while `full` is set.
class FillableDisk final : public tiers::FileIo {
 public:
  std::atomic<bool> full{false};
  int Open(const char* path, int flags, mode_t mode) override { return posix_->Open(path, flags, mode); }
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    if (full.load()) return Fail();
    return posix_->Pwrite(fd, data, size, offset);
  }
  ssize_t Pwritev(int fd, const struct iovec* iov, int count, off_t offset) override {
    if (full.load()) return Fail();
    return posix_->Pwritev(fd, iov, count, offset);
  }
  ssize_t Pread(int fd, void* data, size_t size, off_t offset) override {
    return posix_->Pread(fd, data, size, offset);
  }
  int Fdatasync(int fd) override { return posix_->Fdatasync(fd); }
  int Ftruncate(int fd, off_t size) override { return posix_->Ftruncate(fd, size); }
  int Fallocate(int fd, off_t size) override {
    if (full.load()) return static_cast<int>(Fail());
    return posix_->Fallocate(fd, size);
  }
  int Close(int fd) override { return posix_->Close(fd); }
  int Unlink(const char* path) override { return posix_->Unlink(path); }

 private:
  static ssize_t Fail() {
    errno = ENOSPC;
    return -1;
  }
  tiers::FileIo* const posix_ = tiers::FileIo::Posix();
};

// A full disk through the service: the Append whose pages need a move down
// is refused with a status, every sequence stored before (in the pool or
// below) reads back bit-identical once space returns, the sequences in the
// pool are served meanwhile, and Appends go on when space returns.
TEST(DiskLevelTest, FullDiskRefusesTheAppendAndLosesNothing) {
  const int cap = PoolOnlyCapacity();
  FillableDisk io;
  ServiceOptions o = DiskOptions(ScratchDir("level_enospc"));
  o.disk_level.io = &io;
  TestHandler disk(o, FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  const int n = 3 * cap + 2;
  ASSERT_NO_FATAL_FAILURE(AddToBoth(disk, never_moved, n));
  ASSERT_GT(disk.h->spill_tier()->sequences_below(), 0);
  io.full = true;
  int stored = n;
  absl::Status refused;
  for (; stored < n + 2 * cap + 2; ++stored) {
    refused = testing::AddLevelSequence(disk, stored);
    if (!refused.ok()) break;
    ASSERT_TRUE(testing::AddLevelSequence(never_moved, stored).ok());
  }
  ASSERT_FALSE(refused.ok()) << "the pool never needed the disk";
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  // The newest sequence is in the pool: served while the disk is full.
  absl::StatusOr<std::string> newest = testing::LevelAttendBytes(*disk.h, stored - 1);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, *testing::LevelAttendBytes(*never_moved.h, stored - 1));
  io.full = false;
  ASSERT_TRUE(testing::AddLevelSequence(disk, stored + 1).ok());  // space again: moves down go on
  for (int i = 0; i < stored; ++i) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(disk.Read(testing::LevelId(i), layer), never_moved.Read(testing::LevelId(i), layer))
          << "sequence " << i << " layer " << layer;
    }
  }
}

// The level's directory removed while the server runs: a sequence whose
// pages were below may be lost, and then says so (DATA_LOSS or
// UNAVAILABLE naming it), never with other bytes; every sequence that was
// in the pool, and every one added after, answers as if it never moved;
// the level recreates its directory.
TEST(DiskLevelTest, DirectoryRemovedLosesOnlyWhatWasBelowAndKeepsServing) {
  const int cap = PoolOnlyCapacity();
  const std::string dir = ScratchDir("level_removed");
  TestHandler disk(DiskOptions(dir), FixtureClock::kReal);
  TestHandler never_moved(NeverMovedOptions());
  const int n = 3 * cap + 2;
  ASSERT_NO_FATAL_FAILURE(AddToBoth(disk, never_moved, n));
  std::vector<bool> was_below(n);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(disk.h->WithLayerForTest(
        testing::LevelId(i), 0, [&](LayerState& l) { was_below[i] = !l.pages.empty() && l.pages[0] == kPageBelow; }));
  }
  ASSERT_GT(std::count(was_below.begin(), was_below.end(), true), 0);
  std::filesystem::remove_all(dir);
  // More sequences: their moves down find the directory gone.
  int m = n;
  for (int tries = 0; m < n + 2 * cap + 2 && tries < 4 * cap + 8; ++tries) {
    absl::Status st = testing::AddLevelSequence(disk, m);
    if (st.ok()) {
      ASSERT_TRUE(testing::AddLevelSequence(never_moved, m).ok());
      ++m;
      continue;
    }
    // The Append that met the removal: refused with a status; the id is
    // released and tried again.
    EXPECT_TRUE(st.code() == absl::StatusCode::kResourceExhausted || st.code() == absl::StatusCode::kUnavailable) << st;
    v1::ReleaseRequest rel;
    rel.set_sequence_id(testing::LevelId(m));
    v1::ReleaseResponse rr;
    disk.h->Release(rel, &rr).IgnoreError();
  }
  ASSERT_EQ(m, n + 2 * cap + 2) << "the level never came back";
  EXPECT_TRUE(std::filesystem::exists(dir));
  int lost = 0;
  for (int i = 0; i < m; ++i) {
    absl::StatusOr<std::string> got = testing::LevelAttendBytes(*disk.h, i);
    if (!got.ok()) {
      EXPECT_TRUE(i < n && was_below[i]) << "sequence " << i << " was in the pool or added after: " << got.status();
      EXPECT_TRUE(got.status().code() == absl::StatusCode::kDataLoss ||
                  got.status().code() == absl::StatusCode::kUnavailable)
          << got.status();
      EXPECT_NE(got.status().message().find(testing::LevelId(i)), std::string::npos) << got.status();
      ++lost;
      continue;
    }
    EXPECT_EQ(*got, *testing::LevelAttendBytes(*never_moved.h, i)) << "sequence " << i;
  }
  std::printf("directory removed: %d of %d sequences were below, %d lost\n",
              static_cast<int>(std::count(was_below.begin(), was_below.end(), true)), n, lost);
}

TEST(DiskLevelTest, ConfigNamesTheFieldAndTheValue) {
  EXPECT_TRUE(Resolve("disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 }").ok());
  EXPECT_TRUE(Resolve("disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 at_start: \"wipe\" durability: "
                      "\"power_loss\" }")
                  .ok());
  EXPECT_TRUE(Resolve("disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 at_start: \"snapshot\" } "
                      "snapshot_dir: \"/tmp/s\"")
                  .ok());
  for (const auto& [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"disk_level { budget_bytes: 1048576 }", "disk_level.dir \"\""},
           {"disk_level { dir: \"/tmp/x\" budget_bytes: 4096 }", "disk_level.budget_bytes 4096 must be >= 1048576"},
           {"disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 at_start: \"keep\" }",
            "disk_level.at_start \"keep\" unknown; use snapshot or wipe"},
           {"disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 durability: \"fast\" }",
            "disk_level.durability \"fast\""},
           {"disk_level { dir: \"/tmp/x\" budget_bytes: 1048576 segment_bytes: 100 }", "disk_level.segment_bytes 100"},
       }) {
    absl::Status st = Resolve(text);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(want), std::string::npos) << st << " | " << text;
  }
}

}  // namespace
}  // namespace driftkv
