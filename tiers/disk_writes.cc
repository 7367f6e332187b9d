#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "tiers/disk_store_internal.h"
#include "wire/crc32c.h"
#include "wire/status_handover.h"

namespace driftkv {
namespace tiers {

using disk_io::IoError;

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
    // One Status each, not copies sharing st's: see the hand-over below.
    for (size_t i = begin; i < end; ++i) status[i] = UnsharedStatus(st);
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
  // Each submitter gets its Status moved, the only reference to its error
  // (wire/status_handover.h says why).
  for (size_t i = 0; i < n; ++i) {
    if (batch[i].done) batch[i].done(std::move(status[i]));
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

}  // namespace tiers
}  // namespace driftkv
