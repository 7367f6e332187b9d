#include "backends/page_checksum.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace driftkv {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;

// The byte-at-a-time table of the reflected polynomial (the fallback, and
// the tail on every target).
std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    t[i] = c;
  }
  return t;
}

}  // namespace

uint32_t Crc32c(const uint8_t* data, size_t size, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  while (size >= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);  // unaligned, little-endian: the reflected CRC's byte order
    c64 = _mm_crc32_u64(c64, word);
    data += 8;
    size -= 8;
  }
  c = static_cast<uint32_t>(c64);
#endif
  while (size > 0) {
    c = table[(c ^ *data) & 0xFF] ^ (c >> 8);
    ++data;
    --size;
  }
  return ~c;
}

}  // namespace driftkv
