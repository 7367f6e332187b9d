// libFuzzer: the disk level's segment reader (tiers/segment_reader.h) over
// any bytes as a segment file: a footer or a scan, never a read outside the
// file, never an allocation beyond the footer's own bound. Traps when an
// index breaks its promise: sequence strictly increasing, records aligned,
// inside [0, records_end) and not overlapping, a scanned record whose
// header or payload does not verify, a footer whose entries do not survive
// a round trip through EncodeFooter.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tiers/disk_format.h"
#include "tiers/segment_reader.h"
#include "wire/crc32c.h"

using namespace driftkv;
using namespace driftkv::tiers;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= kRecordHeaderBytes) {
    RecordInfo r;
    if (ParseRecordHeader(data, &r).ok()) {
      uint8_t again[kRecordHeaderBytes];
      EncodeRecordHeader(r, again);
      RecordInfo back;
      Check(ParseRecordHeader(again, &back).ok() && back.key == r.key && back.seq == r.seq &&
            back.payload_bytes == r.payload_bytes && back.payload_crc == r.payload_crc && back.type == r.type);
    }
  }
  absl::StatusOr<SegmentIndex> index = ReadSegmentIndex(size, [&](uint64_t at, size_t n, uint8_t* dst) {
    Check(n > 0 && at <= size && n <= size - at);  // never past the end
    std::memcpy(dst, data + at, n);
    return absl::OkStatus();
  });
  Check(index.ok());  // corrupt bytes are an index, never an error
  const std::vector<RecordInfo>& records = index->records;
  Check(index->records_end <= RoundUpToBlock(size, index->block == 0 ? kDiskAlign : index->block));
  for (size_t i = 0; i < records.size(); ++i) {
    const RecordInfo& r = records[i];
    Check(i == 0 || r.seq > records[i - 1].seq);
    Check(r.block == index->block && r.offset % r.block == 0 &&
          r.offset + RecordBytes(r.payload_bytes, r.block) <= index->records_end);
    Check(r.type == RecordType::kPage || r.payload_bytes == 0);
    if (!index->sealed) {
      RecordInfo h;
      Check(ParseRecordHeader(data + r.offset, &h).ok() && h.key == r.key && h.seq == r.seq);
      Check(r.offset + kRecordHeaderBytes + r.payload_bytes <= size);
      Check(Crc32cExtend(0, data + r.offset + kRecordHeaderBytes, r.payload_bytes) == r.payload_crc);
    }
  }
  std::vector<RecordInfo> by_offset = records;
  std::sort(by_offset.begin(), by_offset.end(),
            [](const RecordInfo& a, const RecordInfo& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    Check(by_offset[i - 1].offset + RecordBytes(by_offset[i - 1].payload_bytes, by_offset[i - 1].block) <=
          by_offset[i].offset);
  }
  if (index->sealed) {
    // The entries as the store would write them again read back the same.
    const std::vector<uint8_t> footer = EncodeFooter(records, index->records_end, index->block);
    std::vector<RecordInfo> back;
    const uint32_t crc = Crc32cExtend(0, footer.data(), records.size() * kFooterEntryBytes);
    Check(ParseFooterEntries(footer.data(), records.size(), crc, index->records_end, index->block, &back).ok());
    Check(back.size() == records.size());
    for (size_t i = 0; i < back.size(); ++i) {
      Check(back[i].key == records[i].key && back[i].seq == records[i].seq && back[i].offset == records[i].offset);
    }
  }
  return 0;
}
