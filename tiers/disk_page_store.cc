#include "tiers/disk_page_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tiers/segment_reader.h"
#include "wire/crc32c.h"

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

namespace {

// The block an O_DIRECT write of 512 bytes at offset 512 in `dir` shows
// the device takes: 512, else kDiskAlign. Plain system calls, not the
// store's FileIo, whose test doubles count and fail the store's own I/O.
uint32_t ProbeBlock(const std::string& dir) {
  const std::string path = dir + "/.block-probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return kMinBlock;  // no O_DIRECT here: the store falls back to buffered I/O
  AlignedBuffer buf(kMinBlock, 0, kMinBlock);
  const bool small = buf.data() != nullptr && ::pwrite(fd, buf.data(), kMinBlock, kMinBlock) == kMinBlock;
  ::close(fd);
  ::unlink(path.c_str());
  return small ? kMinBlock : kDiskAlign;
}

std::string Errno(absl::string_view what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

// UNAVAILABLE, or RESOURCE_EXHAUSTED when the disk is full.
absl::Status IoError(absl::string_view what, const std::string& path) {
  const bool full = errno == ENOSPC || errno == EDQUOT;
  std::string message = Errno(what, path);
  return full ? absl::ResourceExhaustedError(absl::StrCat("disk full: ", message)) : absl::UnavailableError(message);
}

// pwrite of all `size` bytes; a short write is an error (ENOSPC when the
// kernel gave no reason: that is what a short regular-file write means).
bool WriteAll(FileIo* io, int fd, const uint8_t* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = io->Pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

// Checks the record at `rec` against what the index says `key` holds:
// header, key, sequence, size, page CRC-32C. Why not, when it fails.
absl::Status CheckRecord(const uint8_t* rec, uint64_t key, const RecordInfo& want) {
  RecordInfo got;
  if (absl::Status st = ParseRecordHeader(rec, &got); !st.ok()) return st;
  if (got.key != key || got.seq != want.seq || got.type != RecordType::kPage ||
      got.payload_bytes != want.payload_bytes || got.payload_crc != want.payload_crc) {
    return absl::DataLossError(absl::StrCat("header of key ", got.key, " sequence ", got.seq, " where key ", key,
                                            " sequence ", want.seq, " was written"));
  }
  if (Crc32cExtend(0, rec + kRecordHeaderBytes, want.payload_bytes) != want.payload_crc) {
    return absl::DataLossError("page checksum mismatch");
  }
  return absl::OkStatus();
}

bool ReadAll(FileIo* io, int fd, uint8_t* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = io->Pread(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // the file ends before the record
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace

DiskPageStore::DiskPageStore(const DiskPageStoreOptions& options)
    : options_(options), io_(options.io != nullptr ? options.io : FileIo::Posix()) {}

absl::StatusOr<std::unique_ptr<DiskPageStore>> DiskPageStore::Open(const DiskPageStoreOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("dir is empty");
  if (options.page_bytes == 0 || options.page_bytes > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_bytes ", options.page_bytes, " is not in (0, ", kMaxPayloadBytes, "]"));
  }
  const uint64_t smallest = RecordBytes(options.page_bytes) + FooterBytes(1);
  if (options.segment_bytes < smallest || options.segment_bytes > kMaxSegmentBytes) {
    return absl::InvalidArgumentError(absl::StrCat("segment_bytes ", options.segment_bytes, " is not in [", smallest,
                                                   " (one page and a footer), ", kMaxSegmentBytes, "]"));
  }
  if (options.block_bytes != 0 && !ValidBlock(options.block_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_bytes ", options.block_bytes, " is not 0 or a power of two in [512, 4096]"));
  }
  if (options.budget_bytes < RecordBytes(options.page_bytes) + kFooterEntryBytes + 2 * kDiskAlign) {
    return absl::InvalidArgumentError(
        absl::StrCat("budget_bytes ", options.budget_bytes, " holds no page of ", options.page_bytes, " bytes"));
  }
  if (options.read_threads < 1 || options.write_threads < 1 || options.queue_capacity < 1) {
    return absl::InvalidArgumentError(absl::StrCat("read_threads ", options.read_threads, ", write_threads ",
                                                   options.write_threads, " and queue_capacity ",
                                                   options.queue_capacity, " must be at least 1"));
  }
  std::unique_ptr<DiskPageStore> store(new DiskPageStore(options));
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&store->mu_);
    store->direct_ = options.direct_io;
  }
  if (mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(Errno("cannot create the disk level's directory", options.dir));
  }
  store->block_ = options.block_bytes != 0 ? options.block_bytes
                  : options.direct_io      ? ProbeBlock(options.dir)
                                           : kMinBlock;
  store->record_bytes_ = RecordBytes(options.page_bytes, store->block_);
  {
    absl::MutexLock lock(&store->mu_);
    store->stats_.block_bytes = store->block_;
  }
  if (absl::Status st = store->Restore(); !st.ok()) return st;
  {
    absl::MutexLock lock(&store->mu_);
    store->stats_.open_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  }
  store->queue_ = std::make_unique<IoQueue>(options.read_threads, options.queue_capacity);
  DiskPageStore* raw = store.get();
  for (int i = 0; i < options.write_threads; ++i) store->writers_.emplace_back([raw] { raw->WriterLoop(); });
  return store;
}

DiskPageStore::~DiskPageStore() {
  queue_.reset();  // runs the queued reads
  {
    absl::MutexLock lock(&mu_);
    stop_writers_ = true;  // they write what is pending first
  }
  for (std::thread& t : writers_) t.join();
  std::vector<uint64_t> to_seal;
  {
    absl::MutexLock lock(&mu_);
    if (active_ != 0) to_seal.push_back(active_);
    active_ = 0;
  }
  SealAll(to_seal);
}

// ---- restore ----

absl::Status DiskPageStore::Restore() {
  std::vector<uint64_t> ids;
  DIR* d = opendir(options_.dir.c_str());
  if (d == nullptr) return absl::UnavailableError(Errno("cannot list", options_.dir));
  while (struct dirent* e = readdir(d)) {
    uint64_t id = 0;
    if (ParseSegmentFileName(e->d_name, &id)) ids.push_back(id);
  }
  closedir(d);
  std::sort(ids.begin(), ids.end());
  absl::MutexLock lock(&mu_);
  if (options_.wipe_at_open) {
    for (uint64_t id : ids) {
      const std::string path = absl::StrCat(options_.dir, "/", SegmentFileName(id));
      if (io_->Unlink(path.c_str()) != 0) return absl::UnavailableError(Errno("cannot remove", path));
    }
    if (!ids.empty()) next_segment_ = ids.back() + 1;
    return absl::OkStatus();
  }
  // (sequence, segment, record) of every segment, replayed in sequence order.
  struct Entry {
    uint64_t segment;
    RecordInfo record;
  };
  std::vector<Entry> entries;
  for (uint64_t id : ids) {
    next_segment_ = id + 1;
    auto file = std::make_shared<SegmentFile>();
    file->io = io_;
    file->path = absl::StrCat(options_.dir, "/", SegmentFileName(id));
    file->fd = io_->Open(file->path.c_str(), O_RDWR, 0);
    if (file->fd < 0) return absl::UnavailableError(Errno("cannot open", file->path));
    struct stat st;
    if (fstat(file->fd, &st) != 0) return absl::UnavailableError(Errno("cannot stat", file->path));
    const int fd = file->fd;
    FileIo* io = io_;
    absl::StatusOr<SegmentIndex> index =
        ReadSegmentIndex(static_cast<uint64_t>(st.st_size), [io, fd](uint64_t at, size_t size, uint8_t* dst) {
          return ReadAll(io, fd, dst, size, at) ? absl::OkStatus() : absl::DataLossError("short read");
        });
    if (!index.ok())
      return absl::Status(index.status().code(), absl::StrCat(file->path, ": ", index.status().message()));
    stats_.open_bytes_read += index->bytes_read;
    stats_.open_skipped_blocks += index->skipped_blocks;
    stats_.open_corrupt_records += index->corrupt_records;
    if (index->records.empty()) {  // nothing to keep: an empty or wholly torn segment
      if (io_->Unlink(file->path.c_str()) != 0) return absl::UnavailableError(Errno("cannot remove", file->path));
      continue;
    }
    if (!index->sealed) {
      // Drop the torn tail and seal what verified.
      ++stats_.open_segments_scanned;
      const std::vector<uint8_t> footer = EncodeFooter(index->records, index->records_end, index->block);
      AlignedBuffer buf(footer.size(), 0, index->block);
      if (buf.data() == nullptr) return absl::ResourceExhaustedError("cannot allocate a footer");
      std::memcpy(buf.data(), footer.data(), footer.size());
      if (io_->Ftruncate(fd, static_cast<off_t>(index->records_end)) != 0 ||
          !WriteAll(io_, fd, buf.data(), footer.size(), index->records_end) || io_->Fdatasync(fd) != 0) {
        return IoError("cannot seal", file->path);
      }
    } else {
      ++stats_.open_segments_footer;
    }
    if (direct_) {
      // Reads of pages bypass the page cache from now on.
      const int direct_fd = io_->Open(file->path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
      if (direct_fd >= 0) {
        io_->Close(file->fd);
        file->fd = direct_fd;
      }
    }
    auto seg = std::make_unique<Segment>();
    seg->file = file;
    seg->end = index->records_end;
    seg->block = index->block;
    seg->charged = index->records_end + FooterBytes(index->records.size(), seg->block);
    seg->sealed = true;
    used_ += seg->charged;
    segments_[id] = std::move(seg);
    for (const RecordInfo& r : index->records) {
      entries.push_back({id, r});
      next_seq_ = std::max(next_seq_, r.seq + 1);
    }
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.record.seq < b.record.seq; });
  // No segment is deleted before every record has been applied: one that
  // looks dead half-way may hold a later record still.
  restoring_ = true;
  for (const Entry& e : entries) Apply(e.segment, e.record);
  restoring_ = false;
  std::vector<uint64_t> all;
  for (const auto& [id, seg] : segments_) all.push_back(id);
  for (uint64_t id : all) MaybeDelete(id);
  return absl::OkStatus();
}

void DiskPageStore::Apply(uint64_t id, const RecordInfo& r) {
  Segment& seg = *segments_.at(id);
  auto it = index_.find(r.key);
  if (it != index_.end()) {
    Location& old = it->second;
    if (old.record.seq > r.seq) {
      // A newer write of the key finished first: this record is born dead,
      // hidden by the newer one.
      if (old.segment != id) {
        auto other = segments_.find(old.segment);
        if (++other->second->hides[id] == 1) seg.hidden_by.insert(old.segment);
      }
      return;
    }
    if (old.segment != id) {
      if (++seg.hides[old.segment] == 1) segments_.at(old.segment)->hidden_by.insert(id);
    }
    --segments_.at(old.segment)->live;
    const uint64_t old_segment = old.segment;
    index_.erase(it);
    if (old_segment != id) MaybeDelete(old_segment);
  } else if (r.type == RecordType::kTombstone) {
    return;
  }
  if (r.type == RecordType::kPage) {
    index_[r.key] = Location{id, r};
    ++seg.live;
  }
}

// ---- segments ----

absl::StatusOr<std::shared_ptr<DiskPageStore::SegmentFile>> DiskPageStore::CreateSegmentFile(uint64_t id) {
  auto file = std::make_shared<SegmentFile>();
  file->io = io_;
  file->path = absl::StrCat(options_.dir, "/", SegmentFileName(id));
  const int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (direct_) {
      file->fd = io_->Open(file->path.c_str(), flags | O_DIRECT, 0644);
      if (file->fd < 0 && errno == EINVAL) direct_ = false;  // the file system refuses O_DIRECT
    }
    if (file->fd < 0 && !direct_) file->fd = io_->Open(file->path.c_str(), flags, 0644);
    if (file->fd >= 0 || errno != ENOENT) break;
    // The directory is gone: make it again, once.
    if (mkdir(options_.dir.c_str(), 0755) != 0 && errno != EEXIST) break;
  }
  if (file->fd < 0) return IoError("cannot create segment", file->path);
  // No more than the budget has left: a small budget does not reserve a
  // whole segment of disk (writes past the reservation extend the file).
  const uint64_t left = options_.budget_bytes > used_ ? options_.budget_bytes - used_ : 0;
  const uint64_t reserve = RoundUpToBlock(std::min(options_.segment_bytes, std::max(left, record_bytes_)));
  if (options_.preallocate && io_->Fallocate(file->fd, static_cast<off_t>(reserve)) != 0 && errno != EOPNOTSUPP) {
    absl::Status st = IoError("cannot preallocate", file->path);
    io_->Unlink(file->path.c_str());
    return st;
  }
  stats_.direct_io = direct_;
  if (options_.durability == Durability::kPowerLoss) SyncDir();
  return file;
}

void DiskPageStore::SyncDir() {
  const int fd = open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

absl::StatusOr<DiskPageStore::Allocation> DiskPageStore::Allocate(const RecordInfo& record,
                                                                  std::vector<uint64_t>* to_seal) {
  const uint64_t bytes = RecordBytes(record.payload_bytes, block_);
  Segment* seg = active_ != 0 ? segments_.at(active_).get() : nullptr;
  // The footer must fit too: one entry per record written here so far.
  if (seg != nullptr &&
      seg->end + bytes + FooterBytes(seg->written.size() + seg->inflight + 1, block_) > options_.segment_bytes) {
    if (seg->inflight == 0) to_seal->push_back(active_);
    active_ = 0;
    seg = nullptr;
  }
  if (seg == nullptr) {
    const uint64_t id = next_segment_;
    absl::StatusOr<std::shared_ptr<SegmentFile>> file = CreateSegmentFile(id);
    if (!file.ok()) return file.status();
    ++next_segment_;
    auto fresh = std::make_unique<Segment>();
    fresh->file = *std::move(file);
    fresh->block = block_;
    fresh->charged = SegmentOverhead();
    used_ += SegmentOverhead();
    seg = fresh.get();
    segments_[id] = std::move(fresh);
    active_ = id;
  }
  Allocation a;
  a.file = seg->file;
  a.segment = active_;
  a.record = record;
  a.record.offset = seg->end;
  a.record.block = block_;
  a.record.seq = next_seq_++;
  seg->end += bytes;
  ++seg->inflight;
  return a;
}

void DiskPageStore::SealAll(const std::vector<uint64_t>& ids) {
  for (uint64_t id : ids) Seal(id);
}

void DiskPageStore::Seal(uint64_t id) {
  std::shared_ptr<SegmentFile> file;
  std::vector<RecordInfo> records;
  uint64_t end = 0;
  uint32_t block = kDiskAlign;
  {
    absl::MutexLock lock(&mu_);
    auto it = segments_.find(id);
    if (it == segments_.end() || it->second->sealed) return;
    Segment& seg = *it->second;
    seg.sealed = true;
    file = seg.file;
    records = std::move(seg.written);
    seg.written.clear();
    end = seg.end;
    block = seg.block;
  }
  std::sort(records.begin(), records.end(), [](const RecordInfo& a, const RecordInfo& b) { return a.seq < b.seq; });
  const std::vector<uint8_t> footer = EncodeFooter(records, end, block);
  AlignedBuffer buf(footer.size(), 0, block);
  bool ok = buf.data() != nullptr;
  if (ok) {
    std::memcpy(buf.data(), footer.data(), footer.size());
    // A write that failed past the last good one may have left bytes beyond
    // `end`: the footer must end the file.
    ok = WriteAll(io_, file->fd, buf.data(), footer.size(), end) &&
         io_->Ftruncate(file->fd, static_cast<off_t>(end + footer.size())) == 0 && io_->Fdatasync(file->fd) == 0;
  }
  absl::MutexLock lock(&mu_);
  auto it = segments_.find(id);
  if (it == segments_.end()) return;
  Segment& seg = *it->second;
  if (!ok) {
    // An unsealed segment is scanned at the next Open; nothing is lost.
    ++stats_.write_failures;
  }
  used_ -= seg.charged;
  seg.charged = end + FooterBytes(records.size(), block);
  used_ += seg.charged;
  MaybeDelete(id);
}

bool DiskPageStore::Deletable(const Segment& s) const {
  if (s.live != 0 || s.inflight != 0 || !s.sealed) return false;
  for (const auto& [other, count] : s.hides) {
    if (segments_.contains(other)) return false;
  }
  return true;
}

void DiskPageStore::MaybeDelete(uint64_t first) {
  std::vector<uint64_t> work = {first};
  bool deleted = false;
  while (!work.empty()) {
    const uint64_t id = work.back();
    work.pop_back();
    auto it = segments_.find(id);
    if (restoring_ || it == segments_.end() || id == active_ || !Deletable(*it->second)) continue;
    std::unique_ptr<Segment> seg = std::move(it->second);
    segments_.erase(it);
    // A failed unlink leaves a file whose records are all dead or hidden:
    // the next Open finds the same and deletes it then.
    io_->Unlink(seg->file->path.c_str());
    used_ -= seg->charged;
    ++stats_.segments_deleted;
    deleted = true;
    for (uint64_t other : seg->hidden_by) work.push_back(other);
  }
  if (deleted && options_.durability == Durability::kPowerLoss) SyncDir();
}

void DiskPageStore::LoseSegment(uint64_t id) {
  auto it = segments_.find(id);
  if (it == segments_.end()) return;
  Segment& seg = *it->second;
  if (!seg.lost) {
    seg.lost = true;
    ++stats_.lost_segments;
    for (auto e = index_.begin(); e != index_.end();) {
      if (e->second.segment == id) {
        ++stats_.lost_pages;
        index_.erase(e++);
      } else {
        ++e;
      }
    }
    seg.live = 0;
    seg.sealed = true;  // nothing to seal: the file is gone
    if (active_ == id) active_ = 0;
  }
  // Writes in flight finish into the unlinked file, report the loss and
  // call this again; the last one forgets the segment.
  if (seg.inflight > 0) return;
  used_ -= seg.charged;
  std::vector<uint64_t> hidden_by(seg.hidden_by.begin(), seg.hidden_by.end());
  segments_.erase(it);
  for (uint64_t other : hidden_by) MaybeDelete(other);
}

void DiskPageStore::CheckFiles() {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> lost;
  for (const auto& [id, seg] : segments_) {
    struct stat st;
    if (fstat(seg->file->fd, &st) != 0 || st.st_nlink == 0) lost.push_back(id);
  }
  for (uint64_t id : lost) LoseSegment(id);
}

// ---- writes ----

absl::Status DiskPageStore::PutAsync(uint64_t key, const uint8_t* bytes, uint32_t crc32c, Callback done) {
  const uint64_t charge = record_bytes_ + kFooterEntryBytes;
  {
    absl::MutexLock lock(&mu_);
    // A new segment may be needed for it: its overhead counts too.
    if (used_ + reserved_ + charge + SegmentOverhead() > options_.budget_bytes) {
      ++stats_.budget_refusals;
      return absl::ResourceExhaustedError(absl::StrCat("disk level budget of ", options_.budget_bytes,
                                                       " bytes reached (", used_ + reserved_, " used); page of key ",
                                                       key, " not stored"));
    }
  }
  PendingWrite w;
  // The header is written in full when the record is allocated, the page
  // just below: only the padding needs zeros.
  w.buffer = std::make_shared<AlignedBuffer>(record_bytes_, kRecordHeaderBytes + options_.page_bytes, block_);
  if (w.buffer->data() == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate a buffer of ", record_bytes_, " bytes"));
  }
  std::memcpy(w.buffer->data() + kRecordHeaderBytes, bytes, options_.page_bytes);
  w.record.type = RecordType::kPage;
  w.record.key = key;
  w.record.payload_bytes = static_cast<uint32_t>(options_.page_bytes);
  w.record.payload_crc = crc32c;
  w.charge = charge;
  w.done = std::move(done);
  return Accept(std::move(w));
}

absl::Status DiskPageStore::Accept(PendingWrite w) {
  absl::MutexLock lock(&mu_);
  auto room = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_writers_ || accepted_ < options_.queue_capacity; };
  mu_.AwaitWithTimeout(absl::Condition(&room), options_.submit_wait);
  if (stop_writers_) return absl::FailedPreconditionError("the disk level is closing");
  if (accepted_ >= options_.queue_capacity) {
    ++stats_.queue_refusals;
    return absl::UnavailableError(absl::StrCat("write queue full: ", options_.queue_capacity,
                                               " pages waiting for the disk after ",
                                               absl::FormatDuration(options_.submit_wait)));
  }
  ++accepted_;
  reserved_ += w.charge;
  pending_.push_back(std::move(w));
  return absl::OkStatus();
}

void DiskPageStore::WriterLoop() {
  for (;;) {
    std::vector<PendingWrite> batch;
    std::vector<uint64_t> to_seal;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_writers_ || !pending_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // closing, nothing left
      uint64_t bytes = 0;
      while (!pending_.empty() &&
             (batch.empty() || bytes + pending_.front().buffer->size() <= options_.max_write_bytes)) {
        bytes += pending_.front().buffer->size();
        batch.push_back(std::move(pending_.front()));
        pending_.pop_front();
      }
      // Sequence numbers in the order the records were accepted, whichever
      // writer takes them: the later of two operations on one key wins,
      // now and when a restart replays them.
      for (PendingWrite& w : batch) {
        reserved_ -= w.charge;
        absl::StatusOr<Allocation> got = Allocate(w.record, &to_seal);
        if (!got.ok()) {
          w.status = got.status();
          continue;
        }
        w.alloc = *std::move(got);
        segments_.at(w.alloc.segment)->charged += w.charge;
        used_ += w.charge;
      }
      PadToAlign(&batch);
    }
    WriteBatch(std::move(batch), to_seal);
  }
}

// ALIGNED WRITES. With blocks smaller than the file system's (4096 on
// ext4), a direct write that is not aligned to the file system's block,
// in its offset or in any of its buffers' addresses and lengths, makes
// ext4 serialise it behind every direct write in flight and zero the rest
// of the block: on this project's VM, dd of 74,752-byte direct writes ran
// at 87 MB/s against 863 MB/s for 77,824-byte ones. So each batch ends at
// a kDiskAlign boundary (the active segment's end is rounded up after the
// batch's records, the gap charged to the budget like them; the next
// batch starts aligned), and a run of records is copied into one aligned
// staging buffer, zeros after it, and written with one pwrite. Inside a
// batch the records stay dense: at most one block of padding a batch.
void DiskPageStore::PadToAlign(std::vector<PendingWrite>* batch) {
  if (block_ >= kDiskAlign || active_ == 0) return;
  for (auto w = batch->rbegin(); w != batch->rend(); ++w) {
    if (!w->status.ok() || w->alloc.file == nullptr) continue;
    if (w->alloc.segment != active_) return;  // the active segment has no record of this batch
    Segment& seg = *segments_.at(active_);
    const uint64_t end = w->alloc.record.offset + RecordBytes(w->alloc.record.payload_bytes, block_);
    const uint64_t pad = RoundUpToBlock(end, kDiskAlign) - end;
    if (end != seg.end || pad == 0) return;
    if (seg.end + pad + FooterBytes(seg.written.size() + seg.inflight, block_) > options_.segment_bytes) return;
    seg.end += pad;
    seg.charged += pad;
    used_ += pad;
    w->alloc.pad_after = pad;
    return;
  }
}

void DiskPageStore::WriteBatch(std::vector<PendingWrite> batch, const std::vector<uint64_t>& to_seal) {
  SealAll(to_seal);
  const size_t n = batch.size();
  std::vector<absl::Status> status(n);
  std::vector<Allocation> alloc(n);
  std::vector<bool> crc_bad(n, false);
  for (size_t i = 0; i < n; ++i) {
    status[i] = std::move(batch[i].status);
    alloc[i] = std::move(batch[i].alloc);
    const RecordInfo& r = batch[i].record;
    if (status[i].ok() && r.type == RecordType::kPage &&
        Crc32cExtend(0, batch[i].buffer->data() + kRecordHeaderBytes, r.payload_bytes) != r.payload_crc) {
      // Its space stays a hole, which no footer lists.
      crc_bad[i] = true;
      status[i] = absl::DataLossError(
          absl::StrCat("page of key ", r.key, " does not match the CRC-32C given with it; not stored"));
    }
    if (status[i].ok()) EncodeRecordHeader(alloc[i].record, batch[i].buffer->data());
  }
  // Each run [begin, end) of adjacent records of one segment: one pwritev.
  uint64_t write_calls = 0;
  for (size_t begin = 0; begin < n;) {
    if (!status[begin].ok()) {
      ++begin;
      continue;
    }
    size_t end = begin + 1;
    uint64_t next = alloc[begin].record.offset + batch[begin].buffer->size();
    while (end < n && status[end].ok() && alloc[end].segment == alloc[begin].segment &&
           alloc[end].record.offset == next && end - begin < IOV_MAX - 1) {
      next += batch[end].buffer->size();
      ++end;
    }
    std::vector<struct iovec> iov(end - begin);
    for (size_t i = begin; i < end; ++i) iov[i - begin] = {batch[i].buffer->data(), batch[i].buffer->size()};
    next += alloc[end - 1].pad_after;
    const SegmentFile& file = *alloc[begin].file;
    const uint64_t bytes = next - alloc[begin].record.offset;
    absl::Status st;
    ssize_t wrote;
    if (block_ < kDiskAlign) {
      thread_local std::unique_ptr<AlignedBuffer> staging;
      if (staging == nullptr || staging->size() < bytes) staging = std::make_unique<AlignedBuffer>(bytes);
      uint8_t* at = staging->data();
      for (const struct iovec& v : iov) {
        std::memcpy(at, v.iov_base, v.iov_len);
        at += v.iov_len;
      }
      std::memset(at, 0, alloc[end - 1].pad_after);
      wrote = io_->Pwrite(file.fd, staging->data(), bytes, static_cast<off_t>(alloc[begin].record.offset));
    } else {
      wrote = io_->Pwritev(file.fd, iov.data(), static_cast<int>(iov.size()),
                           static_cast<off_t>(alloc[begin].record.offset));
    }
    if (wrote != static_cast<ssize_t>(bytes)) {
      if (wrote >= 0) errno = ENOSPC;  // a short write to a regular file
      st = IoError("cannot write", file.path);
    } else if (options_.durability == Durability::kPowerLoss && io_->Fdatasync(file.fd) != 0) {
      st = IoError("cannot sync", file.path);
    } else {
      struct stat s;
      if (fstat(file.fd, &s) != 0 || s.st_nlink == 0) {
        st = absl::UnavailableError(
            absl::StrCat("segment ", file.path, " was removed while being written (the directory deleted?)"));
      }
    }
    for (size_t i = begin; i < end; ++i) status[i] = st;
    begin = end;
    ++write_calls;
  }
  std::vector<uint64_t> seal;
  {
    absl::MutexLock lock(&mu_);
    stats_.write_calls += write_calls;
    accepted_ -= static_cast<int>(n);
    callbacks_ += static_cast<int>(n);  // until they have run: Flush waits for them
    for (size_t i = 0; i < n; ++i) {
      if (alloc[i].file == nullptr) {  // never allocated
        ++stats_.write_failures;
        continue;
      }
      const uint64_t id = alloc[i].segment;
      auto it = segments_.find(id);
      Segment& seg = *it->second;
      --seg.inflight;
      if (status[i].ok() && seg.lost) {
        status[i] = absl::UnavailableError(absl::StrCat("segment ", alloc[i].file->path, " was removed"));
      }
      if (status[i].ok()) {
        seg.written.push_back(alloc[i].record);
        Apply(id, alloc[i].record);
        ++(alloc[i].record.type == RecordType::kPage ? stats_.puts : stats_.erases);
      } else if (crc_bad[i]) {
        ++stats_.put_crc_mismatches;
      } else {
        ++stats_.write_failures;
        struct stat s;
        if (seg.lost || (fstat(alloc[i].file->fd, &s) == 0 && s.st_nlink == 0)) LoseSegment(id);
      }
      it = segments_.find(id);
      if (it != segments_.end() && it->second->inflight == 0 && id != active_ && !it->second->sealed &&
          std::find(seal.begin(), seal.end(), id) == seal.end()) {
        seal.push_back(id);
      }
    }
  }
  SealAll(seal);
  for (size_t i = 0; i < n; ++i) {
    if (batch[i].done) batch[i].done(status[i]);
  }
  absl::MutexLock lock(&mu_);
  callbacks_ -= static_cast<int>(n);
}

absl::Status DiskPageStore::Put(uint64_t key, const uint8_t* bytes, uint32_t crc32c) {
  absl::Notification done;
  absl::Status result;
  absl::Status queued = PutAsync(key, bytes, crc32c, [&](absl::Status st) {
    result = std::move(st);
    done.Notify();
  });
  if (!queued.ok()) return queued;
  done.WaitForNotification();
  return result;
}

absl::Status DiskPageStore::Erase(uint64_t key) {
  {
    absl::MutexLock lock(&mu_);
    if (!index_.contains(key)) return absl::NotFoundError(absl::StrCat("key ", key, " is not on disk"));
  }
  // The key stays readable until its tombstone is written; Apply of the
  // tombstone then drops it and makes its segment hide the page's. A
  // tombstone is charged but never refused for the budget: Erase is how a
  // full disk level makes room.
  absl::Notification done;
  absl::Status result;
  PendingWrite w;
  w.buffer = std::make_shared<AlignedBuffer>(block_, 0, block_);
  w.record.type = RecordType::kTombstone;
  w.record.key = key;
  w.charge = block_ + kFooterEntryBytes;
  w.done = [&](absl::Status st) {
    result = std::move(st);
    done.Notify();
  };
  absl::Status queued =
      w.buffer->data() == nullptr ? absl::ResourceExhaustedError("cannot allocate a tombstone") : Accept(std::move(w));
  if (queued.ok()) {
    done.WaitForNotification();
    if (result.ok()) return absl::OkStatus();
  }
  const absl::Status& why = queued.ok() ? result : queued;
  absl::MutexLock lock(&mu_);
  // Forget it all the same: a full disk must still let pages go.
  auto it = index_.find(key);
  if (it != index_.end()) {
    const uint64_t id = it->second.segment;
    index_.erase(it);
    --segments_.at(id)->live;
    MaybeDelete(id);
  }
  return absl::Status(why.code(), absl::StrCat("key ", key,
                                               " erased, but its tombstone was not written (it may "
                                               "come back after a restart): ",
                                               why.message()));
}

// ---- reads ----

absl::Status DiskPageStore::GetAsync(uint64_t key, uint8_t* dst, Callback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!index_.contains(key)) return absl::NotFoundError(absl::StrCat("key ", key, " is not on disk"));
  }
  absl::Status queued =
      queue_->Submit([this, key, dst, done = std::move(done)] { done(ReadRecord(key, dst)); }, options_.submit_wait);
  if (!queued.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.queue_refusals;
  }
  return queued;
}

absl::Status DiskPageStore::ReadRecord(uint64_t key, uint8_t* dst) {
  std::shared_ptr<SegmentFile> file;
  RecordInfo want;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return absl::NotFoundError(absl::StrCat("key ", key, " is not on disk"));
    file = segments_.at(it->second.segment)->file;
    want = it->second.record;
  }
  const uint64_t size = RecordBytes(want.payload_bytes, want.block);
  AlignedBuffer buf(size, size, want.block);  // pread fills it
  if (buf.data() == nullptr) return absl::ResourceExhaustedError("cannot allocate a read buffer");
  if (!ReadAll(io_, file->fd, buf.data(), buf.size(), want.offset)) return IoError("cannot read", file->path);
  absl::Status st = CheckRecord(buf.data(), key, want);
  if (st.ok()) std::memcpy(dst, buf.data() + kRecordHeaderBytes, want.payload_bytes);
  absl::MutexLock lock(&mu_);
  if (!st.ok()) {
    ++stats_.checksum_failures;
    return absl::DataLossError(absl::StrCat("disk page of key ", key, " in ", file->path, " at offset ", want.offset,
                                            ": ", st.message(), "; not served"));
  }
  ++stats_.gets;
  return absl::OkStatus();
}

absl::Status DiskPageStore::Get(uint64_t key, uint8_t* dst) {
  absl::Notification done;
  absl::Status result;
  absl::Status queued = GetAsync(key, dst, [&](absl::Status st) {
    result = std::move(st);
    done.Notify();
  });
  if (!queued.ok()) return queued;
  done.WaitForNotification();
  return result;
}

// ---- queries ----

bool DiskPageStore::Contains(uint64_t key) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(key);
}

std::vector<uint64_t> DiskPageStore::Keys() const {
  absl::MutexLock lock(&mu_);
  std::vector<uint64_t> keys;
  keys.reserve(index_.size());
  for (const auto& [key, where] : index_) keys.push_back(key);
  return keys;
}

void DiskPageStore::Flush() {
  {
    absl::MutexLock lock(&mu_);
    auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return accepted_ == 0 && callbacks_ == 0; };
    mu_.Await(absl::Condition(&written));
  }
  queue_->Drain();
}

uint64_t DiskPageStore::bytes_used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

DiskPageStoreStats DiskPageStore::stats() const {
  absl::MutexLock lock(&mu_);
  DiskPageStoreStats s = stats_;
  s.pages = index_.size();
  s.bytes_used = used_;
  s.segments = segments_.size();
  s.direct_io = direct_;
  return s;
}

}  // namespace tiers
}  // namespace driftkv
