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
  for (int s = 0; s < 64; ++s) {
    bool more = false;
    std::string id;
    uint32_t layers = 0;
    if (!(*r)->NextSequence(&more, &id, &layers).ok() || !more) return 0;
    for (uint32_t l = 0; l < std::min<uint32_t>(layers, 4); ++l) {
      SnapshotReader::LayerHeader h;
      bool intact = false;
      if (!(*r)->NextLayer(kN, 256, &h, &keys, &values, &intact).ok()) return 0;
      for (uint32_t p = 0; p < std::min<uint32_t>(h.pages, 64); ++p) {
        bool shared = false;
        uint64_t ordinal = 0;
        if (!(*r)->NextPageKind(&shared, &ordinal).ok()) return 0;
        if (shared) {
          // A repeat names a full page already read, never one ahead.
          if (ordinal >= (*r)->full_pages()) __builtin_trap();
          continue;
        }
        PageChecksum stored = 0;
        if (!(*r)->Page(kPageBytes, page.data(), &stored, &intact).ok()) return 0;
      }
      if ((*r)->version() >= kSnapshotFirstDigestVersion && h.pages <= 64) {
        std::vector<uint64_t> digests;
        if (!(*r)->Digests(uint64_t{h.pages} * 16, &digests, &intact).ok()) return 0;
      }
    }
  }
  return 0;
}
