#include "tiers/segment_reader.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace tiers {
namespace {

// The footer, or why not.
absl::Status ReadFooter(uint64_t file_size, const ReadAt& read, SegmentIndex* index) {
  if (file_size < kMinBlock) return absl::DataLossError("no footer block");
  uint8_t trailer[kTrailerBytes];
  if (absl::Status st = read(file_size - kTrailerBytes, kTrailerBytes, trailer); !st.ok()) return st;
  index->bytes_read += kTrailerBytes;
  uint64_t count = 0, at = 0, end = 0;
  uint32_t crc = 0, block = 0;
  if (absl::Status st = ParseTrailer(trailer, file_size, &count, &at, &end, &crc, &block); !st.ok()) return st;
  std::vector<uint8_t> entries(count * kFooterEntryBytes);
  if (count > 0) {
    if (absl::Status st = read(at, entries.size(), entries.data()); !st.ok()) return st;
  }
  index->bytes_read += entries.size();
  if (absl::Status st = ParseFooterEntries(entries.data(), count, crc, end, block, &index->records); !st.ok()) {
    return st;
  }
  index->block = block;
  index->records_end = end;
  index->sealed = true;
  return absl::OkStatus();
}

absl::Status Scan(uint64_t file_size, const ReadAt& read, SegmentIndex* index) {
  std::vector<uint8_t> buf;
  uint64_t at = 0;
  while (at + kRecordHeaderBytes <= file_size) {
    uint8_t header[kRecordHeaderBytes];
    if (absl::Status st = read(at, sizeof(header), header); !st.ok()) return st;
    index->bytes_read += sizeof(header);
    RecordInfo r;
    bool kept = false;
    if (ParseRecordHeader(header, &r).ok() && at % r.block == 0 && (index->block == 0 || r.block == index->block) &&
        file_size - at - kRecordHeaderBytes >= r.payload_bytes) {
      buf.resize(r.payload_bytes);
      if (!buf.empty()) {
        if (absl::Status st = read(at + kRecordHeaderBytes, buf.size(), buf.data()); !st.ok()) return st;
      }
      index->bytes_read += buf.size();
      if (Crc32cExtend(0, buf.data(), buf.size()) == r.payload_crc) {
        r.offset = at;
        index->records.push_back(r);
        index->block = r.block;
        at += RecordBytes(r.payload_bytes, r.block);
        index->records_end = std::min<uint64_t>(at, RoundUpToBlock(file_size, r.block));
        kept = true;
      } else {
        ++index->corrupt_records;
      }
    }
    if (!kept) {
      ++index->skipped_blocks;
      at += kMinBlock;
    }
  }
  // Offsets increase with the sequence when the store wrote them; bytes
  // that say otherwise keep the first record of each sequence number.
  std::stable_sort(index->records.begin(), index->records.end(),
                   [](const RecordInfo& a, const RecordInfo& b) { return a.seq < b.seq; });
  index->records.erase(std::unique(index->records.begin(), index->records.end(),
                                   [](const RecordInfo& a, const RecordInfo& b) { return a.seq == b.seq; }),
                       index->records.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SegmentIndex> ReadSegmentIndex(uint64_t file_size, const ReadAt& read) {
  if (file_size > kMaxSegmentBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("segment of ", file_size, " bytes exceeds the format's ", kMaxSegmentBytes));
  }
  SegmentIndex index;
  if (file_size == 0) return index;
  absl::Status footer = ReadFooter(file_size, read, &index);
  if (footer.ok()) return index;
  if (!absl::IsDataLoss(footer)) return footer;
  index.records.clear();
  index.footer_problem = std::string(footer.message());
  if (absl::Status st = Scan(file_size, read, &index); !st.ok()) return st;
  return index;
}

}  // namespace tiers
}  // namespace driftkv
