// codec/crc32c_combine.h against wire/crc32c.h: joined checksums and the
// segments' join the device's page checksums follow give the checksum of the
// whole buffer, at every size and segment count, including empty pieces.
#include "codec/crc32c_combine.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> b(n);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

TEST(Crc32cCombineTest, TableMatchesTheChecksum) {
  uint32_t table[256];
  for (uint32_t b = 0; b < 256; ++b) table[b] = Crc32cTableEntry(b);
  const uint8_t check[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  EXPECT_EQ(Crc32cBytes(table, check, 9), 0xE3069283u);
  const std::vector<uint8_t> b = RandomBytes(5000, 1);
  EXPECT_EQ(Crc32cBytes(table, b.data(), b.size()), Crc32cExtend(0, b.data(), b.size()));
}

// The device's word step (kernels/page_crc.cu), words then the last bytes
// a byte at a time, as its loop does for a segment.
TEST(Crc32cCombineTest, SlicingByFourMatchesTheChecksum) {
  uint32_t slice[4][256], table[256];
  for (uint32_t b = 0; b < 256; ++b) {
    table[b] = Crc32cTableEntry(b);
    for (int k = 0; k < 4; ++k) slice[k][b] = Crc32cSliceEntry(k, b);
  }
  for (size_t size : {size_t{0}, size_t{3}, size_t{4}, size_t{17}, size_t{290}, size_t{376}, size_t{5001}}) {
    const std::vector<uint8_t> b = RandomBytes(size, size + 11);
    uint32_t c = 0xFFFFFFFFu;
    size_t i = 0;
    for (; i + 4 <= size; i += 4) {
      const uint32_t word = b[i] | b[i + 1] << 8 | b[i + 2] << 16 | static_cast<uint32_t>(b[i + 3]) << 24;
      c = Crc32cWord(c, word, [&](int k, uint32_t x) { return slice[k][x]; });
    }
    for (; i < size; ++i) c = table[(c ^ b[i]) & 0xFFu] ^ (c >> 8);
    EXPECT_EQ(c ^ 0xFFFFFFFFu, Crc32cExtend(0, b.data(), b.size())) << size;
  }
}

TEST(Crc32cCombineTest, ShiftJoinsTheChecksumsOfTwoPieces) {
  Crc32cPowers powers;
  Crc32cMakePowers(&powers);
  const std::vector<uint8_t> b = RandomBytes(70000, 2);
  for (size_t split : {size_t{0}, size_t{1}, size_t{7}, size_t{16}, size_t{4095}, size_t{69999}, size_t{70000}}) {
    const uint32_t a = Crc32cExtend(0, b.data(), split);
    const uint32_t c = Crc32cExtend(0, b.data() + split, b.size() - split);
    EXPECT_EQ(Crc32cShift(powers, a, b.size() - split) ^ c, Crc32cExtend(0, b.data(), b.size())) << split;
  }
}

TEST(Crc32cCombineTest, JoinedSegmentsAreTheChecksumOfThePage) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{100}, size_t{4099}, size_t{48128}, size_t{73728}}) {
    const std::vector<uint8_t> b = RandomBytes(size, size + 3);
    const uint32_t want = Crc32cExtend(0, b.data(), b.size());
    for (int segments : {1, 2, 8, 256, 512}) {
      EXPECT_EQ(Crc32cBySegments(b.data(), b.size(), segments), want) << size << " bytes, " << segments;
    }
  }
}

}  // namespace
}  // namespace driftkv
