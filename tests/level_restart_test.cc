// A drain and restart of a server with levels below the pool (docs/tiers.md,
// "Restart") on the CPU backend: the snapshot carries the host level's
// pages and names the disk level's records by key; the next start opens
// the disk store from its footers (no page read), puts every sequence back
// on the level it was on, answers bit-identically to a server that never
// moved a page, and erases the records no sequence names. A record gone
// from the disk drops its sequence only; a start without a snapshot wipes
// the disk level; a server without a disk level drops the sequences that
// were on one; a server without levels writes version 4. And the file's
// level entries on their own.
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/page_checksum.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/snapshot_file.h"
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
using testing::SmallOptions;
using testing::TestHandler;
using tiers::testing::ScratchDir;

constexpr uint64_t kPoolBytes = 160u << 10;
constexpr uint64_t kHostBytes = 2 * kPoolBytes;
constexpr int kSequences = 24;  // the pool holds ~2, the host level ~4: most go to disk

struct Dirs {
  std::string root = ScratchDir("level_restart");
  std::string snap = root + "/snap";
  std::string disk = root + "/disk";
  Dirs() {
    std::filesystem::create_directories(snap);
    std::filesystem::create_directories(disk);
  }
};

ServiceOptions Options(const Dirs& d, bool host = true, bool disk = true) {
  ServiceOptions o = SmallOptions(kPoolBytes);
  o.max_sequences = 4096;
  o.snapshot_dir = d.snap;
  if (host) o.host_level.budget_bytes = kHostBytes;
  if (disk) {
    o.disk_level.dir = d.disk;
    o.disk_level.budget_bytes = 16u << 20;
    o.disk_level.segment_bytes = kMinDiskSegmentBytes;  // several segments
  }
  return o;
}

// What a client sees of sequence i (both layers' Read bytes and an
// Attend's), as a digest that a failure message can print; or the error.
std::string Observe(TestHandler& t, int i) {
  absl::StatusOr<std::string> attend = LevelAttendBytes(*t.h, i);
  if (!attend.ok()) return attend.status().ToString();
  const std::string bytes = t.Read(LevelId(i), 0) + t.Read(LevelId(i), 1) + *attend;
  return absl::StrCat(bytes.size(), " bytes, hash ", absl::Hex(std::hash<std::string>()(bytes)));
}

std::vector<std::string> NeverMoved() {
  ServiceOptions big = SmallOptions(64u << 20);
  big.max_sequences = 4096;
  TestHandler t(big);
  std::vector<std::string> want;
  for (int i = 0; i < kSequences; ++i) {
    EXPECT_TRUE(AddLevelSequence(t, i).ok());
    want.push_back(Observe(t, i));
  }
  return want;
}

// A server of `o` filled with kSequences sequences, drained to o.snapshot_dir.
Handler::SnapshotSummary FillAndDrain(const ServiceOptions& o) {
  TestHandler t(o, FixtureClock::kReal);
  for (int i = 0; i < kSequences; ++i) EXPECT_TRUE(AddLevelSequence(t, i).ok()) << i;
  Handler::SnapshotSummary written;
  EXPECT_TRUE(t.h->WriteSnapshot(o.snapshot_dir, &written).ok());
  return written;
}

TEST(LevelRestartTest, DrainedLevelsComeBackWhereTheyWere) {
  const std::vector<std::string> want = NeverMoved();
  Dirs d;
  const ServiceOptions o = Options(d);
  Handler::SnapshotSummary written;
  int64_t on_host = 0, on_disk = 0;
  uint64_t disk_bytes = 0;
  {
    TestHandler a(o, FixtureClock::kReal);
    for (int i = 0; i < kSequences; ++i) ASSERT_TRUE(AddLevelSequence(a, i).ok()) << i;
    on_host = a.h->spill_tier()->sequences_on_host();
    on_disk = a.h->spill_tier()->sequences_below() - on_host;
    ASSERT_GT(on_host, 0);
    ASSERT_GT(on_disk, 0);
    ASSERT_TRUE(a.h->WriteSnapshot(o.snapshot_dir, &written).ok());
    disk_bytes = a.h->spill_tier()->disk_store()->bytes_used();
  }
  EXPECT_EQ(written.sequences, static_cast<uint64_t>(kSequences));
  EXPECT_GT(written.pages_on_host, 0u);
  EXPECT_GT(written.pages_on_disk, 0u);
  // The disk level's pages are named, not copied: the file is smaller than
  // the pages it does carry would be with them.
  const uint64_t stride = 77u * 1024;  // above any page stride of these options
  EXPECT_LT(std::filesystem::file_size(SnapshotPath(o.snapshot_dir)),
            (written.pages - written.pages_on_disk + 1) * stride + (uint64_t{1} << 20));

  TestHandler b(o, FixtureClock::kReal);
  Handler::SnapshotSummary restored;
  ASSERT_TRUE(b.h->LoadSnapshot(o.snapshot_dir, &restored).ok());
  EXPECT_EQ(restored.sequences, static_cast<uint64_t>(kSequences));
  EXPECT_EQ(restored.dropped_sequences, 0u);
  EXPECT_EQ(restored.pages_on_host, written.pages_on_host);
  EXPECT_EQ(restored.pages_on_disk, written.pages_on_disk);
  EXPECT_EQ(b.h->spill_tier()->sequences_on_host(), on_host);
  EXPECT_EQ(b.h->spill_tier()->sequences_below() - on_host, on_disk);
  // The index came from the footers: every segment sealed at the close,
  // none scanned, a small fraction of the level's bytes read.
  const tiers::DiskPageStoreStats opened = b.h->spill_tier()->disk_store()->stats();
  EXPECT_EQ(opened.open_segments_scanned, 0u);
  EXPECT_GT(opened.open_segments_footer, 0u);
  EXPECT_LT(opened.open_bytes_read * 100, disk_bytes) << "more than 1% of the level read at the start";
  EXPECT_NE(Handler::RestoreReport(o.snapshot_dir, restored).find("0 segments scanned"), std::string::npos)
      << Handler::RestoreReport(o.snapshot_dir, restored);
  for (int i = kSequences - 1; i >= 0; --i) EXPECT_EQ(Observe(b, i), want[i]) << "sequence " << i;
  // Restored sequences move again: a new one spills the least recently used.
  EXPECT_TRUE(AddLevelSequence(b, kSequences).ok());
}

TEST(LevelRestartTest, ARecordGoneFromTheDiskDropsOnlyItsSequence) {
  const std::vector<std::string> want = NeverMoved();
  Dirs d;
  const ServiceOptions o = Options(d);
  const Handler::SnapshotSummary written = FillAndDrain(o);
  ASSERT_GT(written.pages_on_disk, 0u);
  // The oldest segment holds the first sequences moved to disk.
  std::vector<std::string> segments;
  for (const auto& e : std::filesystem::directory_iterator(d.disk)) segments.push_back(e.path().string());
  std::sort(segments.begin(), segments.end());
  ASSERT_GE(segments.size(), 2u);
  std::filesystem::remove(segments.front());

  TestHandler b(o, FixtureClock::kReal);
  Handler::SnapshotSummary restored;
  ASSERT_TRUE(b.h->LoadSnapshot(o.snapshot_dir, &restored).ok());
  EXPECT_GE(restored.dropped_sequences, 1u);
  EXPECT_EQ(restored.sequences + restored.dropped_sequences, static_cast<uint64_t>(kSequences));
  // The dropped sequences' other records are erased: what the level holds
  // is what its sequences name.
  SpillTier* tier = b.h->spill_tier();
  tier->DrainErases();
  EXPECT_EQ(tier->disk_store()->stats().pages, restored.pages_on_disk);
  int served = 0;
  for (int i = 0; i < kSequences; ++i) {
    v1::ReadRequest r;
    r.set_sequence_id(LevelId(i));
    r.set_layer(0);
    absl::Status st = b.h->Read(r, [](const v1::ReadChunk&) { return true; });
    if (absl::IsNotFound(st)) continue;
    ASSERT_TRUE(st.ok()) << i << ": " << st;
    EXPECT_EQ(Observe(b, i), want[i]) << "sequence " << i;
    ++served;
  }
  EXPECT_EQ(served, static_cast<int>(restored.sequences));
}

TEST(LevelRestartTest, WithoutASnapshotTheDiskLevelIsWiped) {
  Dirs d;
  const ServiceOptions o = Options(d);
  {
    TestHandler a(o, FixtureClock::kReal);
    for (int i = 0; i < kSequences; ++i) ASSERT_TRUE(AddLevelSequence(a, i).ok()) << i;
    ASSERT_GT(a.h->spill_tier()->disk_store()->stats().pages, 0u);
  }  // gone without a drain, as after a kill -9
  TestHandler b(o, FixtureClock::kReal);
  Handler::SnapshotSummary restored;
  EXPECT_TRUE(absl::IsNotFound(b.h->LoadSnapshot(o.snapshot_dir, &restored)));
  EXPECT_EQ(b.h->spill_tier()->disk_store()->stats().pages, 0u);
  EXPECT_EQ(b.h->spill_tier()->sequences_below(), 0);
  EXPECT_TRUE(AddLevelSequence(b, 0).ok());
}

TEST(LevelRestartTest, AServerWithoutTheDiskLevelDropsItsSequencesNamingWhy) {
  const std::vector<std::string> want = NeverMoved();
  Dirs d;
  const Handler::SnapshotSummary written = FillAndDrain(Options(d));
  ASSERT_GT(written.pages_on_disk, 0u);
  // Host level only: the host level's and the pool's sequences come back.
  TestHandler b(Options(d, /*host=*/true, /*disk=*/false), FixtureClock::kReal);
  Handler::SnapshotSummary restored;
  ASSERT_TRUE(b.h->LoadSnapshot(d.snap, &restored).ok());
  EXPECT_GT(restored.dropped_sequences, 0u);
  EXPECT_GT(restored.sequences, 0u);
  EXPECT_EQ(restored.pages_on_disk, 0u);
  for (int i = 0; i < kSequences; ++i) {
    const std::string got = Observe(b, i);
    if (got.find("NOT_FOUND") != std::string::npos) continue;
    EXPECT_EQ(got, want[i]) << "sequence " << i;
  }
}

TEST(LevelRestartTest, AServerWithoutLevelsWritesVersionFour) {
  Dirs d;
  ServiceOptions o = Options(d, /*host=*/false, /*disk=*/false);
  o.pool_bytes = 8u << 20;
  FillAndDrain(o);
  std::ifstream f(SnapshotPath(d.snap), std::ios::binary);
  char header[12] = {};
  f.read(header, sizeof(header));
  uint32_t version = 0;
  std::memcpy(&version, header + 8, 4);
  EXPECT_EQ(version, 4u);
  // And one with a level writes 5.
  Dirs e;
  FillAndDrain(Options(e));
  std::ifstream g(SnapshotPath(e.snap), std::ios::binary);
  g.read(header, sizeof(header));
  std::memcpy(&version, header + 8, 4);
  EXPECT_EQ(version, kSnapshotVersion);
}

// The file's level entries (version 5): each kind read back as written; a
// disk entry whose bytes are flipped is DataLoss; a version 4 writer
// refuses them.
TEST(LevelRestartTest, LevelEntriesOfTheFileReadBackAndCorruptOnesAreDataLoss) {
  Dirs d;
  constexpr size_t kBytes = 100;
  std::vector<uint8_t> page(kBytes, 0x5a);
  const PageChecksum crc = Crc32c(page.data(), kBytes);
  {
    auto old = SnapshotWriter::Open(d.snap, "id=test\n", kBytes, 4);
    ASSERT_TRUE(old.ok());
    EXPECT_EQ((*old)->HostPage(page.data(), crc).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ((*old)->DiskPage(7, crc).code(), absl::StatusCode::kFailedPrecondition);
  }
  auto w = SnapshotWriter::Open(d.snap, "id=test\n", kBytes);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->BeginSequence("s", 1).ok());
  ASSERT_TRUE((*w)->BeginLayer(3 * 32, 0, 3, {}, {}).ok());
  ASSERT_TRUE((*w)->Page(page.data(), crc).ok());
  ASSERT_TRUE((*w)->HostPage(page.data(), crc).ok());
  ASSERT_TRUE((*w)->DiskPage(0x0123456789abcdefull, crc).ok());
  EXPECT_EQ((*w)->full_pages(), 1u) << "a host-level page is not a full page";
  ASSERT_TRUE((*w)->Digests(std::vector<uint64_t>(3 * 32, 0)).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  const std::string path = SnapshotPath(d.snap);
  auto read = [&](std::vector<SnapshotReader::PageEntry>* entries) -> absl::Status {
    absl::StatusOr<std::unique_ptr<SnapshotReader>> r = SnapshotReader::Open(path);
    if (!r.ok()) return r.status();
    bool more = false;
    std::string id;
    uint32_t layers = 0;
    if (absl::Status st = (*r)->NextSequence(&more, &id, &layers); !st.ok()) return st;
    SnapshotReader::LayerHeader h;
    std::vector<uint16_t> k, v;
    bool intact = false;
    if (absl::Status st = (*r)->NextLayer(0, 64, &h, &k, &v, &intact); !st.ok()) return st;
    for (uint32_t i = 0; i < h.pages; ++i) {
      SnapshotReader::PageEntry e;
      if (absl::Status st = (*r)->NextPageEntry(&e); !st.ok()) return st;
      if (e.kind == SnapshotReader::PageEntry::kFull || e.kind == SnapshotReader::PageEntry::kHost) {
        std::vector<uint8_t> out(kBytes);
        PageChecksum stored = 0;
        if (absl::Status st = (*r)->Page(kBytes, out.data(), &stored, &intact); !st.ok()) return st;
        if (!intact || out != page) return absl::DataLossError("page bytes");
      }
      entries->push_back(e);
    }
    return absl::OkStatus();
  };
  std::vector<SnapshotReader::PageEntry> entries;
  ASSERT_TRUE(read(&entries).ok());
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].kind, SnapshotReader::PageEntry::kFull);
  EXPECT_EQ(entries[1].kind, SnapshotReader::PageEntry::kHost);
  EXPECT_EQ(entries[2].kind, SnapshotReader::PageEntry::kDisk);
  EXPECT_EQ(entries[2].disk_key, 0x0123456789abcdefull);
  EXPECT_EQ(entries[2].checksum, crc);
  // A flipped bit in the disk entry's key.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = bytes.find(std::string("PDK1"));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 5] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  entries.clear();
  EXPECT_EQ(read(&entries).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace driftkv
