#include "tiers/disk_format.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace tiers {
namespace {

template <typename T>
void Put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
bool ValidType(uint16_t t) {
  return t == static_cast<uint16_t>(RecordType::kPage) || t == static_cast<uint16_t>(RecordType::kTombstone);
}

}  // namespace

void EncodeRecordHeader(const RecordInfo& r, uint8_t* out) {
  std::memset(out, 0, kRecordHeaderBytes);
  Put<uint32_t>(out, kRecordMagic);
  Put<uint16_t>(out + 4, static_cast<uint16_t>(r.type));
  Put<uint16_t>(out + 6, kFormatVersion);
  Put<uint64_t>(out + 8, r.key);
  Put<uint64_t>(out + 16, r.seq);
  Put<uint32_t>(out + 24, r.payload_bytes);
  Put<uint32_t>(out + 28, r.payload_crc);
  Put<uint32_t>(out + 32, r.block);
  Put<uint32_t>(out + 60, Crc32cExtend(0, out, 60));
}

absl::Status ParseRecordHeader(const uint8_t* in, RecordInfo* r) {
  if (Get<uint32_t>(in) != kRecordMagic) return absl::DataLossError("no record magic");
  if (Get<uint32_t>(in + 60) != Crc32cExtend(0, in, 60)) return absl::DataLossError("record header checksum mismatch");
  const uint16_t type = Get<uint16_t>(in + 4), version = Get<uint16_t>(in + 6);
  if (version != 1 && version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("record format version ", version));
  }
  const uint32_t block = version == 1 ? kDiskAlign : Get<uint32_t>(in + 32);
  if (!ValidBlock(block)) return absl::DataLossError(absl::StrCat("record block of ", block, " bytes"));
  if (!ValidType(type)) return absl::DataLossError(absl::StrCat("record type ", type));
  const uint32_t bytes = Get<uint32_t>(in + 24);
  if (bytes > kMaxPayloadBytes) {
    return absl::DataLossError(absl::StrCat("record payload of ", bytes, " bytes exceeds ", kMaxPayloadBytes));
  }
  if (type == static_cast<uint16_t>(RecordType::kTombstone) && bytes != 0) {
    return absl::DataLossError("tombstone with a payload");
  }
  r->type = static_cast<RecordType>(type);
  r->key = Get<uint64_t>(in + 8);
  r->seq = Get<uint64_t>(in + 16);
  r->payload_bytes = bytes;
  r->payload_crc = Get<uint32_t>(in + 28);
  r->block = block;
  return absl::OkStatus();
}

std::vector<uint8_t> EncodeFooter(const std::vector<RecordInfo>& entries, uint64_t records_end, uint32_t block) {
  std::vector<uint8_t> out(FooterBytes(entries.size(), block), 0);
  uint8_t* p = out.data();
  for (const RecordInfo& r : entries) {
    Put<uint64_t>(p, r.key);
    Put<uint64_t>(p + 8, r.seq);
    Put<uint32_t>(p + 16, static_cast<uint32_t>(r.offset / block));
    Put<uint32_t>(p + 20, r.payload_bytes);
    Put<uint32_t>(p + 24, r.payload_crc);
    Put<uint16_t>(p + 28, static_cast<uint16_t>(r.type));
    p += kFooterEntryBytes;
  }
  uint8_t* t = out.data() + out.size() - kTrailerBytes;
  Put<uint32_t>(t, kTrailerMagic);
  Put<uint32_t>(t + 4, kFormatVersion);
  Put<uint64_t>(t + 8, entries.size());
  Put<uint64_t>(t + 16, records_end);
  Put<uint64_t>(t + 24, records_end);
  Put<uint32_t>(t + 32, Crc32cExtend(0, out.data(), entries.size() * kFooterEntryBytes));
  Put<uint32_t>(t + 36, block);
  Put<uint32_t>(t + 60, Crc32cExtend(0, t, 60));
  return out;
}

absl::Status ParseTrailer(const uint8_t* in, uint64_t file_size, uint64_t* entries, uint64_t* entries_offset,
                          uint64_t* records_end, uint32_t* entries_crc, uint32_t* block) {
  if (Get<uint32_t>(in) != kTrailerMagic) return absl::DataLossError("no footer magic");
  if (Get<uint32_t>(in + 60) != Crc32cExtend(0, in, 60)) return absl::DataLossError("footer trailer checksum mismatch");
  const uint32_t version = Get<uint32_t>(in + 4);
  if (version != 1 && version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("footer format version ", version));
  }
  const uint32_t b = version == 1 ? kDiskAlign : Get<uint32_t>(in + 36);
  if (!ValidBlock(b)) return absl::DataLossError(absl::StrCat("footer block of ", b, " bytes"));
  if (file_size < b || file_size % b != 0) {
    return absl::DataLossError(absl::StrCat("size ", file_size, " is not a whole number of ", b, "-byte blocks"));
  }
  const uint64_t count = Get<uint64_t>(in + 8), at = Get<uint64_t>(in + 16), end = Get<uint64_t>(in + 24);
  // The footer occupies [at, file_size): exactly FooterBytes(count) of them.
  if (count > file_size / kFooterEntryBytes || at > file_size || file_size - at != FooterBytes(count, b) ||
      at % b != 0 || end > at) {
    return absl::DataLossError(
        absl::StrCat("footer of ", count, " entries at ", at, " does not fit a file of ", file_size, " bytes"));
  }
  *entries = count;
  *entries_offset = at;
  *records_end = end;
  *entries_crc = Get<uint32_t>(in + 32);
  *block = b;
  return absl::OkStatus();
}

absl::Status ParseFooterEntries(const uint8_t* in, uint64_t count, uint32_t entries_crc, uint64_t records_end,
                                uint32_t block, std::vector<RecordInfo>* out) {
  if (Crc32cExtend(0, in, count * kFooterEntryBytes) != entries_crc) {
    return absl::DataLossError("footer entries checksum mismatch");
  }
  out->clear();
  out->reserve(count);
  uint64_t next_free = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* p = in + i * kFooterEntryBytes;
    RecordInfo r;
    r.key = Get<uint64_t>(p);
    r.seq = Get<uint64_t>(p + 8);
    r.offset = uint64_t{Get<uint32_t>(p + 16)} * block;
    r.block = block;
    r.payload_bytes = Get<uint32_t>(p + 20);
    r.payload_crc = Get<uint32_t>(p + 24);
    const uint16_t type = Get<uint16_t>(p + 28);
    if (!ValidType(type) || r.payload_bytes > kMaxPayloadBytes ||
        (type == static_cast<uint16_t>(RecordType::kTombstone) && r.payload_bytes != 0)) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, ": bad type ", type, " or size ", r.payload_bytes));
    }
    r.type = static_cast<RecordType>(type);
    if (i > 0 && r.seq <= out->back().seq) {
      return absl::DataLossError(
          absl::StrCat("footer entry ", i, ": sequence ", r.seq, " not after ", out->back().seq));
    }
    // The store hands out offsets and sequence numbers together, so
    // offsets increase with the sequence and records never overlap.
    if (r.offset < next_free || r.offset + RecordBytes(r.payload_bytes, block) > records_end) {
      return absl::DataLossError(absl::StrCat("footer entry ", i, ": record at ", r.offset, " overlaps [0, ", next_free,
                                              ") or ends past ", records_end));
    }
    next_free = r.offset + RecordBytes(r.payload_bytes, block);
    out->push_back(r);
  }
  return absl::OkStatus();
}

std::string SegmentFileName(uint64_t id) {
  char name[32];
  std::snprintf(name, sizeof(name), "seg-%016" PRIx64 ".dks", id);
  return name;
}

bool ParseSegmentFileName(const std::string& name, uint64_t* id) {
  if (name.size() != 24 || name.compare(0, 4, "seg-") != 0 || name.compare(20, 4, ".dks") != 0) return false;
  uint64_t v = 0;
  for (size_t i = 4; i < 20; ++i) {
    const char c = name[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return false;
    }
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *id = v;
  return true;
}

}  // namespace tiers
}  // namespace driftkv
