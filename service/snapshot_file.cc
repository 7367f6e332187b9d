#include "service/snapshot_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace driftkv {
namespace {

static_assert(sizeof(uint16_t) == 2, "bf16 values are 2 bytes");

void PutU32(std::string* s, uint32_t v) {
  s->append(reinterpret_cast<const char*>(&v), 4);
}
void PutU64(std::string* s, uint64_t v) {
  s->append(reinterpret_cast<const char*>(&v), 8);
}
uint32_t GetU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t CrcOf(const void* data, size_t size, uint32_t crc = 0) {
  return Crc32c(static_cast<const uint8_t*>(data), size, crc);
}
std::string OsError(absl::string_view what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

}  // namespace

std::string SnapshotPath(const std::string& dir) {
  return absl::StrCat(dir, "/", kSnapshotFileName);
}

std::string IdentityDifference(absl::string_view snapshot, absl::string_view server) {
  if (snapshot == server) return "";
  std::vector<absl::string_view> a = absl::StrSplit(snapshot, '\n'), b = absl::StrSplit(server, '\n');
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    absl::string_view x = i < a.size() ? a[i] : "(none)", y = i < b.size() ? b[i] : "(none)";
    if (x == y) continue;
    std::pair<absl::string_view, absl::string_view> kx = absl::StrSplit(x, absl::MaxSplits('=', 1));
    std::pair<absl::string_view, absl::string_view> ky = absl::StrSplit(y, absl::MaxSplits('=', 1));
    if (kx.first == ky.first) return absl::StrCat(kx.first, ": snapshot ", kx.second, ", this server ", ky.second);
    return absl::StrCat("snapshot \"", x, "\", this server \"", y, "\"");
  }
  return "";
}

// ---- writer ----

absl::StatusOr<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Open(const std::string& dir, absl::string_view identity,
                                                                     size_t page_bytes, uint32_t version) {
  if (version < 1 || version > kSnapshotVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("snapshot version ", version, " is not in [1, ", kSnapshotVersion, "]"));
  }
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter());
  w->version_ = version;
  w->dir_ = dir;
  w->path_ = SnapshotPath(dir);
  w->tmp_path_ = w->path_ + ".tmp";
  w->page_bytes_ = page_bytes;
  w->file_ = std::fopen(w->tmp_path_.c_str(), "wb");
  if (w->file_ == nullptr) return absl::UnavailableError(OsError("cannot create", w->tmp_path_));
  std::string header(kSnapshotMagic, sizeof(kSnapshotMagic));
  PutU32(&header, version);
  PutU32(&header, static_cast<uint32_t>(identity.size()));
  header.append(identity.data(), identity.size());
  if (absl::Status st = w->WriteWithCrc(header); !st.ok()) return st;
  return w;
}

SnapshotWriter::~SnapshotWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(tmp_path_.c_str());
}

absl::Status SnapshotWriter::Write(const void* data, size_t size) {
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    return absl::UnavailableError(OsError("cannot write", tmp_path_));
  }
  return absl::OkStatus();
}

absl::Status SnapshotWriter::WriteWithCrc(const std::string& bytes) {
  std::string out = bytes;
  PutU32(&out, CrcOf(bytes.data(), bytes.size()));
  return Write(out.data(), out.size());
}

absl::Status SnapshotWriter::Tombstones(const std::vector<std::pair<std::string, uint64_t>>& entries) {
  if (version_ < kSnapshotFirstDigestVersion || tombstones_written_) return absl::OkStatus();
  tombstones_written_ = true;
  std::string body;
  for (const auto& [key, left_ns] : entries) {
    PutU32(&body, static_cast<uint32_t>(key.size()));
    body.append(key);
    PutU64(&body, left_ns);
  }
  std::string head;
  PutU32(&head, kSnapshotTombstoneTag);
  PutU32(&head, static_cast<uint32_t>(entries.size()));
  PutU32(&head, static_cast<uint32_t>(body.size()));
  if (absl::Status st = WriteWithCrc(head); !st.ok()) return st;
  return WriteWithCrc(body);
}

absl::Status SnapshotWriter::Digests(absl::Span<const uint64_t> digests) {
  if (version_ < kSnapshotFirstDigestVersion) return absl::OkStatus();
  std::string count;
  PutU32(&count, static_cast<uint32_t>(digests.size()));
  if (absl::Status st = WriteWithCrc(count); !st.ok()) return st;
  const uint32_t crc = CrcOf(digests.data(), digests.size() * 8);
  absl::Status st = Write(digests.data(), digests.size() * 8);
  if (st.ok()) st = Write(&crc, 4);
  return st;
}

absl::Status SnapshotWriter::BeginSequence(absl::string_view id, uint32_t layers) {
  if (absl::Status st = Tombstones({}); !st.ok()) return st;
  std::string rec;
  PutU32(&rec, kSnapshotSequenceTag);
  PutU32(&rec, static_cast<uint32_t>(id.size()));
  rec.append(id.data(), id.size());
  PutU32(&rec, layers);
  ++sequences_;
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::BeginLayer(uint64_t length, uint32_t window_tokens, uint32_t pages,
                                        absl::Span<const uint16_t> window_keys,
                                        absl::Span<const uint16_t> window_values) {
  std::string rec;
  PutU64(&rec, length);
  PutU32(&rec, window_tokens);
  PutU32(&rec, pages);
  if (absl::Status st = WriteWithCrc(rec); !st.ok()) return st;
  uint32_t crc = CrcOf(window_keys.data(), window_keys.size() * 2);
  crc = CrcOf(window_values.data(), window_values.size() * 2, crc);
  absl::Status st = Write(window_keys.data(), window_keys.size() * 2);
  if (st.ok()) st = Write(window_values.data(), window_values.size() * 2);
  if (st.ok()) st = Write(&crc, 4);
  return st;
}

absl::Status SnapshotWriter::Page(const uint8_t* bytes, PageChecksum checksum) {
  ++pages_;
  ++full_pages_;
  absl::Status st;
  if (version_ >= kSnapshotFirstSharedVersion) st = Write(&kSnapshotPageTag, 4);
  if (st.ok()) st = Write(&checksum, 4);
  if (st.ok()) st = Write(bytes, page_bytes_);
  return st;
}

absl::Status SnapshotWriter::SharedPage(uint64_t ordinal) {
  if (version_ < kSnapshotFirstSharedVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot version ", version_, " has no shared page entries (version 4 has)"));
  }
  if (ordinal >= full_pages_) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared page ", ordinal, " repeats no full page (", full_pages_, " written)"));
  }
  ++pages_;
  std::string rec;
  PutU32(&rec, kSnapshotSharedPageTag);
  PutU64(&rec, ordinal);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::HostPage(const uint8_t* bytes, PageChecksum checksum) {
  if (version_ < kSnapshotFirstLevelVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot version ", version_, " has no host-level page entries (version 5 has)"));
  }
  ++pages_;
  absl::Status st = Write(&kSnapshotHostPageTag, 4);
  if (st.ok()) st = Write(&checksum, 4);
  if (st.ok()) st = Write(bytes, page_bytes_);
  return st;
}

absl::Status SnapshotWriter::DiskPage(uint64_t key, PageChecksum checksum) {
  if (version_ < kSnapshotFirstLevelVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("snapshot version ", version_, " has no disk-level page entries (version 5 has)"));
  }
  ++pages_;
  std::string rec;
  PutU32(&rec, kSnapshotDiskPageTag);
  PutU64(&rec, key);
  PutU32(&rec, checksum);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::BeginIndex(uint64_t entries) {
  if (version_ < kSnapshotFirstSharedVersion) {
    return absl::FailedPreconditionError(absl::StrCat("snapshot version ", version_, " has no index block"));
  }
  if (index_written_) return absl::FailedPreconditionError("the index block is begun once");
  index_written_ = true;
  std::string rec;
  PutU32(&rec, kSnapshotIndexTag);
  PutU64(&rec, entries);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::IndexEntry(absl::string_view ns, absl::string_view key, uint32_t layer) {
  if (ns.size() != 16 || key.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("an index entry's namespace and key are 16 bytes each, not ", ns.size(), " and ", key.size()));
  }
  std::string rec(ns);
  rec.append(key.data(), key.size());
  PutU32(&rec, layer);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::BeginPins(uint64_t pins) {
  if (!index_written_) {
    if (absl::Status st = BeginIndex(0); !st.ok()) return st;
  }
  if (pins_written_) return absl::FailedPreconditionError("the pins block is begun once");
  pins_written_ = true;
  std::string rec;
  PutU32(&rec, kSnapshotPinsTag);
  PutU64(&rec, pins);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::Pin(absl::string_view key, absl::string_view pin_id, uint64_t nanoseconds_left,
                                 uint32_t pages) {
  if (key.size() > kSnapshotMaxIdBytes || pin_id.size() > kSnapshotMaxIdBytes || pages > kSnapshotMaxPinPages) {
    return absl::InvalidArgumentError(absl::StrCat("a pin of a ", key.size(), "-byte key, a ", pin_id.size(),
                                                   "-byte id and ", pages, " pages is past the format's bounds"));
  }
  std::string rec;
  PutU32(&rec, static_cast<uint32_t>(key.size()));
  rec.append(key.data(), key.size());
  PutU32(&rec, static_cast<uint32_t>(pin_id.size()));
  rec.append(pin_id.data(), pin_id.size());
  PutU64(&rec, nanoseconds_left);
  PutU32(&rec, pages);
  return WriteWithCrc(rec);
}

absl::Status SnapshotWriter::Commit() {
  if (absl::Status st = Tombstones({}); !st.ok()) return st;
  if (version_ >= kSnapshotFirstSharedVersion && !pins_written_) {
    if (absl::Status st = BeginPins(0); !st.ok()) return st;
  }
  std::string rec;
  PutU32(&rec, kSnapshotEndTag);
  PutU64(&rec, sequences_);
  PutU64(&rec, pages_);
  if (absl::Status st = WriteWithCrc(rec); !st.ok()) return st;
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    return absl::UnavailableError(OsError("cannot flush", tmp_path_));
  }
  std::fclose(file_);
  file_ = nullptr;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return absl::UnavailableError(OsError(absl::StrCat("cannot rename ", tmp_path_, " to"), path_));
  }
  committed_ = true;
  // The rename itself must reach the disk.
  const int fd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  return absl::OkStatus();
}

// ---- reader ----

absl::StatusOr<std::unique_ptr<SnapshotReader>> SnapshotReader::Open(const std::string& path) {
  std::unique_ptr<SnapshotReader> r(new SnapshotReader());
  r->path_ = path;
  r->file_ = std::fopen(path.c_str(), "rb");
  if (r->file_ == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no snapshot at ", path));
    return absl::UnavailableError(OsError("cannot open", path));
  }
  uint8_t fixed[16];
  if (absl::Status st = r->Read(fixed, sizeof(fixed), "header"); !st.ok()) return st;
  if (std::memcmp(fixed, kSnapshotMagic, sizeof(kSnapshotMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, " is not a driftkv snapshot (bad magic)"));
  }
  const uint32_t version = GetU32(fixed + 8), identity_bytes = GetU32(fixed + 12);
  if (version < 1 || version > kSnapshotVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": snapshot version ", version, " is not one of the supported 1 to ", kSnapshotVersion));
  }
  r->version_ = version;
  if (identity_bytes > kSnapshotMaxIdentityBytes) {
    return absl::DataLossError(absl::StrCat(path, ": identity of ", identity_bytes, " bytes exceeds ",
                                            kSnapshotMaxIdentityBytes, " (corrupt header)"));
  }
  r->identity_.resize(identity_bytes);
  uint32_t crc = 0;
  if (absl::Status st = r->Read(r->identity_.data(), identity_bytes, "identity"); !st.ok()) return st;
  if (absl::Status st = r->Read(&crc, 4, "header checksum"); !st.ok()) return st;
  if (crc != CrcOf(r->identity_.data(), identity_bytes, CrcOf(fixed, sizeof(fixed)))) {
    return absl::DataLossError(absl::StrCat(path, ": header checksum mismatch (corrupt header)"));
  }
  if (version >= kSnapshotFirstDigestVersion) {
    if (absl::Status st = r->ReadTombstones(); !st.ok()) return st;
  }
  return r;
}

absl::Status SnapshotReader::ReadTombstones() {
  uint8_t head[16];
  if (absl::Status st = Read(head, sizeof(head), "tombstone block"); !st.ok()) return st;
  if (CrcOf(head, 12) != GetU32(head + 12) || GetU32(head) != kSnapshotTombstoneTag) {
    return absl::DataLossError(absl::StrCat(path_, ": tombstone block header corrupt (corrupt header)"));
  }
  const uint32_t count = GetU32(head + 4), bytes = GetU32(head + 8);
  if (bytes > kSnapshotMaxTombstoneBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": tombstone block of ", bytes, " bytes exceeds ",
                                            kSnapshotMaxTombstoneBytes, " (corrupt header)"));
  }
  std::string body(bytes, '\0');
  uint32_t crc = 0;
  if (absl::Status st = Read(body.data(), bytes, "tombstones"); !st.ok()) return st;
  if (absl::Status st = Read(&crc, 4, "tombstone checksum"); !st.ok()) return st;
  tombstones_intact_ = crc == CrcOf(body.data(), bytes);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(body.data());
  size_t at = 0;
  for (uint32_t i = 0; tombstones_intact_ && i < count; ++i) {
    if (bytes - at < 4 || bytes - at - 4 < static_cast<size_t>(GetU32(p + at)) + 8) {
      tombstones_intact_ = false;
      break;
    }
    const uint32_t key_bytes = GetU32(p + at);
    tombstones_.emplace_back(body.substr(at + 4, key_bytes), GetU64(p + at + 4 + key_bytes));
    at += 4 + static_cast<size_t>(key_bytes) + 8;
  }
  if (!tombstones_intact_) tombstones_.clear();
  return absl::OkStatus();
}

absl::Status SnapshotReader::Digests(uint64_t count, std::vector<uint64_t>* out, bool* intact) {
  uint8_t head[8];
  if (absl::Status st = Read(head, sizeof(head), "digest count"); !st.ok()) return st;
  if (CrcOf(head, 4) != GetU32(head + 4)) {
    return absl::DataLossError(absl::StrCat(path_, ": digest count checksum mismatch in sequence ", sequences_));
  }
  if (GetU32(head) != count) {
    return absl::DataLossError(absl::StrCat(path_, ": ", GetU32(head), " token digests where the layer has ", count,
                                            " paged tokens, in sequence ", sequences_));
  }
  out->resize(count);
  uint32_t crc = 0;
  absl::Status st = Read(out->data(), count * 8, "token digests");
  if (st.ok()) st = Read(&crc, 4, "digest checksum");
  if (!st.ok()) return st;
  *intact = crc == CrcOf(out->data(), count * 8);
  return absl::OkStatus();
}

SnapshotReader::~SnapshotReader() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status SnapshotReader::Read(void* data, size_t size, absl::string_view what) {
  if (size > 0 && std::fread(data, 1, size, file_) != size) {
    return absl::DataLossError(absl::StrCat(path_, ": truncated in the ", what, " at byte ", std::ftell(file_)));
  }
  return absl::OkStatus();
}

absl::Status SnapshotReader::NextSequence(bool* more, std::string* id, uint32_t* layers) {
  uint8_t head[8];
  if (absl::Status st = Read(head, 4, "record tag"); !st.ok()) return st;
  const uint32_t tag = GetU32(head);
  const bool blocks = version_ >= kSnapshotFirstSharedVersion;
  if (!blocks && tag == kSnapshotEndTag) {
    if (absl::Status st = ReadTrailer(head); !st.ok()) return st;
    *more = false;
    return absl::OkStatus();
  }
  if (blocks && tag == kSnapshotIndexTag) {
    uint8_t rest[12];
    if (absl::Status st = Read(rest, sizeof(rest), "index header"); !st.ok()) return st;
    if (CrcOf(rest, 8, CrcOf(head, 4)) != GetU32(rest + 8)) {
      return absl::DataLossError(absl::StrCat(path_, ": index header checksum mismatch"));
    }
    index_entries_ = GetU64(rest);
    *more = false;
    return absl::OkStatus();
  }
  if (tag != kSnapshotSequenceTag) {
    return absl::DataLossError(absl::StrCat(path_, ": bad record tag ", tag, " at byte ", std::ftell(file_) - 4));
  }
  if (absl::Status st = Read(head + 4, 4, "sequence id size"); !st.ok()) return st;
  const uint32_t id_bytes = GetU32(head + 4);
  if (id_bytes > kSnapshotMaxIdBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": sequence id of ", id_bytes, " bytes (corrupt record)"));
  }
  id->resize(id_bytes);
  uint8_t tail[8];
  if (absl::Status st = Read(id->data(), id_bytes, "sequence id"); !st.ok()) return st;
  if (absl::Status st = Read(tail, 8, "sequence record"); !st.ok()) return st;
  const uint32_t crc = CrcOf(tail, 4, CrcOf(id->data(), id_bytes, CrcOf(head, 8)));
  if (crc != GetU32(tail + 4)) {
    return absl::DataLossError(absl::StrCat(path_, ": sequence record checksum mismatch at sequence ", sequences_));
  }
  *layers = GetU32(tail);
  ++sequences_;
  *more = true;
  return absl::OkStatus();
}

absl::Status SnapshotReader::ReadTrailer(const uint8_t tag[4]) {
  uint8_t rest[20];
  if (absl::Status st = Read(rest, sizeof(rest), "trailer"); !st.ok()) return st;
  const uint32_t crc = CrcOf(rest, 16, CrcOf(tag, 4));
  if (crc != GetU32(rest + 16)) return absl::DataLossError(absl::StrCat(path_, ": trailer checksum mismatch"));
  if (GetU64(rest) != sequences_ || GetU64(rest + 8) != pages_) {
    return absl::DataLossError(absl::StrCat(path_, ": trailer counts ", GetU64(rest), " sequences, ", GetU64(rest + 8),
                                            " pages; the file holds ", sequences_, " and ", pages_));
  }
  return absl::OkStatus();
}

absl::Status SnapshotReader::NextIndexEntry(IndexHeader* entry) {
  uint8_t rec[40];
  if (absl::Status st = Read(rec, sizeof(rec), "index entry"); !st.ok()) return st;
  if (CrcOf(rec, 36) != GetU32(rec + 36)) {
    return absl::DataLossError(absl::StrCat(path_, ": index entry checksum mismatch at byte ", std::ftell(file_) - 40));
  }
  entry->ns.assign(reinterpret_cast<const char*>(rec), 16);
  entry->key.assign(reinterpret_cast<const char*>(rec + 16), 16);
  entry->layer = GetU32(rec + 32);
  return absl::OkStatus();
}

absl::Status SnapshotReader::BeginPins(uint64_t* pins) {
  *pins = 0;
  if (version_ < kSnapshotFirstSharedVersion) return absl::OkStatus();
  uint8_t rec[16];
  if (absl::Status st = Read(rec, sizeof(rec), "pins header"); !st.ok()) return st;
  if (GetU32(rec) != kSnapshotPinsTag) {
    return absl::DataLossError(
        absl::StrCat(path_, ": bad pins tag ", GetU32(rec), " at byte ", std::ftell(file_) - 16));
  }
  if (CrcOf(rec, 12) != GetU32(rec + 12)) {
    return absl::DataLossError(absl::StrCat(path_, ": pins header checksum mismatch"));
  }
  *pins = GetU64(rec + 4);
  return absl::OkStatus();
}

absl::Status SnapshotReader::NextPin(PinHeader* pin) {
  uint8_t size[4];
  if (absl::Status st = Read(size, 4, "pin key size"); !st.ok()) return st;
  const uint32_t key_bytes = GetU32(size);
  if (key_bytes > kSnapshotMaxIdBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": pin key of ", key_bytes, " bytes (corrupt record)"));
  }
  std::string rec(reinterpret_cast<const char*>(size), 4);
  rec.resize(4 + key_bytes + 4);
  if (absl::Status st = Read(rec.data() + 4, key_bytes + 4, "pin key"); !st.ok()) return st;
  const uint32_t id_bytes = GetU32(reinterpret_cast<const uint8_t*>(rec.data()) + 4 + key_bytes);
  if (id_bytes > kSnapshotMaxIdBytes) {
    return absl::DataLossError(absl::StrCat(path_, ": pin id of ", id_bytes, " bytes (corrupt record)"));
  }
  const size_t head = rec.size();
  rec.resize(head + id_bytes + 8 + 4 + 4);
  if (absl::Status st = Read(rec.data() + head, id_bytes + 16, "pin record"); !st.ok()) return st;
  const uint8_t* p = reinterpret_cast<const uint8_t*>(rec.data());
  const size_t body = rec.size() - 4;
  if (CrcOf(p, body) != GetU32(p + body)) {
    return absl::DataLossError(absl::StrCat(path_, ": pin record checksum mismatch"));
  }
  pin->key.assign(rec.data() + 4, key_bytes);
  pin->pin_id.assign(rec.data() + head, id_bytes);
  pin->nanoseconds_left = GetU64(p + head + id_bytes);
  pin->pages = GetU32(p + head + id_bytes + 8);
  if (pin->pages > kSnapshotMaxPinPages) {
    return absl::DataLossError(absl::StrCat(path_, ": pin of ", pin->pages, " pages (corrupt record)"));
  }
  return absl::OkStatus();
}

absl::Status SnapshotReader::Finish() {
  if (version_ < kSnapshotFirstSharedVersion) return absl::OkStatus();  // read by NextSequence
  uint8_t tag[4];
  if (absl::Status st = Read(tag, 4, "trailer tag"); !st.ok()) return st;
  if (GetU32(tag) != kSnapshotEndTag) {
    return absl::DataLossError(
        absl::StrCat(path_, ": bad trailer tag ", GetU32(tag), " at byte ", std::ftell(file_) - 4));
  }
  return ReadTrailer(tag);
}

absl::Status SnapshotReader::NextLayer(size_t n, uint32_t max_window_tokens, LayerHeader* header,
                                       std::vector<uint16_t>* keys, std::vector<uint16_t>* values,
                                       bool* window_intact) {
  uint8_t rec[20];
  if (absl::Status st = Read(rec, sizeof(rec), "layer record"); !st.ok()) return st;
  if (CrcOf(rec, 16) != GetU32(rec + 16)) {
    return absl::DataLossError(absl::StrCat(path_, ": layer record checksum mismatch in sequence ", sequences_));
  }
  header->length = GetU64(rec);
  header->window_tokens = GetU32(rec + 8);
  header->pages = GetU32(rec + 12);
  if (header->window_tokens > max_window_tokens) {
    return absl::DataLossError(absl::StrCat(path_, ": window of ", header->window_tokens, " tokens exceeds ",
                                            max_window_tokens, " in sequence ", sequences_));
  }
  const size_t values_count = static_cast<size_t>(header->window_tokens) * n;
  keys->resize(values_count);
  values->resize(values_count);
  uint32_t stored = 0;
  absl::Status st = Read(keys->data(), values_count * 2, "window keys");
  if (st.ok()) st = Read(values->data(), values_count * 2, "window values");
  if (st.ok()) st = Read(&stored, 4, "window checksum");
  if (!st.ok()) return st;
  *window_intact = stored == CrcOf(values->data(), values_count * 2, CrcOf(keys->data(), values_count * 2));
  return absl::OkStatus();
}

absl::Status SnapshotReader::NextPageKind(bool* shared, uint64_t* ordinal) {
  *shared = false;
  *ordinal = 0;
  PageEntry entry;
  if (absl::Status st = NextPageEntry(&entry); !st.ok()) return st;
  if (entry.kind == PageEntry::kHost || entry.kind == PageEntry::kDisk) {
    return absl::DataLossError(absl::StrCat(path_, ": a page entry of a level below the pool at byte ",
                                            std::ftell(file_), ", where only pool pages belong"));
  }
  *shared = entry.kind == PageEntry::kShared;
  *ordinal = entry.ordinal;
  return absl::OkStatus();
}

absl::Status SnapshotReader::NextPageEntry(PageEntry* entry) {
  *entry = PageEntry();
  if (version_ < kSnapshotFirstSharedVersion) return absl::OkStatus();
  if (next_ != Next::kTag) return absl::FailedPreconditionError("a page entry twice: read the page first");
  uint8_t rec[20];
  if (absl::Status st = Read(rec, 4, "page tag"); !st.ok()) return st;
  const uint32_t tag = GetU32(rec);
  const bool levels = version_ >= kSnapshotFirstLevelVersion;
  if (tag == kSnapshotPageTag || (levels && tag == kSnapshotHostPageTag)) {
    entry->kind = tag == kSnapshotPageTag ? PageEntry::kFull : PageEntry::kHost;
    next_ = tag == kSnapshotPageTag ? Next::kFullPage : Next::kHostPage;
    return absl::OkStatus();
  }
  if (levels && tag == kSnapshotDiskPageTag) {
    if (absl::Status st = Read(rec + 4, 16, "disk page entry"); !st.ok()) return st;
    if (CrcOf(rec, 16) != GetU32(rec + 16)) {
      return absl::DataLossError(absl::StrCat(path_, ": disk page entry checksum mismatch in sequence ", sequences_));
    }
    ++pages_;
    entry->kind = PageEntry::kDisk;
    entry->disk_key = GetU64(rec + 4);
    entry->checksum = GetU32(rec + 12);
    return absl::OkStatus();
  }
  if (tag != kSnapshotSharedPageTag) {
    return absl::DataLossError(absl::StrCat(path_, ": bad page tag ", tag, " at byte ", std::ftell(file_) - 4));
  }
  if (absl::Status st = Read(rec + 4, 12, "shared page entry"); !st.ok()) return st;
  if (CrcOf(rec, 12) != GetU32(rec + 12)) {
    return absl::DataLossError(absl::StrCat(path_, ": shared page entry checksum mismatch in sequence ", sequences_));
  }
  const uint64_t ord = GetU64(rec + 4);
  if (ord >= full_pages_) {
    return absl::DataLossError(absl::StrCat(path_, ": shared page entry repeats page ", ord, " of ", full_pages_,
                                            " full pages read (corrupt record)"));
  }
  ++pages_;
  entry->kind = PageEntry::kShared;
  entry->ordinal = ord;
  return absl::OkStatus();
}

absl::Status SnapshotReader::Page(size_t page_bytes, uint8_t* out, PageChecksum* stored, bool* intact) {
  bool full = true;
  if (version_ >= kSnapshotFirstSharedVersion) {
    if (next_ == Next::kTag) return absl::FailedPreconditionError("Page before a page entry said a page follows");
    full = next_ == Next::kFullPage;
    next_ = Next::kTag;
  }
  absl::Status st = Read(stored, 4, "page checksum");
  if (st.ok()) st = Read(out, page_bytes, "page");
  if (!st.ok()) return st;
  ++pages_;
  if (full) ++full_pages_;
  *intact = Crc32c(out, page_bytes) == *stored;
  return absl::OkStatus();
}

}  // namespace driftkv
