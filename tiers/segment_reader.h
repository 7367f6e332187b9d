// Reading one segment file's index at open (tiers/disk_format.h): from its
// footer when it has a valid one (two reads, no page read), else by a scan
// that reads every record and verifies its payload (the segment that was
// being written when the process died). Pure over a read function, so that
// the fuzz target drives it from memory.
#ifndef DRIFTKV_TIERS_SEGMENT_READER_H_
#define DRIFTKV_TIERS_SEGMENT_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tiers/disk_format.h"

namespace driftkv {
namespace tiers {

// Reads exactly `size` bytes (never 0) at `offset` (inside the file) into
// `dst`.
using ReadAt = std::function<absl::Status(uint64_t offset, size_t size, uint8_t* dst)>;

struct SegmentIndex {
  // Every record that verified, sequence strictly increasing, offsets
  // aligned and inside [0, records_end), not overlapping.
  std::vector<RecordInfo> records;
  // From a valid footer; otherwise scanned (and the caller may seal it).
  bool sealed = false;
  // The end of the last record kept: where a footer of a scanned segment
  // goes (the torn tail after it is dropped).
  uint64_t records_end = 0;
  uint64_t bytes_read = 0;
  // The segment's block: the trailer's, or the first record the scan
  // kept (0 when none). A scan keeps only records of that block.
  uint32_t block = 0;
  // 512-byte steps the scan took past bytes without a valid record:
  // a torn tail, a hole left by a write that never happened, a corrupt
  // header or payload.
  uint64_t skipped_blocks = 0;
  // Records whose header verified and whose payload did not.
  uint64_t corrupt_records = 0;
  // Why the footer was not used ("" when sealed or the file is empty).
  std::string footer_problem;
};

// An error only when `read` fails or the file is larger than a segment can
// be; corrupt bytes are what the index reports, never an error.
absl::StatusOr<SegmentIndex> ReadSegmentIndex(uint64_t file_size, const ReadAt& read);

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_SEGMENT_READER_H_
