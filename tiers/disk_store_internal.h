// What the disk level's files share (tiers/disk_page_store.h): its
// segments' in-memory state and the system-call helpers of its I/O. The
// store is defined in three files, one job each: disk_page_store.cc (open,
// restart, reads, queries), disk_segments.cc (segment files: creation,
// seal, deletion, loss) and disk_writes.cc (the write queue, its writers
// and Erase). Internal to tiers.
#ifndef DRIFTKV_TIERS_DISK_STORE_INTERNAL_H_
#define DRIFTKV_TIERS_DISK_STORE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tiers/disk_format.h"
#include "tiers/disk_page_store.h"
#include "tiers/file_io.h"

namespace driftkv {
namespace tiers {

// An open segment file. Reads hold a reference, so that a segment deleted
// (unlinked) meanwhile keeps its descriptor until they finish.
struct DiskPageStore::SegmentFile {
  FileIo* io = nullptr;
  std::string path;
  int fd = -1;
  ~SegmentFile() {
    if (fd >= 0) io->Close(fd);
  }
};

struct DiskPageStore::Segment {
  std::shared_ptr<SegmentFile> file;
  uint32_t block = kDiskAlign;  // of its records and footer
  uint64_t end = 0;             // where the next record goes
  uint64_t charged = 0;         // bytes counted in used_
  int inflight = 0;             // writes allocated here and not finished
  bool sealed = false;          // footer written, or being written
  bool lost = false;            // the file was removed under the store
  int64_t live = 0;             // index entries in this segment
  // Records whose write completed (the footer's entries); cleared at seal.
  std::vector<RecordInfo> written;
  // Segment id -> how many of its records one of ours hides (a newer record
  // or a tombstone of the same key). While such a segment exists this one
  // must too, or a restart would bring the hidden records back.
  absl::flat_hash_map<uint64_t, int> hides;
  absl::flat_hash_set<uint64_t> hidden_by;  // the reverse relation
};

namespace disk_io {

// "<what> <path>: <strerror(errno)>".
std::string Errno(absl::string_view what, const std::string& path);
// UNAVAILABLE, or RESOURCE_EXHAUSTED when the disk is full.
absl::Status IoError(absl::string_view what, const std::string& path);
// pwrite of all `size` bytes; a short write is an error (ENOSPC when the
// kernel gave no reason: that is what a short regular-file write means).
bool WriteAll(FileIo* io, int fd, const uint8_t* data, size_t size, uint64_t offset);
// pread of all `size` bytes; a file that ends before them is EIO.
bool ReadAll(FileIo* io, int fd, uint8_t* data, size_t size, uint64_t offset);

}  // namespace disk_io
}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_DISK_STORE_INTERNAL_H_
