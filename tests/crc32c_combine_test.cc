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
