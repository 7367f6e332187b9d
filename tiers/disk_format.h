// The on-disk format of the disk level (tiers/disk_page_store.h): segment
// files of records, each sealed by a footer that indexes it.
//
// READ ME FIRST. A segment file `seg-NNNNNNNNNNNNNNNN.dks` (16 hex digits,
// ids never reused) is a sequence of records appended at boundaries of
// its BLOCK, so that every record can be written and read with O_DIRECT
// (offset, length and buffer multiples of the device's logical block).
// The block is the store's (tiers/disk_page_store.h: 512 where the device
// takes O_DIRECT I/O of 512 bytes, else 4096), a power of two in [512,
// 4096], the same for every record of a segment, and written in each
// header and trailer (version 2; version 1, still read, is 4096 always).
// A record is
//
//   header  (kRecordHeaderBytes = 64, little-endian)
//     [0, 4)   u32 magic 'DKR1'
//     [4, 6)   u16 type: 1 page, 2 tombstone (an Erase; no payload)
//     [6, 8)   u16 format version (2)
//     [8, 16)  u64 key (the caller's)
//     [16, 24) u64 sequence number (store-wide, increasing, never reused)
//     [24, 28) u32 payload bytes
//     [28, 32) u32 CRC-32C of the payload (the page's own checksum)
//     [32, 36) u32 block bytes (version 2; zero in version 1)
//     [36, 60) zero
//     [60, 64) u32 CRC-32C of bytes [0, 60)
//   payload (payload bytes), then zeros up to the next multiple of the block.
//
// A sealed segment ends with its footer, written once after the last record
// (when the segment is full, or at a clean close, or when open recovers an
// unsealed one):
//
//   entries (kFooterEntryBytes = 32 each, in sequence order, which is
//   also the order of their offsets)
//     [0, 8) u64 key | [8, 16) u64 sequence | [16, 20) u32 record offset /
//     block | [20, 24) u32 payload bytes | [24, 28) u32 payload CRC-32C |
//     [28, 30) u16 type | [30, 32) u16 zero
//   zeros, so that the trailer ends the file at a multiple of the block
//   trailer (kTrailerBytes = 64, the file's last bytes)
//     [0, 4) u32 magic 'DKF1' | [4, 8) u32 version (2) | [8, 16) u64 entry
//     count | [16, 24) u64 offset of the first entry | [24, 32) u64 end of
//     the records (the first entry's offset or less) | [32, 36) u32 CRC-32C
//     of the entries | [36, 40) u32 block bytes (version 2; zero in 1) |
//     [40, 60) zero | [60, 64) u32 CRC-32C of [0, 60)
//
// Open reads the footer of a sealed segment (two reads) and never its
// pages. A segment without a valid footer (the one being written when the
// process died) is scanned record by record, payloads verified, from a bad
// header on at every 512-byte boundary; what verifies is kept and sealed.
// A footer lists only records whose write completed: a failed write is
// never indexed, even if its bytes partly reached the file.
#ifndef DRIFTKV_TIERS_DISK_FORMAT_H_
#define DRIFTKV_TIERS_DISK_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace driftkv {
namespace tiers {

// The largest block, and the alignment of every I/O buffer in memory.
constexpr size_t kDiskAlign = 4096;
// The smallest block (the scan's step).
constexpr size_t kMinBlock = 512;
constexpr size_t kRecordHeaderBytes = 64;
constexpr size_t kFooterEntryBytes = 32;
constexpr size_t kTrailerBytes = 64;
constexpr uint32_t kRecordMagic = 0x31524B44;   // "DKR1"
constexpr uint32_t kTrailerMagic = 0x31464B44;  // "DKF1"
constexpr uint16_t kFormatVersion = 2;          // 1 (blocks of 4096) is still read
// A record offset is stored in blocks in 32 bits: 2 TiB per segment at
// 512 bytes, beyond any segment size we accept.
constexpr uint64_t kMaxSegmentBytes = uint64_t{1} << 40;
// The largest payload a header may claim (a reader believes no more before
// allocating): 64 MiB, 700 times a cold page.
constexpr uint32_t kMaxPayloadBytes = 64u << 20;
static_assert(kRecordHeaderBytes % 8 == 0 && kRecordHeaderBytes < kDiskAlign, "header fits the first block");
static_assert(kTrailerBytes <= kDiskAlign, "the trailer fits the last block");

enum class RecordType : uint16_t { kPage = 1, kTombstone = 2 };

// One record as the header (or a footer entry) describes it.
struct RecordInfo {
  RecordType type = RecordType::kPage;
  uint64_t key = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;  // of the header in the segment; a multiple of block
  uint32_t payload_bytes = 0;
  uint32_t payload_crc = 0;
  uint32_t block = kDiskAlign;  // the segment's block
};

// A power of two in [kMinBlock, kDiskAlign].
inline constexpr bool ValidBlock(uint64_t block) {
  return block >= kMinBlock && block <= kDiskAlign && (block & (block - 1)) == 0;
}
inline constexpr uint64_t RoundUpToBlock(uint64_t n, uint64_t block = kDiskAlign) {
  return (n + block - 1) / block * block;
}
// Bytes a record of `payload_bytes` occupies in a segment of `block`,
// header and padding included.
inline constexpr uint64_t RecordBytes(uint64_t payload_bytes, uint64_t block = kDiskAlign) {
  return RoundUpToBlock(kRecordHeaderBytes + payload_bytes, block);
}
// Bytes of a footer of `entries` entries, trailer included.
inline constexpr uint64_t FooterBytes(uint64_t entries, uint64_t block = kDiskAlign) {
  return RoundUpToBlock(entries * kFooterEntryBytes + kTrailerBytes, block);
}

// Writes the 64-byte header of `r` (offset is not stored; r.block is) to
// `out`.
void EncodeRecordHeader(const RecordInfo& r, uint8_t* out);
// Parses 64 bytes as a header: magic, version (1: block 4096; 2: a valid
// block), type, header CRC and payload bytes <= kMaxPayloadBytes; a
// tombstone has no payload. Any other bytes give DATA_LOSS saying which
// check failed. r->offset is left alone.
absl::Status ParseRecordHeader(const uint8_t* in, RecordInfo* r);

// The footer of `entries` (sorted by seq) of a segment of `block` whose
// records end at `records_end` (a multiple of it), to be written at
// `records_end`: FooterBytes(n, block) bytes.
std::vector<uint8_t> EncodeFooter(const std::vector<RecordInfo>& entries, uint64_t records_end,
                                  uint32_t block = kDiskAlign);
// Parses the trailer in the last kTrailerBytes of a file of `file_size`
// bytes: *entries and *entries_offset tell what to read next, *block is
// the segment's.
absl::Status ParseTrailer(const uint8_t* in, uint64_t file_size, uint64_t* entries, uint64_t* entries_offset,
                          uint64_t* records_end, uint32_t* entries_crc, uint32_t* block);
// Parses `count` entries of a segment of `block` and checks them against
// the trailer: CRC, types, sequence strictly increasing, records inside
// [0, records_end), aligned and not overlapping.
absl::Status ParseFooterEntries(const uint8_t* in, uint64_t count, uint32_t entries_crc, uint64_t records_end,
                                uint32_t block, std::vector<RecordInfo>* out);

// "seg-%016x.dks" and back (false for any other name).
std::string SegmentFileName(uint64_t id);
bool ParseSegmentFileName(const std::string& name, uint64_t* id);

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_DISK_FORMAT_H_
