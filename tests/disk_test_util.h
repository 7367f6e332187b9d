// Helpers of the disk level's tests (tiers/): scratch directories, pages
// whose bytes follow from their key alone (so a test compares what it
// reads with bytes it computes again, never with what the store returned
// before), and the segment files of a directory.
#ifndef DRIFTKV_TESTS_DISK_TEST_UTIL_H_
#define DRIFTKV_TESTS_DISK_TEST_UTIL_H_

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "tiers/disk_format.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace tiers {
namespace testing {

// A fresh directory under TEST_TMPDIR (or /tmp), unique per call.
inline std::string ScratchDir(const std::string& name) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/disk_" + name + "_" +
                          std::to_string(getpid()) + "_" + std::to_string(counter++);
  std::filesystem::remove_all(dir);
  return dir;
}

// `size` bytes that depend on `key` and `version` only (splitmix64).
inline std::vector<uint8_t> PageOf(uint64_t key, size_t size, uint64_t version = 0) {
  std::vector<uint8_t> page(size);
  uint64_t x = key * 0x9E3779B97F4A7C15ull + version * 0xD1B54A32D192ED03ull + 1;
  for (size_t i = 0; i < size; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    for (size_t b = 0; b < 8 && i + b < size; ++b) page[i + b] = static_cast<uint8_t>(z >> (8 * b));
  }
  return page;
}

inline uint32_t CrcOf(const std::vector<uint8_t>& page) {
  return Crc32cExtend(0, page.data(), page.size());
}

// The segment files of `dir`, by id.
inline std::vector<std::string> SegmentFiles(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      uint64_t id = 0;
      if (ParseSegmentFileName(e->d_name, &id)) out.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace testing
}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_DISK_TEST_UTIL_H_
