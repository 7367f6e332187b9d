#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tiers/disk_store_internal.h"

namespace driftkv {
namespace tiers {

using disk_io::IoError;
using disk_io::WriteAll;

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

}  // namespace tiers
}  // namespace driftkv
