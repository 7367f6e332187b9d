#include "tiers/disk_page_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tiers/disk_store_internal.h"
#include "tiers/segment_reader.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace tiers {

using disk_io::Errno;
using disk_io::IoError;
using disk_io::ReadAll;
using disk_io::WriteAll;

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
