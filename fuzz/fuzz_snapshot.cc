// libFuzzer: the snapshot file reader (service/snapshot_file.h): any bytes
// give records, DataLoss or a clean end; never an allocation beyond the
// documented bounds or a read past the file. (The handler's restore over
// it is tested by tests/service_drain_test.cc.)
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "service/snapshot_file.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp != nullptr ? tmp : "/tmp") + "/fuzz_snapshot." + std::to_string(getpid());
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  absl::StatusOr<std::unique_ptr<SnapshotReader>> r = SnapshotReader::Open(path);
  if (!r.ok()) return 0;
  constexpr size_t kN = 64, kPageBytes = 96;
  std::vector<uint16_t> keys, values;
  std::vector<uint8_t> page(kPageBytes);
  // One page entry: a repeat names a full page already read, never one
  // ahead.
  auto page_entry = [&](std::vector<uint8_t>* page) {
    bool shared = false, intact = false;
    uint64_t ordinal = 0;
    if (!(*r)->NextPageKind(&shared, &ordinal).ok()) return false;
    if (shared) {
      if (ordinal >= (*r)->full_pages()) __builtin_trap();
      return true;
    }
    PageChecksum stored = 0;
    return (*r)->Page(kPageBytes, page->data(), &stored, &intact).ok();
  };
  // A layer's page entry (version 5: also the levels below the pool).
  auto layer_entry = [&](std::vector<uint8_t>* page) {
    SnapshotReader::PageEntry e;
    bool intact = false;
    if (!(*r)->NextPageEntry(&e).ok()) return false;
    if (e.kind == SnapshotReader::PageEntry::kShared) {
      if (e.ordinal >= (*r)->full_pages()) __builtin_trap();
      return true;
    }
    if (e.kind == SnapshotReader::PageEntry::kDisk) return true;
    PageChecksum stored = 0;
    return (*r)->Page(kPageBytes, page->data(), &stored, &intact).ok();
  };
  for (int s = 0;; ++s) {
    bool more = false;
    std::string id;
    uint32_t layers = 0;
    if (!(*r)->NextSequence(&more, &id, &layers).ok()) return 0;
    if (!more) break;
    if (s == 64) return 0;
    for (uint32_t l = 0; l < std::min<uint32_t>(layers, 4); ++l) {
      SnapshotReader::LayerHeader h;
      bool intact = false;
      if (!(*r)->NextLayer(kN, 256, &h, &keys, &values, &intact).ok()) return 0;
      for (uint32_t p = 0; p < std::min<uint32_t>(h.pages, 64); ++p) {
        if (!layer_entry(&page)) return 0;
      }
      if ((*r)->version() >= kSnapshotFirstDigestVersion && h.pages <= 64) {
        std::vector<uint64_t> digests;
        if (!(*r)->Digests(uint64_t{h.pages} * 16, &digests, &intact).ok()) return 0;
      }
    }
  }
  // The index and the pins (version 4), then the trailer.
  for (uint64_t e = 0; e < std::min<uint64_t>((*r)->index_entries(), 64); ++e) {
    SnapshotReader::IndexHeader entry;
    if (!(*r)->NextIndexEntry(&entry).ok() || !page_entry(&page)) return 0;
    if (entry.ns.size() != 16 || entry.key.size() != 16) __builtin_trap();
    std::vector<uint64_t> digests;
    bool intact = false;
    if (!(*r)->Digests(16, &digests, &intact).ok()) return 0;
  }
  if ((*r)->index_entries() > 64) return 0;
  uint64_t pins = 0;
  if (!(*r)->BeginPins(&pins).ok()) return 0;
  for (uint64_t i = 0; i < std::min<uint64_t>(pins, 64); ++i) {
    SnapshotReader::PinHeader pin;
    if (!(*r)->NextPin(&pin).ok()) return 0;
    for (uint32_t p = 0; p < std::min<uint32_t>(pin.pages, 64); ++p) {
      if (!page_entry(&page)) return 0;
    }
  }
  (void)(*r)->Finish();
  return 0;
}
