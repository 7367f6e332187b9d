#include "wire/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace driftkv {
namespace {

#if defined(__SSE4_2__)
// The crc32 instruction has a latency of 3 cycles and a throughput of one
// a cycle: one chain over a buffer runs at a third of what the unit can
// do. So a long buffer is taken kLane x 3 bytes at a time, as three chains
// over its thirds, each from a zero register, and the three registers are
// joined. The register after `a` then `b` is the register after `b` from
// zero XOR the register after `a` moved across |b| zero bytes, and that
// move is linear over GF(2): a table of what it does to each byte of the
// register. 3 x 680 = 2,040 bytes: a bf16 token row of 1,024 values, the
// windows' checksums, is one round and an 8-byte tail.
constexpr size_t kLane = 680;

uint64_t Chain(uint64_t c, const unsigned char* p, size_t words) {
  for (size_t i = 0; i < words; ++i, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  return c;
}

// What `bytes` zero bytes do to a register, as four byte tables.
struct Shift {
  explicit Shift(size_t bytes) {
    std::array<uint32_t, 32> basis;
    for (int bit = 0; bit < 32; ++bit) {
      uint32_t c = 1u << bit;
      for (size_t i = 0; i < bytes; ++i) c = _mm_crc32_u8(c, 0);
      basis[bit] = c;
    }
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int bit = 0; bit < 8; ++bit) {
          if (b & (1u << bit)) v ^= basis[8 * k + bit];
        }
        table[k][b] = v;
      }
    }
  }
  uint32_t operator()(uint32_t c) const {
    return table[0][c & 0xff] ^ table[1][(c >> 8) & 0xff] ^ table[2][(c >> 16) & 0xff] ^ table[3][c >> 24];
  }
  uint32_t table[4][256];
};

#else
constexpr uint32_t kPolyReflected = 0x82F63B78u;

// Byte-at-a-time table for the portable path.
std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPolyReflected : 0);
    t[i] = c;
  }
  return t;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  // The SSE4.2 crc32 instruction computes exactly this polynomial.
  static const Shift by_one(kLane), by_two(2 * kLane);
  uint64_t c64 = c;
  for (; size >= 3 * kLane; size -= 3 * kLane, p += 3 * kLane) {
    uint64_t a = c64, b = 0, d = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t wa, wb, wd;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kLane + i, 8);
      std::memcpy(&wd, p + 2 * kLane + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      d = _mm_crc32_u64(d, wd);
    }
    c64 = by_two(static_cast<uint32_t>(a)) ^ by_one(static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
  }
  c64 = Chain(c64, p, size / 8);
  p += size / 8 * 8;
  size %= 8;
  c = static_cast<uint32_t>(c64);
  for (; size > 0; --size, ++p) c = _mm_crc32_u8(c, *p);
#else
  static const std::array<uint32_t, 256> table = MakeTable();
  for (; size > 0; --size, ++p) c = table[(c ^ *p) & 0xFF] ^ (c >> 8);
#endif
  return ~c;
}

}  // namespace driftkv
