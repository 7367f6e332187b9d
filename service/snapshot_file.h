// The snapshot file of a drained server (docs/reliability.md, "Snapshot
// file"): every sequence's layers (length, bf16 window, pages in cold form
// with their CRC-32C), written at drain and read at the next start.
//
// Byte layout, little-endian, one file `snapshot.dkvs` in snapshot_dir:
//   header    "DKVSNAP\0" (8) | u32 version (2) | u32 identity bytes |
//             identity (text, "key=value\n" lines: the codec, shape and page
//             size the pages were written with; from version 2 also
//             "tenancy=tokens" or "tenancy=none", whether the keys carry
//             tenants) | u32 CRC-32C of all before
//   tombstones (version 3) u32 'TMB1' | u32 count | u32 entry bytes |
//             u32 CRC-32C of those 12 bytes | entries: (u32 key bytes | key |
//             u64 nanoseconds left) x count | u32 CRC-32C of the entries
//   sequence  u32 'SEQ1' | u32 id bytes | id | u32 layers |
//             u32 CRC-32C of this record's bytes before it
//     layer   u64 length | u32 window tokens | u32 pages |
//             u32 CRC-32C of those 16 bytes |
//             bf16 keys [window tokens][n] | bf16 values [window tokens][n] |
//             u32 CRC-32C of the window's bytes |
//       page  u32 page checksum (backends/page_checksum.h) | page bytes
//             (the cold page, page_bytes of the identity); from version 4
//             each page entry starts with a tag: u32 'PGE1' then the page
//             as above, or u32 'PRF1' | u64 ordinal | u32 CRC-32C of those
//             12 bytes: the same bytes as the file's ordinal-th full page
//             (counted from 0 over the whole file), held once after a
//             restore (docs/prefix_cache.md, "Snapshots")
//       digests (version 3, after the pages) u32 count (pages x P) |
//             u32 CRC-32C of the count | u64 token digest x count
//             (service/token_digest.h; 0: none) | u32 CRC-32C of them
//   index     (version 4, after the sequences) u32 'IDX1' | u64 entries |
//             u32 CRC-32C of those 12 bytes; per entry, least recent
//             first: 16 namespace | 16 page key | u32 layer | u32 CRC-32C of
//             those 36 bytes | a page entry | digests as a layer's (P)
//   pins      (version 4) u32 'PIN1' | u64 pins | u32 CRC-32C of those 12
//             bytes; per pin: u32 key bytes | key | u32 pin_id bytes |
//             pin_id | u64 nanoseconds left | u32 pages | u32 CRC-32C of
//             the record | page entries x pages
//   trailer   u32 'END1' | u64 sequences | u64 pages | u32 CRC-32C of those 20 bytes
//   level page entries (version 5, in a sequence's layers only): u32
//             'PHL1' | u32 page checksum | page bytes: a page that was on
//             the host level (restored to it, never repeated, not counted
//             among the full pages); or u32 'PDK1' | u64 key | u32 page
//             checksum | u32 CRC-32C of those 16 bytes: a page left in the
//             disk level's store under `key` (docs/tiers.md, "Restart")
//
// Framing fields (ids, counts, lengths) are checked by their own CRCs before
// they are believed, so a flipped bit in a page or a window loses that
// sequence only; one in a framing field loses the rest of the file (reported,
// never guessed). Versions: 1 has no tenancy line (the keys' form is
// unknown: the loader keeps only keys without NUL or control bytes); 2 adds
// it; 3 adds the tombstones and each layer's token digests; 4 tags each
// page entry (a full page or a repeat). Readers take all four (no
// tombstones or digests before 3, every page whole before 4); 5 adds the
// level page entries, and is written only by a server with a level below
// the pool (so that a server without one stays readable by version 4's). A tombstone
// block or a digest array failing its CRC is lost alone (reported by its
// `intact`). The writer writes `snapshot.dkvs.tmp`, fsyncs it and renames
// it over `snapshot.dkvs` (then fsyncs the folder): a crash while writing
// leaves the previous snapshot or none, never a torn one.
#ifndef DRIFTKV_SERVICE_SNAPSHOT_FILE_H_
#define DRIFTKV_SERVICE_SNAPSHOT_FILE_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "backends/page_checksum.h"

namespace driftkv {

constexpr char kSnapshotMagic[8] = {'D', 'K', 'V', 'S', 'N', 'A', 'P', '\0'};
constexpr uint32_t kSnapshotVersion = 5;
constexpr uint32_t kSnapshotFirstTenancyVersion = 2;     // identity has "tenancy="
constexpr uint32_t kSnapshotFirstDigestVersion = 3;      // tombstones and digests
constexpr uint32_t kSnapshotFirstSharedVersion = 4;      // tagged page entries
constexpr uint32_t kSnapshotPageTag = 0x31454750;        // "PGE1"
constexpr uint32_t kSnapshotSharedPageTag = 0x31465250;  // "PRF1"
constexpr uint32_t kSnapshotFirstLevelVersion = 5;       // host and disk page entries
constexpr uint32_t kSnapshotHostPageTag = 0x314C4850;    // "PHL1"
constexpr uint32_t kSnapshotDiskPageTag = 0x314B4450;    // "PDK1"
constexpr uint32_t kSnapshotIndexTag = 0x31584449;       // "IDX1"
constexpr uint32_t kSnapshotPinsTag = 0x314E4950;        // "PIN1"
constexpr uint32_t kSnapshotMaxPinPages = 1u << 24;
constexpr uint32_t kSnapshotTombstoneTag = 0x31424D54;  // "TMB1"
constexpr uint32_t kSnapshotMaxTombstoneBytes = 1u << 30;
constexpr uint32_t kSnapshotSequenceTag = 0x31514553;  // "SEQ1"
constexpr uint32_t kSnapshotEndTag = 0x31444E45;       // "END1"
constexpr const char* kSnapshotFileName = "snapshot.dkvs";
// Upper bounds a reader believes (after the CRC) before allocating.
constexpr uint32_t kSnapshotMaxIdentityBytes = 1 << 16;
constexpr uint32_t kSnapshotMaxIdBytes = 1 << 16;

// The path of the snapshot in `dir`.
std::string SnapshotPath(const std::string& dir);

// The first line where two identities differ, as "KEY: snapshot VALUE, this
// server VALUE" ("" when they are equal).
std::string IdentityDifference(absl::string_view snapshot, absl::string_view server);

// Writes a snapshot in the order of the layout above. Each method fails
// with the path and the OS error; after a failure the writer is useless and
// the temporary file is removed on destruction.
class SnapshotWriter {
 public:
  // `version`: an older one writes that version's layout (tests of the
  // readers of old files).
  static absl::StatusOr<std::unique_ptr<SnapshotWriter>> Open(const std::string& dir, absl::string_view identity,
                                                              size_t page_bytes, uint32_t version = kSnapshotVersion);
  ~SnapshotWriter();

  // Version 3: the tombstones, (key, nanoseconds left); before the first
  // sequence (none written: an empty block).
  absl::Status Tombstones(const std::vector<std::pair<std::string, uint64_t>>& entries);
  absl::Status BeginSequence(absl::string_view id, uint32_t layers);
  // Window bf16 arrays of window_tokens * n values each.
  absl::Status BeginLayer(uint64_t length, uint32_t window_tokens, uint32_t pages,
                          absl::Span<const uint16_t> window_keys, absl::Span<const uint16_t> window_values);
  // A full page: the file's full_pages()-th before the call.
  absl::Status Page(const uint8_t* bytes, PageChecksum checksum);
  // Version 4: a page entry repeating full page `ordinal` (< full_pages()).
  absl::Status SharedPage(uint64_t ordinal);
  // Version 5, in a layer: a page that is on the host level (its bytes),
  // or one that stays in the disk level's store under `key`.
  absl::Status HostPage(const uint8_t* bytes, PageChecksum checksum);
  absl::Status DiskPage(uint64_t key, PageChecksum checksum);
  uint64_t full_pages() const { return full_pages_; }
  // Version 3: after a layer's pages, its token digests (pages x P).
  absl::Status Digests(absl::Span<const uint64_t> digests);
  // Version 4, after the last sequence: the index block's header, then
  // per entry IndexEntry, its page (Page or SharedPage) and Digests(P);
  // then the pins' header, per pin Pin and its page entries. Commit
  // writes empty blocks where none was begun.
  absl::Status BeginIndex(uint64_t entries);
  absl::Status IndexEntry(absl::string_view ns, absl::string_view key, uint32_t layer);
  absl::Status BeginPins(uint64_t pins);
  absl::Status Pin(absl::string_view key, absl::string_view pin_id, uint64_t nanoseconds_left, uint32_t pages);
  uint32_t version() const { return version_; }
  // Trailer, fsync, rename, fsync of the folder.
  absl::Status Commit();

 private:
  SnapshotWriter() = default;
  absl::Status Write(const void* data, size_t size);
  absl::Status WriteWithCrc(const std::string& bytes);

  std::string dir_, tmp_path_, path_;
  size_t page_bytes_ = 0;
  uint32_t version_ = kSnapshotVersion;
  bool tombstones_written_ = false;
  FILE* file_ = nullptr;
  bool committed_ = false;
  uint64_t sequences_ = 0, pages_ = 0, full_pages_ = 0;
  bool index_written_ = false, pins_written_ = false;
};

// Reads a snapshot record by record. Open checks the header (magic,
// version 1 to kSnapshotVersion, CRC) and returns the identity; Next* follow the layout. A
// DataLoss status from a framing read means the rest of the file cannot be
// trusted; a page whose checksum does not match is reported by Page's
// `*intact`, and reading can go on.
class SnapshotReader {
 public:
  static absl::StatusOr<std::unique_ptr<SnapshotReader>> Open(const std::string& path);
  ~SnapshotReader();
  const std::string& identity() const { return identity_; }
  uint32_t version() const { return version_; }
  // Version 3: the tombstones read by Open, (key, nanoseconds left);
  // tombstones_intact() is false when their CRC failed (then none).
  const std::vector<std::pair<std::string, uint64_t>>& tombstones() const { return tombstones_; }
  bool tombstones_intact() const { return tombstones_intact_; }

  // false in *more at the end of the sequences: the trailer (whose CRC
  // and counts are checked) before version 4, the index block's header
  // from version 4 (then read the index, the pins and Finish).
  absl::Status NextSequence(bool* more, std::string* id, uint32_t* layers);
  // Version 4, after NextSequence's end: the index's entry count (0
  // before version 4), each entry's header (then its page entry and
  // Digests(P)), the pins' count, each pin's header (then `pages` page
  // entries), and the trailer (Finish; nothing before version 4).
  uint64_t index_entries() const { return index_entries_; }
  struct IndexHeader {
    std::string ns, key;  // 16 bytes each
    uint32_t layer = 0;
  };
  absl::Status NextIndexEntry(IndexHeader* entry);
  absl::Status BeginPins(uint64_t* pins);
  struct PinHeader {
    std::string key, pin_id;
    uint64_t nanoseconds_left = 0;
    uint32_t pages = 0;
  };
  absl::Status NextPin(PinHeader* pin);
  absl::Status Finish();
  struct LayerHeader {
    uint64_t length = 0;
    uint32_t window_tokens = 0;
    uint32_t pages = 0;
  };
  // `n` values per token; *window_intact is false when the window's CRC
  // does not match (the sequence is then lost, the reading goes on). A
  // window longer than max_window_tokens is DataLoss (nothing allocated).
  absl::Status NextLayer(size_t n, uint32_t max_window_tokens, LayerHeader* header, std::vector<uint16_t>* keys,
                         std::vector<uint16_t>* values, bool* window_intact);
  // Each page entry begins here: *shared false for a full page (then read
  // it with Page), true for a repeat of full page *ordinal (< the full
  // pages read so far, or DataLoss). Before version 4 every entry is a
  // full page and nothing is read.
  absl::Status NextPageKind(bool* shared, uint64_t* ordinal);
  // A layer's page entry, which from version 5 may also be on a level
  // below: kHost (then read its bytes with Page; not a full page, never
  // repeated) or kDisk (a key and the page's checksum, nothing more to
  // read). NextPageKind takes only the first two kinds (DataLoss for a
  // level entry: the index and the pins hold pool pages only).
  struct PageEntry {
    enum Kind { kFull, kShared, kHost, kDisk };
    Kind kind = kFull;
    uint64_t ordinal = 0;       // kShared
    uint64_t disk_key = 0;      // kDisk
    PageChecksum checksum = 0;  // kDisk
  };
  absl::Status NextPageEntry(PageEntry* entry);
  // Reads one full page of `page_bytes` into `out`; *intact: its CRC-32C
  // matches the stored checksum (*stored). From version 4 only after
  // NextPageKind said a full page.
  absl::Status Page(size_t page_bytes, uint8_t* out, PageChecksum* stored, bool* intact);
  uint64_t full_pages() const { return full_pages_; }
  // Version 3, after a layer's pages: its digests, `count` of them (pages x
  // P; another count is DataLoss). *intact false: their CRC failed.
  absl::Status Digests(uint64_t count, std::vector<uint64_t>* out, bool* intact);

 private:
  SnapshotReader() = default;
  absl::Status ReadTombstones();
  absl::Status Read(void* data, size_t size, absl::string_view what);

  std::string path_;
  FILE* file_ = nullptr;
  std::string identity_;
  uint32_t version_ = 0;
  std::vector<std::pair<std::string, uint64_t>> tombstones_;
  bool tombstones_intact_ = true;
  uint64_t sequences_ = 0, pages_ = 0, full_pages_ = 0;
  // From version 4: what the last page entry's tag said comes next.
  enum class Next { kTag, kFullPage, kHostPage };
  Next next_ = Next::kTag;
  uint64_t index_entries_ = 0;
  absl::Status ReadTrailer(const uint8_t tag[4]);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SNAPSHOT_FILE_H_
