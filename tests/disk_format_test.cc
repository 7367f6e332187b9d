// The disk level's format (tiers/disk_format.h, tiers/segment_reader.h):
// headers and footers round-trip; every corruption of a header or a footer
// is refused with DATA_LOSS, never believed; a segment without a valid
// footer is scanned, keeping exactly the records whose header and payload
// verify, across holes and torn tails.
#include "tiers/disk_format.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tests/disk_test_util.h"
#include "tiers/segment_reader.h"

namespace driftkv {
namespace tiers {
namespace {

RecordInfo Page(uint64_t key, uint64_t seq, uint32_t bytes, uint32_t crc) {
  RecordInfo r;
  r.key = key;
  r.seq = seq;
  r.payload_bytes = bytes;
  r.payload_crc = crc;
  return r;
}

TEST(DiskFormatTest, HeaderRoundTripsAndEveryFlippedByteIsRefused) {
  const RecordInfo r = Page(0x1122334455667788ull, 42, 74496, 0xDEADBEEF);
  uint8_t h[kRecordHeaderBytes];
  EncodeRecordHeader(r, h);
  RecordInfo back;
  ASSERT_TRUE(ParseRecordHeader(h, &back).ok());
  EXPECT_EQ(back.key, r.key);
  EXPECT_EQ(back.seq, r.seq);
  EXPECT_EQ(back.payload_bytes, r.payload_bytes);
  EXPECT_EQ(back.payload_crc, r.payload_crc);
  EXPECT_EQ(back.type, RecordType::kPage);
  for (size_t i = 0; i < kRecordHeaderBytes; ++i) {
    uint8_t bad[kRecordHeaderBytes];
    std::memcpy(bad, h, sizeof(bad));
    bad[i] ^= 0x04;
    EXPECT_TRUE(absl::IsDataLoss(ParseRecordHeader(bad, &back))) << "byte " << i;
  }
}

// Version 1 headers (blocks of 4096, bytes [32, 60) zero) still parse;
// version 2 carries its block, and one that is not a power of two in
// [512, 4096] is refused.
TEST(DiskFormatTest, HeadersCarryTheirBlock) {
  RecordInfo r = Page(7, 9, 1000, 0x1234);
  r.block = 512;
  uint8_t h[kRecordHeaderBytes];
  EncodeRecordHeader(r, h);
  RecordInfo back;
  ASSERT_TRUE(ParseRecordHeader(h, &back).ok());
  EXPECT_EQ(back.block, 512u);
  EXPECT_EQ(RecordBytes(1000, 512), 1536u);
  EXPECT_EQ(RecordBytes(1000), 4096u);
  auto reseal = [](uint8_t* bytes) {
    const uint32_t crc = Crc32cExtend(0, bytes, 60);
    std::memcpy(bytes + 60, &crc, 4);
  };
  uint8_t v1[kRecordHeaderBytes];
  std::memcpy(v1, h, sizeof(v1));
  const uint16_t one = 1;
  std::memcpy(v1 + 6, &one, 2);
  std::memset(v1 + 32, 0, 4);
  reseal(v1);
  ASSERT_TRUE(ParseRecordHeader(v1, &back).ok());
  EXPECT_EQ(back.block, kDiskAlign);
  for (uint32_t bad : {0u, 256u, 768u, 8192u}) {
    uint8_t b[kRecordHeaderBytes];
    std::memcpy(b, h, sizeof(b));
    std::memcpy(b + 32, &bad, 4);
    reseal(b);
    EXPECT_TRUE(absl::IsDataLoss(ParseRecordHeader(b, &back))) << bad;
  }
  // A footer of 512-byte blocks round-trips, offsets in its units.
  std::vector<RecordInfo> entries = {Page(1, 1, 100, 0), Page(2, 2, 100, 0)};
  for (RecordInfo& e : entries) e.block = 512;
  entries[1].offset = 512;
  const std::vector<uint8_t> footer = EncodeFooter(entries, 1024, 512);
  EXPECT_EQ(footer.size(), 512u);
  uint64_t count = 0, at = 0, end = 0;
  uint32_t crc = 0, block = 0;
  ASSERT_TRUE(
      ParseTrailer(footer.data() + footer.size() - kTrailerBytes, 1024 + footer.size(), &count, &at, &end, &crc, &block)
          .ok());
  EXPECT_EQ(block, 512u);
  std::vector<RecordInfo> out;
  ASSERT_TRUE(ParseFooterEntries(footer.data(), count, crc, end, block, &out).ok());
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].offset, 512u);
  EXPECT_EQ(out[1].block, 512u);
}

TEST(DiskFormatTest, SegmentFileNames) {
  uint64_t id = 0;
  EXPECT_EQ(SegmentFileName(0xabc), "seg-0000000000000abc.dks");
  EXPECT_TRUE(ParseSegmentFileName(SegmentFileName(0xfedcba9876543210ull), &id));
  EXPECT_EQ(id, 0xfedcba9876543210ull);
  EXPECT_FALSE(ParseSegmentFileName("seg-0000000000000ABC.dks", &id));
  EXPECT_FALSE(ParseSegmentFileName("seg-0000000000000abc.dks.tmp", &id));
}

// A segment image in memory, as the store writes it.
struct Image {
  std::vector<uint8_t> bytes;
  std::vector<RecordInfo> records;
  void Add(uint64_t key, uint32_t payload_bytes) {
    const std::vector<uint8_t> payload = testing::PageOf(key, payload_bytes);
    RecordInfo r = Page(key, records.size() + 1, payload_bytes, testing::CrcOf(payload));
    r.offset = bytes.size();
    bytes.resize(bytes.size() + RecordBytes(payload_bytes), 0);
    EncodeRecordHeader(r, bytes.data() + r.offset);
    std::memcpy(bytes.data() + r.offset + kRecordHeaderBytes, payload.data(), payload_bytes);
    records.push_back(r);
  }
  void Seal() {
    const std::vector<uint8_t> footer = EncodeFooter(records, bytes.size());
    bytes.insert(bytes.end(), footer.begin(), footer.end());
  }
  absl::StatusOr<SegmentIndex> Read() const {
    return ReadSegmentIndex(bytes.size(), [this](uint64_t at, size_t size, uint8_t* dst) {
      if (at + size > bytes.size()) return absl::OutOfRangeError("past the end");
      std::memcpy(dst, bytes.data() + at, size);
      return absl::OkStatus();
    });
  }
};

std::vector<uint64_t> Keys(const SegmentIndex& index) {
  std::vector<uint64_t> keys;
  for (const RecordInfo& r : index.records) keys.push_back(r.key);
  return keys;
}

TEST(DiskFormatTest, SealedSegmentIsReadFromItsFooterAlone) {
  Image img;
  for (uint64_t k = 0; k < 10; ++k) img.Add(k, 5000);
  img.Seal();
  absl::StatusOr<SegmentIndex> index = img.Read();
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(index->sealed);
  EXPECT_EQ(Keys(*index), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(index->bytes_read, kTrailerBytes + 10 * kFooterEntryBytes);
  for (size_t i = 0; i < 10; ++i) EXPECT_EQ(index->records[i].offset, img.records[i].offset);
}

TEST(DiskFormatTest, CorruptFooterFallsBackToTheScan) {
  Image img;
  for (uint64_t k = 0; k < 6; ++k) img.Add(k, 9000);
  img.Seal();
  const size_t footer_at = 6 * RecordBytes(9000);
  for (size_t at : {footer_at + 3, img.bytes.size() - 10, img.bytes.size() - kTrailerBytes + 9}) {
    Image bad = img;
    bad.bytes[at] ^= 1;
    absl::StatusOr<SegmentIndex> index = bad.Read();
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_FALSE(index->sealed) << at;
    EXPECT_FALSE(index->footer_problem.empty());
    EXPECT_EQ(Keys(*index), (std::vector<uint64_t>{0, 1, 2, 3, 4, 5})) << at;
    EXPECT_EQ(index->records_end, footer_at);
  }
}

TEST(DiskFormatTest, ScanKeepsVerifiedRecordsAcrossHolesAndTornTails) {
  Image img;
  for (uint64_t k = 0; k < 8; ++k) img.Add(k, 10000);
  const uint64_t rec = RecordBytes(10000);
  // Record 2: a hole (a write that never happened); record 5: a flipped
  // payload byte; the tail: record 7 cut in its payload.
  std::memset(img.bytes.data() + 2 * rec, 0, rec);
  img.bytes[5 * rec + kRecordHeaderBytes + 77] ^= 1;
  img.bytes.resize(7 * rec + kRecordHeaderBytes + 100);
  absl::StatusOr<SegmentIndex> index = img.Read();
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(Keys(*index), (std::vector<uint64_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(index->records_end, 7 * rec);
  // Record 5; the cut record 7 is a torn tail (its payload is not there to
  // verify), skipped like the hole.
  EXPECT_EQ(index->corrupt_records, 1u);
  EXPECT_GT(index->skipped_blocks, 0u);
}

TEST(DiskFormatTest, FooterEntriesMustNotOverlapOrGoBackwards) {
  std::vector<RecordInfo> entries = {Page(1, 1, 100, 0), Page(2, 2, 100, 0)};
  entries[1].offset = 0;  // overlaps the first
  std::vector<uint8_t> footer = EncodeFooter(entries, 2 * kDiskAlign);
  uint64_t count = 0, at = 0, end = 0;
  uint32_t crc = 0, block = 0;
  const uint64_t size = 2 * kDiskAlign + footer.size();
  ASSERT_TRUE(ParseTrailer(footer.data() + footer.size() - kTrailerBytes, size, &count, &at, &end, &crc, &block).ok());
  EXPECT_EQ(block, kDiskAlign);
  std::vector<RecordInfo> out;
  EXPECT_TRUE(absl::IsDataLoss(ParseFooterEntries(footer.data(), count, crc, end, block, &out)));
  entries[1].offset = kDiskAlign;
  footer = EncodeFooter(entries, 2 * kDiskAlign);
  EXPECT_TRUE(ParseFooterEntries(footer.data(), 2, crc = Crc32cExtend(0, footer.data(), 64), end, block, &out).ok());
}

}  // namespace
}  // namespace tiers
}  // namespace driftkv
