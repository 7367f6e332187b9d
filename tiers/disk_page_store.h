// The disk level: fixed-size pages under caller-chosen 64-bit keys, in
// segment files under one directory, within a byte budget. The format is
// tiers/disk_format.h; docs/tiers.md has the figures.
//
// I/O. PutAsync copies the page into a queue of at most queue_capacity
// pages (a full queue makes the caller wait up to submit_wait, then
// UNAVAILABLE: memory stays bounded). write_threads writers each take the
// run of queued records at its head, up to max_write_bytes, give them
// adjacent offsets and write them with one pwritev (O_DIRECT): a page is
// 74 KB, and a disk wants megabytes per request. GetAsync queues one
// pread of the record on read_threads readers (tiers/io_queue.h, the same
// bound). Why threads and not io_uring: docs/tiers.md, "I/O".
//
// PAGES. Every page has `page_bytes` bytes and travels with its CRC-32C
// (backends/page_checksum.h's: the one the handler keeps beside each page).
// Put checks the bytes against it before writing them (a page that does not
// match is refused, never stored with a fresh checksum); Get checks them
// again after reading and answers DATA_LOSS, naming the key and the file,
// leaving `dst` untouched: never bad bytes as good.
//
// STORED. A Put is reported stored (its callback gets OK) once its record
// is written and the durability policy is met; only then do Contains and
// Get see it. A Put that fails (budget, queue full, I/O error, disk full)
// is not indexed, now or after a restart, even if part of its bytes reached
// the file. Durability:
//   kProcess   the write returned: the bytes are the kernel's (with
//              O_DIRECT, the device's). Survives kill -9 of this process;
//              a power loss or kernel crash may lose records of the
//              segment being written (sealed ones were fdatasync'ed).
//   kPowerLoss the segment was also fdatasync'ed after the write call that
//              carried the record (one per batch: group commit), and the
//              folder after a segment file was created or deleted:
//              survives a power loss on a device that honours flushes.
// A segment is sealed (footer written, fdatasync'ed) in both modes when it
// is full and at a clean close.
//
// RESTART. Open reads each sealed segment's footer (no page is read) and
// scans, payloads verified, only a segment left unsealed by a crash; a torn
// record at its tail is dropped, the records before it kept, and the
// segment sealed. Erase writes a tombstone record, so an erased key stays
// erased after a restart. wipe_at_open removes every segment file instead.
//
// SPACE. Every record occupies record_bytes() (block-aligned) plus a
// footer entry; the budget counts these and each segment's footer block
// (the segment being written is preallocated, up to what the budget has
// left: the disk holds up to one segment_bytes more than the budget
// counts). A
// segment none of whose records is still the current one for its key (and
// that hides no older record of a key that another segment still holds) is
// deleted. Not compacted: a segment with one live record keeps its space.
//
// Thread-safe. Callbacks run on an I/O thread and may call the store (not
// Flush, nor destroy it). ORDER: writes (pages and tombstones) get their
// sequence numbers in the order PutAsync and Erase accepted them, so of two
// operations on one key the later one wins, now and after a restart,
// whichever finishes first. Erase acts on what is stored: a Put of the key
// still in flight is not erased by it (NOT_FOUND when nothing was stored).
#ifndef DRIFTKV_TIERS_DISK_PAGE_STORE_H_
#define DRIFTKV_TIERS_DISK_PAGE_STORE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tiers/aligned_buffer.h"
#include "tiers/disk_format.h"
#include "tiers/file_io.h"
#include "tiers/io_queue.h"

namespace driftkv {
namespace tiers {

enum class Durability { kProcess, kPowerLoss };

struct DiskPageStoreOptions {
  std::string dir;            // created (one level) when missing
  size_t page_bytes = 0;      // every page's size, (0, kMaxPayloadBytes]
  uint64_t budget_bytes = 0;  // segment files' bytes, footers included
  uint64_t segment_bytes = uint64_t{128} << 20;
  // Reserve a new segment's blocks when it is created (fallocate), so that
  // writes into it do not extend the file: ext4 serialises O_DIRECT writes
  // that do. The disk then holds up to one segment beyond the budget.
  bool preallocate = true;
  int read_threads = 16;                         // GetAsync: pread of one record each
  int write_threads = 4;                         // each writes a run of queued records in one pwritev
  uint64_t max_write_bytes = uint64_t{8} << 20;  // of one pwritev
  // Pages accepted by PutAsync and not yet written (each holds a copy of
  // its page), and reads waiting, each at most this many.
  int queue_capacity = 256;  // 20 MB of 74 KB pages
  // How long PutAsync/GetAsync wait for room before answering UNAVAILABLE.
  absl::Duration submit_wait = absl::Milliseconds(100);
  bool wipe_at_open = false;
  // The block of new segments (tiers/disk_format.h): 0 chooses at open,
  // 512 when the directory's device takes an O_DIRECT write of 512 bytes
  // (or O_DIRECT is off), else 4096; or one of 512, 1024, 2048, 4096.
  uint32_t block_bytes = 0;
  // O_DIRECT when the file system takes it (falls back silently: stats()
  // says which was used).
  bool direct_io = true;
  Durability durability = Durability::kProcess;
  FileIo* io = nullptr;  // nullptr: FileIo::Posix(); must outlive the store
};

struct DiskPageStoreStats {
  uint64_t pages = 0;       // keys stored
  uint64_t bytes_used = 0;  // charged to the budget
  uint64_t segments = 0;
  uint64_t puts = 0, gets = 0, erases = 0;  // that succeeded
  uint64_t checksum_failures = 0;           // Gets answered DATA_LOSS for the bytes read
  uint64_t put_crc_mismatches = 0;          // Puts refused: bytes did not match their CRC
  uint64_t write_failures = 0;              // I/O errors of writes (ENOSPC among them)
  uint64_t write_calls = 0;                 // pwritev calls: records / write_calls is the batching
  uint64_t budget_refusals = 0;
  uint64_t queue_refusals = 0;
  uint64_t segments_deleted = 0;
  uint64_t lost_segments = 0;  // segment files found removed under the store
  uint64_t lost_pages = 0;     // the keys they held, dropped
  bool direct_io = false;
  uint32_t block_bytes = 0;  // of the segments it writes
  // What Open did.
  uint64_t open_segments_footer = 0, open_segments_scanned = 0;
  uint64_t open_bytes_read = 0, open_skipped_blocks = 0, open_corrupt_records = 0;
  double open_seconds = 0;
};

class DiskPageStore {
 public:
  using Callback = std::function<void(absl::Status)>;

  // Validates the options (INVALID_ARGUMENT naming the field), restores
  // the index from the directory (or wipes it), and starts the threads.
  static absl::StatusOr<std::unique_ptr<DiskPageStore>> Open(const DiskPageStoreOptions& options);
  // Finishes every queued job, then seals the segment being written.
  ~DiskPageStore();
  DiskPageStore(const DiskPageStore&) = delete;
  DiskPageStore& operator=(const DiskPageStore&) = delete;

  // Copies `bytes` (page_bytes of them) and queues their write under `key`,
  // replacing what the key held once written. A non-OK return means nothing
  // was queued and `done` will not run: INVALID_ARGUMENT (size),
  // RESOURCE_EXHAUSTED (the budget, named), UNAVAILABLE (queue full after
  // submit_wait). Otherwise `done` gets OK (stored), DATA_LOSS (`bytes` do
  // not match `crc32c`), RESOURCE_EXHAUSTED (disk full) or UNAVAILABLE
  // (I/O error, the directory gone).
  absl::Status PutAsync(uint64_t key, const uint8_t* bytes, uint32_t crc32c, Callback done);
  // Queues a read of `key` into `dst` (page_bytes; must stay valid until
  // `done` runs). Non-OK return: NOT_FOUND, UNAVAILABLE (queue full).
  // `done` gets OK, DATA_LOSS naming the key, the file and the offset (dst
  // then holds no page), or UNAVAILABLE (I/O error).
  absl::Status GetAsync(uint64_t key, uint8_t* dst, Callback done);
  // The same, waiting for `done`.
  absl::Status Put(uint64_t key, const uint8_t* bytes, uint32_t crc32c);
  absl::Status Get(uint64_t key, uint8_t* dst);
  // Writes a tombstone for `key` and forgets it (NOT_FOUND when absent),
  // waiting for the write. When the tombstone cannot be written (disk full,
  // I/O error) the key is forgotten all the same and the error says that
  // it may come back after a restart.
  absl::Status Erase(uint64_t key);
  bool Contains(uint64_t key) const;
  // Every key stored now, in no particular order (what a restart found,
  // for a caller that decides which of them it still names).
  std::vector<uint64_t> Keys() const;
  // Waits until every job queued so far has finished.
  void Flush();
  // Looks for segment files removed under the store (the directory deleted
  // or cleaned by hand): their keys are dropped and counted, the next write
  // starts a new segment (recreating the directory). Writes check their own
  // segment after every write; this checks all.
  void CheckFiles();

  uint64_t bytes_used() const;
  uint64_t budget_bytes() const { return options_.budget_bytes; }
  // The block of the segments it writes, and what one page's record takes
  // in them (footer entry not included).
  uint32_t block_bytes() const { return block_; }
  uint64_t record_bytes() const { return record_bytes_; }
  size_t page_bytes() const { return options_.page_bytes; }
  DiskPageStoreStats stats() const;

 private:
  struct SegmentFile;  // an open segment file (shared with reads in flight)
  struct Segment;      // a segment's bookkeeping
  struct Location {
    uint64_t segment = 0;
    RecordInfo record;
  };
  struct Allocation {
    std::shared_ptr<SegmentFile> file;
    uint64_t segment = 0;
    RecordInfo record;  // offset and sequence chosen
    // Zeros written after the record, up to a kDiskAlign boundary (ALIGNED
    // WRITES in the .cc).
    uint64_t pad_after = 0;
  };

  explicit DiskPageStore(const DiskPageStoreOptions& options);
  absl::Status Restore();
  // Records `r` of segment `id` as written, in sequence order at Open or
  // at the completion of a write.
  void Apply(uint64_t id, const RecordInfo& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for `record` (type, key, size, CRC) in the active segment, or in
  // a new one; the segment left behind goes to *to_seal when it has no
  // write in flight.
  absl::StatusOr<Allocation> Allocate(const RecordInfo& record, std::vector<uint64_t>* to_seal)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::shared_ptr<SegmentFile>> CreateSegmentFile(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The write of a record (page or tombstone) and its bookkeeping; the job
  // an I/O thread runs.
  // A record accepted for writing: its bytes (header left to fill,
  // RecordBytes of the payload), what it is, its budget charge, and who to
  // tell.
  struct PendingWrite {
    std::shared_ptr<AlignedBuffer> buffer;
    RecordInfo record;
    uint64_t charge = 0;
    Callback done;
    // Set by the writer that takes it: where it goes, or why nowhere.
    Allocation alloc;
    absl::Status status;
  };
  // Waits up to submit_wait for room among the accepted writes, then
  // queues `w` for the writer threads.
  absl::Status Accept(PendingWrite w);
  void WriterLoop();
  // Writes `batch` (taken from pending_ in order and allocated): seals
  // `to_seal`, checks each page's CRC, writes each run of adjacent records
  // in one pwritev, indexes what was written, runs the callbacks.
  void WriteBatch(std::vector<PendingWrite> batch, const std::vector<uint64_t>& to_seal);
  // Rounds the active segment's end up to kDiskAlign after `batch`'s
  // records (ALIGNED WRITES in the .cc).
  void PadToAlign(std::vector<PendingWrite>* batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReadRecord(uint64_t key, uint8_t* dst);
  // Writes the footer of segment `id` (no write in flight, not active).
  void Seal(uint64_t id);
  void SealAll(const std::vector<uint64_t>& ids);
  // Deletes `id` and every segment that becomes deletable by that.
  void MaybeDelete(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Deletable(const Segment& s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Segment `id`'s file is gone: drop its keys.
  void LoseSegment(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncDir();

  const DiskPageStoreOptions options_;
  FileIo* const io_;
  // Set by Open before anything else runs.
  uint32_t block_ = kDiskAlign;
  uint64_t record_bytes_ = 0;  // RecordBytes(page_bytes, block_)
  uint64_t SegmentOverhead() const { return 2 * uint64_t{block_}; }

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Location> index_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::unique_ptr<Segment>> segments_ ABSL_GUARDED_BY(mu_);
  uint64_t active_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none yet
  uint64_t next_segment_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;      // charged by existing segments
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;  // charged by queued writes
  bool direct_ ABSL_GUARDED_BY(mu_) = false;
  bool restoring_ ABSL_GUARDED_BY(mu_) = false;  // Open is replaying the segments
  DiskPageStoreStats stats_ ABSL_GUARDED_BY(mu_);
  std::deque<PendingWrite> pending_ ABSL_GUARDED_BY(mu_);
  int accepted_ ABSL_GUARDED_BY(mu_) = 0;   // pending_ and batches being written
  int callbacks_ ABSL_GUARDED_BY(mu_) = 0;  // of written batches, not yet run
  bool stop_writers_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> writers_;

  // Reads. Last: its destructor runs the queued reads while the rest still
  // exists.
  std::unique_ptr<IoQueue> queue_;
};

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_DISK_PAGE_STORE_H_
