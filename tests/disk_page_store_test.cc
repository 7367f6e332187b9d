// The disk level (tiers/disk_page_store.h): pages round-trip bit-identical
// (many, across segments, from several threads), replace and erase, a
// restart restores the index from the footers without reading the pages,
// erasures survive a restart even when segments are deleted in between,
// and every fault has its status: a flipped byte (DATA_LOSS, counted, the
// other pages served), a truncated segment (the torn tail dropped, the
// rest kept and sealed), kill -9 in the middle of writes (every page
// reported stored survives), the budget and a full disk (RESOURCE_EXHAUSTED,
// nothing half-written indexed), the directory removed (errors, then
// recovery), a full queue (UNAVAILABLE, back-pressure).
#include "tiers/disk_page_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/disk_test_util.h"

namespace driftkv {
namespace tiers {
namespace {

using testing::CrcOf;
using testing::PageOf;
using testing::ScratchDir;
using testing::SegmentFiles;

constexpr size_t kColdPage = 74496;  // a cold D-Quant page of the default shape

DiskPageStoreOptions Options(const std::string& dir, size_t page_bytes = kColdPage) {
  DiskPageStoreOptions o;
  o.dir = dir;
  o.page_bytes = page_bytes;
  o.budget_bytes = uint64_t{1} << 30;
  o.segment_bytes = 2u << 20;  // ~25 cold pages: the tests cross segments
  o.read_threads = 3;
  o.write_threads = 2;
  o.max_write_bytes = 512 << 10;  // a few pages a write: batches split across segments
  o.queue_capacity = 16;
  o.submit_wait = absl::Seconds(10);
  o.block_bytes = kMinBlock;  // fixed, so that offsets below are known wherever the test runs
  return o;
}

// The distance between records put one at a time (each its own write
// call, padded to a 4096-byte boundary: ALIGNED WRITES in the store).
uint64_t SyncedRecord() {
  return RoundUpToBlock(RecordBytes(kColdPage, kMinBlock), kDiskAlign);
}

std::unique_ptr<DiskPageStore> OpenOrDie(const DiskPageStoreOptions& o) {
  absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

absl::Status PutPage(DiskPageStore& s, uint64_t key, uint64_t version = 0) {
  const std::vector<uint8_t> page = PageOf(key, s.page_bytes(), version);
  return s.Put(key, page.data(), CrcOf(page));
}

// OK when key's page reads back as PageOf(key, version), bit for bit.
::testing::AssertionResult ReadsBack(DiskPageStore& s, uint64_t key, uint64_t version = 0) {
  std::vector<uint8_t> got(s.page_bytes(), 0xAB);
  absl::Status st = s.Get(key, got.data());
  if (!st.ok()) return ::testing::AssertionFailure() << "key " << key << ": " << st;
  if (got != PageOf(key, s.page_bytes(), version)) {
    return ::testing::AssertionFailure() << "key " << key << " reads back other bytes";
  }
  return ::testing::AssertionSuccess();
}

void FlipByte(const std::string& path, uint64_t offset) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  uint8_t b = 0;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x10;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  close(fd);
}

TEST(DiskPageStoreTest, ManyPagesRoundTripAcrossSegments) {
  for (size_t page_bytes : {kColdPage, size_t{96320}, size_t{1}, size_t{4096 - 64}, size_t{4097}}) {
    const std::string dir = ScratchDir("roundtrip");
    auto s = OpenOrDie(Options(dir, page_bytes));
    ASSERT_NE(s, nullptr);
    constexpr int kPages = 120;
    for (int k = 0; k < kPages; ++k) ASSERT_TRUE(PutPage(*s, 1000 + k).ok()) << k;
    for (int k = 0; k < kPages; ++k) ASSERT_TRUE(ReadsBack(*s, 1000 + k)) << "page_bytes " << page_bytes;
    EXPECT_FALSE(s->Contains(999));
    std::vector<uint8_t> dst(page_bytes);
    EXPECT_TRUE(absl::IsNotFound(s->Get(999, dst.data())));
    const DiskPageStoreStats st = s->stats();
    EXPECT_EQ(st.pages, kPages);
    EXPECT_EQ(st.puts, kPages);
    EXPECT_EQ(st.gets, kPages);
    // Each record takes its block-aligned size and a footer entry; the
    // budget counts no less.
    EXPECT_GE(st.bytes_used, kPages * (RecordBytes(page_bytes, kMinBlock) + kFooterEntryBytes));
    if (page_bytes == kColdPage) {
      EXPECT_GT(SegmentFiles(dir).size(), 3u);
    }
  }
}

TEST(DiskPageStoreTest, RefusesBadOptionsNamingTheField) {
  DiskPageStoreOptions o = Options(ScratchDir("options"));
  o.page_bytes = 0;
  EXPECT_TRUE(absl::StrContains(DiskPageStore::Open(o).status().message(), "page_bytes"));
  o = Options(ScratchDir("options"));
  o.segment_bytes = 4096;
  EXPECT_TRUE(absl::StrContains(DiskPageStore::Open(o).status().message(), "segment_bytes"));
  o = Options(ScratchDir("options"));
  o.budget_bytes = 1000;
  EXPECT_TRUE(absl::StrContains(DiskPageStore::Open(o).status().message(), "budget_bytes"));
  o = Options(ScratchDir("options"));
  o.block_bytes = 1000;
  EXPECT_TRUE(absl::StrContains(DiskPageStore::Open(o).status().message(), "block_bytes 1000"));
}

// Segments of 4096-byte blocks (as an earlier store, or another device,
// wrote them) and of 512-byte blocks live side by side: a store reopened
// with the other block reads every page back, writes its own, and a third
// open (the block chosen by the probe) reads all of them from the footers.
// A page's record takes 74,752 bytes in 512-byte blocks, 77,824 in 4096.
TEST(DiskPageStoreTest, SegmentsOfEitherBlockReopenTogether) {
  const std::string dir = ScratchDir("blocks");
  DiskPageStoreOptions o = Options(dir);
  o.block_bytes = kDiskAlign;
  {
    auto s = OpenOrDie(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->record_bytes(), 77824u);
    for (int k = 0; k < 40; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
  }
  o.block_bytes = kMinBlock;
  {
    auto s = OpenOrDie(o);
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(s->record_bytes(), 74752u);
    EXPECT_EQ(s->stats().block_bytes, kMinBlock);
    for (int k = 0; k < 40; ++k) ASSERT_TRUE(ReadsBack(*s, k)) << k;
    for (int k = 40; k < 80; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
    ASSERT_TRUE(s->Erase(3).ok());
  }
  o.block_bytes = 0;
  auto s = OpenOrDie(o);
  ASSERT_NE(s, nullptr);
  const DiskPageStoreStats st = s->stats();
  EXPECT_TRUE(st.block_bytes == kMinBlock || st.block_bytes == kDiskAlign) << st.block_bytes;
  EXPECT_EQ(st.open_segments_scanned, 0u);
  EXPECT_GE(st.open_segments_footer, 4u);
  EXPECT_FALSE(s->Contains(3));
  for (int k = 0; k < 80; ++k) {
    if (k == 3) continue;
    ASSERT_TRUE(ReadsBack(*s, k)) << k;
  }
  std::printf("the probe chose %u-byte blocks in %s\n", st.block_bytes, dir.c_str());
}

TEST(DiskPageStoreTest, PutReplacesAndEraseForgets) {
  auto s = OpenOrDie(Options(ScratchDir("replace")));
  ASSERT_TRUE(PutPage(*s, 7, 1).ok());
  ASSERT_TRUE(PutPage(*s, 7, 2).ok());
  EXPECT_TRUE(ReadsBack(*s, 7, 2));
  EXPECT_EQ(s->stats().pages, 1u);
  ASSERT_TRUE(s->Erase(7).ok());
  EXPECT_FALSE(s->Contains(7));
  EXPECT_TRUE(absl::IsNotFound(s->Erase(7)));
}

TEST(DiskPageStoreTest, PageNotMatchingItsCrcIsRefused) {
  auto s = OpenOrDie(Options(ScratchDir("badcrc")));
  std::vector<uint8_t> page = PageOf(5, kColdPage);
  const uint32_t crc = CrcOf(page);
  page[100] ^= 1;  // corrupted before it reached the store
  absl::Status st = s->Put(5, page.data(), crc);
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_FALSE(s->Contains(5));
  EXPECT_EQ(s->stats().put_crc_mismatches, 1u);
}

TEST(DiskPageStoreTest, AsyncCallbacksReportEveryPage) {
  auto s = OpenOrDie(Options(ScratchDir("async")));
  constexpr int kPages = 64;
  std::atomic<int> ok{0};
  absl::Notification all;
  for (int k = 0; k < kPages; ++k) {
    const std::vector<uint8_t> page = PageOf(k, kColdPage);  // the store copies it: freed at once
    ASSERT_TRUE(s->PutAsync(k, page.data(), CrcOf(page), [&](absl::Status st) {
                   EXPECT_TRUE(st.ok()) << st;
                   if (++ok == kPages) all.Notify();
                 }).ok());
  }
  all.WaitForNotification();
  std::vector<std::vector<uint8_t>> got(kPages, std::vector<uint8_t>(kColdPage));
  std::atomic<int> read{0};
  absl::Notification all_read;
  for (int k = 0; k < kPages; ++k) {
    ASSERT_TRUE(s->GetAsync(k, got[k].data(), [&](absl::Status st) {
                   EXPECT_TRUE(st.ok()) << st;
                   if (++read == kPages) all_read.Notify();
                 }).ok());
  }
  all_read.WaitForNotification();
  for (int k = 0; k < kPages; ++k) EXPECT_EQ(got[k], PageOf(k, kColdPage)) << k;
}

// Two writes of one key queued back to back, without waiting: the later
// one wins, whichever writer finishes first, and so does a restart.
TEST(DiskPageStoreTest, LaterWriteOfAKeyWinsNowAndAfterRestart) {
  const std::string dir = ScratchDir("order");
  DiskPageStoreOptions o = Options(dir);
  o.write_threads = 4;
  o.max_write_bytes = 2 * RecordBytes(kColdPage, kMinBlock);  // many small batches
  constexpr int kKeys = 60;
  {
    auto s = OpenOrDie(o);
    std::atomic<int> done{0};
    for (int round = 0; round < 3; ++round) {
      for (int k = 0; k < kKeys; ++k) {
        const std::vector<uint8_t> page = PageOf(k, kColdPage, round);
        ASSERT_TRUE(s->PutAsync(k, page.data(), CrcOf(page), [&](absl::Status st) {
                       EXPECT_TRUE(st.ok()) << st;
                       ++done;
                     }).ok());
      }
    }
    s->Flush();
    EXPECT_EQ(done.load(), 3 * kKeys);
    for (int k = 0; k < kKeys; ++k) EXPECT_TRUE(ReadsBack(*s, k, 2));
  }
  auto s = OpenOrDie(o);
  for (int k = 0; k < kKeys; ++k) EXPECT_TRUE(ReadsBack(*s, k, 2));
}

TEST(DiskPageStoreTest, ConcurrentWritersAndReaders) {
  auto s = OpenOrDie(Options(ScratchDir("concurrent")));
  constexpr int kThreads = 4, kPerThread = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const uint64_t key = t * 1000 + i;
        if (!PutPage(*s, key).ok() || !ReadsBack(*s, key)) ++failures;
        // Someone else's page: not there yet, or erased meanwhile
        // (NOT_FOUND), or its bytes.
        const uint64_t other = ((t + 1) % kThreads) * 1000 + i / 2;
        std::vector<uint8_t> got(kColdPage);
        absl::Status st = s->Get(other, got.data());
        if (!absl::IsNotFound(st) && (!st.ok() || got != PageOf(other, kColdPage))) ++failures;
        if (i % 5 == 4 && !s->Erase(key - 1).ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(s->stats().pages, kThreads * (kPerThread - kPerThread / 5));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      const uint64_t key = t * 1000 + i;
      if (i % 5 == 3) {
        EXPECT_FALSE(s->Contains(key)) << key;
      } else {
        EXPECT_TRUE(ReadsBack(*s, key));
      }
    }
  }
}

TEST(DiskPageStoreTest, SegmentWhoseRecordsAreAllErasedIsDeleted) {
  const std::string dir = ScratchDir("delete");
  auto s = OpenOrDie(Options(dir));
  for (int k = 0; k < 100; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
  const size_t files = SegmentFiles(dir).size();
  const uint64_t used = s->bytes_used();
  for (int k = 0; k < 60; ++k) ASSERT_TRUE(s->Erase(k).ok());
  // The first two segments (about 25 pages each) held only erased pages.
  EXPECT_LE(SegmentFiles(dir).size(), files - 2);
  EXPECT_GE(s->stats().segments_deleted, 2u);
  EXPECT_LT(s->bytes_used(), used);
  for (int k = 60; k < 100; ++k) EXPECT_TRUE(ReadsBack(*s, k));
}

TEST(DiskPageStoreTest, RestartRestoresFromFootersWithoutReadingPages) {
  const std::string dir = ScratchDir("restart");
  uint64_t data_bytes = 0;
  {
    auto s = OpenOrDie(Options(dir));
    for (int k = 0; k < 100; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
    for (int k = 0; k < 100; k += 3) ASSERT_TRUE(PutPage(*s, k, 1).ok());  // replaced
    for (int k = 1; k < 100; k += 7) ASSERT_TRUE(s->Erase(k).ok());
    data_bytes = s->bytes_used();
  }
  auto s = OpenOrDie(Options(dir));
  const DiskPageStoreStats st = s->stats();
  EXPECT_EQ(st.open_segments_scanned, 0u);
  EXPECT_EQ(st.open_segments_footer, SegmentFiles(dir).size());
  // Footers only: 32 bytes per record against ~77 KB.
  EXPECT_LT(st.open_bytes_read * 100, data_bytes) << st.open_bytes_read << " of " << data_bytes;
  for (int k = 0; k < 100; ++k) {
    if (k % 7 == 1) {
      EXPECT_FALSE(s->Contains(k)) << k;
    } else {
      EXPECT_TRUE(ReadsBack(*s, k, k % 3 == 0 ? 1 : 0));
    }
  }
  // New writes after a restart go to a new segment and survive another one.
  ASSERT_TRUE(PutPage(*s, 500).ok());
  s.reset();
  s = OpenOrDie(Options(dir));
  EXPECT_TRUE(ReadsBack(*s, 500));
  EXPECT_TRUE(ReadsBack(*s, 2));
}

// A segment all of whose records are dead is kept while it hides an older
// record that another live segment still holds: deleting it would bring
// that record back at the next restart.
TEST(DiskPageStoreTest, ErasedKeyStaysErasedWhenSegmentsAreDeleted) {
  const std::string dir = ScratchDir("hide");
  DiskPageStoreOptions o = Options(dir);
  o.segment_bytes = 3 * RecordBytes(kColdPage, kMinBlock) + FooterBytes(3, kMinBlock);  // three pages a segment
  {
    auto s = OpenOrDie(o);
    for (uint64_t k : {1, 2, 3}) ASSERT_TRUE(PutPage(*s, k).ok());     // segment 1
    for (uint64_t k : {1, 4, 5}) ASSERT_TRUE(PutPage(*s, k, 1).ok());  // segment 2: 1 hides segment 1's
    for (uint64_t k : {1, 4, 5}) ASSERT_TRUE(s->Erase(k).ok());        // segment 2 all dead
    EXPECT_EQ(s->stats().pages, 2u);
  }
  {
    auto s = OpenOrDie(o);
    EXPECT_FALSE(s->Contains(1));  // neither version comes back
    EXPECT_TRUE(ReadsBack(*s, 2));
    EXPECT_TRUE(ReadsBack(*s, 3));
    for (uint64_t k : {2, 3}) ASSERT_TRUE(s->Erase(k).ok());
  }
  auto s = OpenOrDie(o);
  EXPECT_EQ(s->stats().pages, 0u);
  EXPECT_LE(SegmentFiles(dir).size(), 2u);  // at most the tombstones' segments remain
}

TEST(DiskPageStoreTest, WipeAtOpenStartsEmpty) {
  const std::string dir = ScratchDir("wipe");
  {
    auto s = OpenOrDie(Options(dir));
    for (int k = 0; k < 10; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
  }
  DiskPageStoreOptions o = Options(dir);
  o.wipe_at_open = true;
  auto s = OpenOrDie(o);
  EXPECT_EQ(s->stats().pages, 0u);
  EXPECT_EQ(s->bytes_used(), 0u);
  EXPECT_TRUE(SegmentFiles(dir).empty());
  ASSERT_TRUE(PutPage(*s, 3, 9).ok());
  EXPECT_TRUE(ReadsBack(*s, 3, 9));
}

TEST(DiskPageStoreTest, FlippedByteIsDataLossAndOtherPagesAreServed) {
  const std::string dir = ScratchDir("flip");
  auto s = OpenOrDie(Options(dir));
  for (int k = 0; k < 10; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
  const std::string seg = SegmentFiles(dir).front();
  // Page 4's payload (each Put is a write of its own, which ends at a
  // 4096-byte boundary: records are SyncedRecord apart from offset 0),
  // then page 6's header.
  FlipByte(seg, 4 * SyncedRecord() + kRecordHeaderBytes + 5000);
  FlipByte(seg, 6 * SyncedRecord() + 12);
  std::vector<uint8_t> dst(kColdPage);
  for (int k : {4, 6}) {
    absl::Status st = s->Get(k, dst.data());
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("key ", k))) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), seg)) << st;
  }
  EXPECT_EQ(s->stats().checksum_failures, 2u);
  for (int k = 0; k < 10; ++k) {
    if (k != 4 && k != 6) {
      EXPECT_TRUE(ReadsBack(*s, k));
    }
  }
}

// Sealed (closed) store, then its segment cut: mid-payload, mid-header,
// right after a header. Open drops the cut record and everything after it
// in that segment, keeps the rest bit-identical, and seals the segment
// again (the next Open uses the footer).
TEST(DiskPageStoreTest, TruncatedSegmentDropsTheTornTailOnly) {
  for (uint64_t cut_in_record : {uint64_t{kRecordHeaderBytes + 30000}, uint64_t{20}, uint64_t{kRecordHeaderBytes}}) {
    const std::string dir = ScratchDir("truncate");
    DiskPageStoreOptions o = Options(dir);
    o.segment_bytes = 64u << 20;  // one segment
    {
      auto s = OpenOrDie(o);
      for (int k = 0; k < 12; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
    }
    const std::string seg = SegmentFiles(dir).front();
    std::filesystem::resize_file(seg, 8 * SyncedRecord() + cut_in_record);
    {
      auto s = OpenOrDie(o);
      const DiskPageStoreStats st = s->stats();
      EXPECT_EQ(st.open_segments_scanned, 1u);
      EXPECT_EQ(st.pages, 8u) << cut_in_record;
      for (int k = 0; k < 8; ++k) EXPECT_TRUE(ReadsBack(*s, k));
      for (int k = 8; k < 12; ++k) EXPECT_FALSE(s->Contains(k));
    }
    auto s = OpenOrDie(o);
    EXPECT_EQ(s->stats().open_segments_scanned, 0u);
    EXPECT_EQ(s->stats().pages, 8u);
  }
}

// kill -9 of a process in the middle of its writes: every page it
// reported stored (through a pipe, after its callback) reads back
// bit-identically, whatever was torn.
TEST(DiskPageStoreTest, KillNineKeepsEveryPageReportedStored) {
  for (Durability durability : {Durability::kProcess, Durability::kPowerLoss}) {
    const std::string dir = ScratchDir("kill");
    DiskPageStoreOptions o = Options(dir);
    o.durability = durability;
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(fds[0]);
      absl::StatusOr<std::unique_ptr<DiskPageStore>> s = DiskPageStore::Open(o);
      if (!s.ok()) _exit(2);
      for (uint64_t k = 0;; ++k) {  // until killed
        const std::vector<uint8_t> page = PageOf(k, kColdPage);
        (void)(*s)->PutAsync(k, page.data(), CrcOf(page), [k, fd = fds[1]](absl::Status st) {
          if (st.ok() && write(fd, &k, sizeof(k)) != sizeof(k)) _exit(3);
        });
      }
    }
    close(fds[1]);
    std::vector<uint64_t> stored;
    uint64_t k = 0;
    while (stored.size() < 150 && read(fds[0], &k, sizeof(k)) == sizeof(k)) stored.push_back(k);
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
    while (read(fds[0], &k, sizeof(k)) == sizeof(k)) stored.push_back(k);  // reported before it died
    close(fds[0]);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited with " << status;
    ASSERT_GE(stored.size(), 150u);
    auto s = OpenOrDie(o);
    const DiskPageStoreStats st = s->stats();
    EXPECT_GE(st.open_segments_scanned, 1u);  // the one being written
    for (uint64_t key : stored) ASSERT_TRUE(ReadsBack(*s, key));
    // Whatever else came back is whole too.
    for (uint64_t key = 0; key < stored.size() + 64; ++key) {
      if (s->Contains(key)) {
        EXPECT_TRUE(ReadsBack(*s, key));
      }
    }
  }
}

TEST(DiskPageStoreTest, BudgetReachedIsResourceExhaustedAndEraseMakesRoom) {
  const std::string dir = ScratchDir("budget");
  DiskPageStoreOptions o = Options(dir);
  o.segment_bytes = 2 * RecordBytes(kColdPage, kMinBlock) + FooterBytes(2, kMinBlock);
  o.budget_bytes = 8 * RecordBytes(kColdPage, kMinBlock);
  auto s = OpenOrDie(o);
  int stored = 0;
  absl::Status st;
  for (int k = 0; k < 20 && st.ok(); ++k) {
    st = PutPage(*s, k);
    if (st.ok()) ++stored;
  }
  EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), absl::StrCat("budget of ", o.budget_bytes))) << st;
  EXPECT_FALSE(s->Contains(stored));
  EXPECT_GE(stored, 4);
  EXPECT_LE(s->bytes_used(), o.budget_bytes);
  EXPECT_EQ(s->stats().budget_refusals, 1u);
  // The first segment's two pages go: it is deleted, and a page fits again.
  ASSERT_TRUE(s->Erase(0).ok());
  ASSERT_TRUE(s->Erase(1).ok());
  EXPECT_TRUE(PutPage(*s, 100).ok());
  for (int k = 2; k < stored; ++k) EXPECT_TRUE(ReadsBack(*s, k));
  EXPECT_TRUE(ReadsBack(*s, 100));
}

// A file layer whose writes fail with ENOSPC once armed, after writing
// half of what they were given (the worst case: a valid header on disk).
class FullDiskIo : public FileIo {
 public:
  int Open(const char* path, int flags, mode_t mode) override { return FileIo::Posix()->Open(path, flags, mode); }
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    if (full_.load() && size > kDiskAlign) {
      (void)FileIo::Posix()->Pwrite(fd, data, size / 2 / kDiskAlign * kDiskAlign, offset);
      errno = ENOSPC;
      return -1;
    }
    return FileIo::Posix()->Pwrite(fd, data, size, offset);
  }
  ssize_t Pwritev(int fd, const struct iovec* iov, int count, off_t offset) override {
    if (full_.load()) {
      (void)FileIo::Posix()->Pwrite(fd, iov[0].iov_base, iov[0].iov_len / 2 / kDiskAlign * kDiskAlign, offset);
      errno = ENOSPC;
      return -1;
    }
    return FileIo::Posix()->Pwritev(fd, iov, count, offset);
  }
  ssize_t Pread(int fd, void* data, size_t size, off_t offset) override {
    return FileIo::Posix()->Pread(fd, data, size, offset);
  }
  int Fdatasync(int fd) override { return FileIo::Posix()->Fdatasync(fd); }
  int Ftruncate(int fd, off_t size) override { return FileIo::Posix()->Ftruncate(fd, size); }
  int Fallocate(int fd, off_t size) override {
    if (full_.load()) {
      errno = ENOSPC;
      return -1;
    }
    return FileIo::Posix()->Fallocate(fd, size);
  }
  int Close(int fd) override { return FileIo::Posix()->Close(fd); }
  int Unlink(const char* path) override { return FileIo::Posix()->Unlink(path); }
  std::atomic<bool> full_{false};
};

TEST(DiskPageStoreTest, FullDiskIsResourceExhaustedAndNothingHalfWrittenIsIndexed) {
  const std::string dir = ScratchDir("enospc");
  FullDiskIo io;
  DiskPageStoreOptions o = Options(dir);
  o.io = &io;
  {
    auto s = OpenOrDie(o);
    for (int k = 0; k < 5; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
    io.full_ = true;
    absl::Status st = PutPage(*s, 5);
    EXPECT_TRUE(absl::IsResourceExhausted(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "disk full")) << st;
    EXPECT_FALSE(s->Contains(5));
    EXPECT_EQ(s->stats().write_failures, 1u);
    io.full_ = false;
    ASSERT_TRUE(PutPage(*s, 6).ok());  // space again: the store goes on
    for (int k : {0, 1, 2, 3, 4, 6}) EXPECT_TRUE(ReadsBack(*s, k));
  }
  o.io = nullptr;
  auto s = OpenOrDie(o);
  EXPECT_FALSE(s->Contains(5));  // its half-written bytes are not in the footer
  for (int k : {0, 1, 2, 3, 4, 6}) EXPECT_TRUE(ReadsBack(*s, k));
}

TEST(DiskPageStoreTest, DirectoryRemovedWhileRunningReportsThenRecovers) {
  const std::string dir = ScratchDir("rmdir");
  auto s = OpenOrDie(Options(dir));
  for (int k = 0; k < 5; ++k) ASSERT_TRUE(PutPage(*s, k).ok());
  std::filesystem::remove_all(dir);
  // The next write lands in the removed file: reported, not stored.
  absl::Status st = PutPage(*s, 5);
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "removed")) << st;
  EXPECT_FALSE(s->Contains(5));
  // The pages of the lost segment are no longer claimed.
  s->CheckFiles();
  for (int k = 0; k < 5; ++k) EXPECT_FALSE(s->Contains(k)) << k;
  EXPECT_GE(s->stats().lost_segments, 1u);
  EXPECT_EQ(s->stats().lost_pages, 5u);
  // Recovery: the directory is made again by the next segment.
  ASSERT_TRUE(PutPage(*s, 6).ok());
  EXPECT_TRUE(ReadsBack(*s, 6));
  EXPECT_EQ(SegmentFiles(dir).size(), 1u);
}

// Writes that block until released: the queue fills, submitters get
// UNAVAILABLE after submit_wait, and what was accepted completes.
class GatedIo : public FullDiskIo {
 public:
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    gate_.WaitForNotification();
    return FullDiskIo::Pwrite(fd, data, size, offset);
  }
  ssize_t Pwritev(int fd, const struct iovec* iov, int count, off_t offset) override {
    gate_.WaitForNotification();
    return FullDiskIo::Pwritev(fd, iov, count, offset);
  }
  absl::Notification gate_;
};

TEST(DiskPageStoreTest, FullQueueGivesBackPressure) {
  GatedIo io;
  DiskPageStoreOptions o = Options(ScratchDir("queue"));
  o.io = &io;
  o.write_threads = 1;
  o.queue_capacity = 4;
  o.submit_wait = absl::Milliseconds(200);
  auto s = OpenOrDie(o);
  std::atomic<int> done{0};
  int accepted = 0;
  absl::Status st;
  for (int k = 0; k < 20 && st.ok(); ++k) {
    const std::vector<uint8_t> page = PageOf(k, kColdPage);
    st = s->PutAsync(k, page.data(), CrcOf(page), [&](absl::Status r) {
      EXPECT_TRUE(r.ok()) << r;
      ++done;
    });
    if (st.ok()) ++accepted;
  }
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "queue full")) << st;
  // Pages being written (blocked) and waiting count alike.
  EXPECT_EQ(accepted, o.queue_capacity);
  EXPECT_EQ(s->stats().queue_refusals, 1u);
  io.gate_.Notify();
  s->Flush();
  EXPECT_EQ(done.load(), accepted);
  for (int k = 0; k < accepted; ++k) EXPECT_TRUE(ReadsBack(*s, k));
}

}  // namespace
}  // namespace tiers
}  // namespace driftkv
