// CRC-32C (wire/crc32c.h) of a buffer from the checksums of its pieces, in
// arithmetic the host and the GPU share: a device kernel sums each of a
// page's segments on its own thread, multiplies each sum by the power of x
// that the bytes after its segment stand for, and XORs the products
// (kernels/page_crc.h); Crc32cBySegments does the same steps on the host,
// so that a test here pins down what the kernel computes.
//
// The register is a polynomial over GF(2) in CRC-32C's reflected form
// (bit 31 is x^0). Appending n zero bytes to a message multiplies its
// checksum by x^(8n) modulo the polynomial, so
//   Crc32c(a + b) = Crc32c(a) * x^(8 |b|) + Crc32c(b)   (mod P)
// for finished checksums: the initial and final inversions cancel.
#ifndef DRIFTKV_CODEC_CRC32C_COMBINE_H_
#define DRIFTKV_CODEC_CRC32C_COMBINE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/host_device.h"

namespace driftkv {

constexpr uint32_t kCrc32cPolyReflected = 0x82F63B78u;

// a * b mod P (both reflected).
DRIFTKV_HOST_DEVICE inline uint32_t Crc32cMulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int i = 0; i < 32; ++i) {
    if (a & (0x80000000u >> i)) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kCrc32cPolyReflected : b >> 1;  // b * x
  }
  return product;
}

// x^(2^k) mod P for k in [0, 32): what Crc32cShift multiplies by.
struct Crc32cPowers {
  uint32_t x2k[32];
};
DRIFTKV_HOST_DEVICE inline void Crc32cMakePowers(Crc32cPowers* p) {
  p->x2k[0] = 0x40000000u;  // x^1
  for (int k = 1; k < 32; ++k) p->x2k[k] = Crc32cMulModP(p->x2k[k - 1], p->x2k[k - 1]);
}

// crc * x^(8 bytes) mod P: what `bytes` zero bytes appended do.
DRIFTKV_HOST_DEVICE inline uint32_t Crc32cShift(const Crc32cPowers& p, uint32_t crc, uint64_t bytes) {
  uint64_t bits = bytes << 3;
  for (int k = 0; bits != 0 && k < 32; ++k, bits >>= 1) {
    if (bits & 1) crc = Crc32cMulModP(p.x2k[k], crc);
  }
  // Exponents past 2^32 wrap: x^(2^32) is not x^0, but no page is 512 MB.
  return crc;
}

// Entry `byte` of the byte-at-a-time table (the register after one byte).
DRIFTKV_HOST_DEVICE inline uint32_t Crc32cTableEntry(uint32_t byte) {
  uint32_t c = byte;
  for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ kCrc32cPolyReflected : c >> 1;
  return c;
}

// Slicing by four: entry `byte` of table k (0..3) is the register after
// that byte followed by k zero bytes, so one little-endian word goes in by
// four independent lookups (Crc32cWord) instead of a chain of four.
DRIFTKV_HOST_DEVICE inline uint32_t Crc32cSliceEntry(int k, uint32_t byte) {
  uint32_t c = Crc32cTableEntry(byte);
  for (int i = 0; i < k; ++i) c = Crc32cTableEntry(c & 0xFFu) ^ (c >> 8);
  return c;
}

// The register after the four bytes of `word` (little-endian), given
// entry(k, b) = Crc32cSliceEntry(k, b) however the caller holds the tables.
template <typename Entry>
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t Crc32cWord(uint32_t c, uint32_t word, Entry&& entry) {
  c ^= word;
  return entry(3, c & 0xFFu) ^ entry(2, (c >> 8) & 0xFFu) ^ entry(1, (c >> 16) & 0xFFu) ^ entry(0, c >> 24);
}

// Crc32c of `size` bytes, a byte at a time through `table` (256 entries).
DRIFTKV_HOST_DEVICE inline uint32_t Crc32cBytes(const uint32_t* table, const uint8_t* data, size_t size) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Where segment s of `segments` over `size` bytes starts: segments of
// ceil(size / segments) bytes rounded up to 16, the last ones shorter or empty.
DRIFTKV_HOST_DEVICE inline size_t Crc32cSegmentBegin(size_t size, int segments, int s) {
  size_t length = (size + segments - 1) / segments;
  length = (length + 15) & ~static_cast<size_t>(15);
  const size_t begin = static_cast<size_t>(s) * length;
  return begin < size ? begin : size;
}

// What segment s's checksum is multiplied by in the whole's:
// x^(8 * (bytes after the segment)) mod P, for each of `segments` segments
// over `size` bytes. Since the product is linear, the whole's checksum is
// the XOR over s of Crc32cMulModP(shift[s], Crc32c(segment s)) (an empty
// segment's checksum is 0). The device kernel takes these from the host,
// one per thread.
inline void Crc32cSegmentShifts(size_t size, int segments, uint32_t* shift) {
  Crc32cPowers powers;
  Crc32cMakePowers(&powers);
  for (int s = 0; s < segments; ++s) {
    shift[s] = Crc32cShift(powers, 0x80000000u /* x^0 */, size - Crc32cSegmentBegin(size, segments, s + 1));
  }
}

// Crc32c of `size` bytes as the kernel computes it: each of `segments`
// (> 0) summed alone, each sum multiplied by its shift, the products XORed
// together.
inline uint32_t Crc32cBySegments(const uint8_t* data, size_t size, int segments) {
  uint32_t table[256];
  for (uint32_t b = 0; b < 256; ++b) table[b] = Crc32cTableEntry(b);
  std::vector<uint32_t> shift(static_cast<size_t>(segments));
  Crc32cSegmentShifts(size, segments, shift.data());
  uint32_t whole = 0;
  for (int s = 0; s < segments; ++s) {
    const size_t begin = Crc32cSegmentBegin(size, segments, s), end = Crc32cSegmentBegin(size, segments, s + 1);
    whole ^= Crc32cMulModP(shift[s], Crc32cBytes(table, data + begin, end - begin));
  }
  return whole;
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_CRC32C_COMBINE_H_
