// Crc32cExtend (wire/crc32c.h) against a bit-at-a-time CRC-32C written from
// its definition, over every length that reaches each of its paths (the
// three-lane rounds, the 8-byte words, the tail bytes), every alignment,
// and chained calls.
#include "wire/crc32c.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace {

// The definition: reflected, polynomial 0x82F63B78, register from ~crc.
uint32_t Reference(uint32_t crc, const unsigned char* p, size_t size) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82F63B78u : 0u);
  }
  return ~c;
}

TEST(Crc32cTest, KnownValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST(Crc32cTest, EveryLengthAndAlignmentMatchesTheDefinition) {
  std::mt19937 rng(7);
  std::vector<unsigned char> buf(3 * 680 * 3 + 64);
  for (unsigned char& b : buf) b = static_cast<unsigned char>(rng());
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 2100; ++n) lengths.push_back(n);  // below, at and past one round
  for (size_t n : {4079u, 4080u, 4081u, 4088u, 6119u, 6120u, 6121u, 6127u}) lengths.push_back(n);
  for (size_t n : lengths) {
    for (size_t offset : {0u, 1u, 3u, 7u}) {
      const uint32_t init = rng();
      ASSERT_EQ(Crc32cExtend(init, buf.data() + offset, n), Reference(init, buf.data() + offset, n))
          << "length " << n << " offset " << offset;
    }
  }
}

TEST(Crc32cTest, ChainedCallsEqualOneCall) {
  std::mt19937 rng(11);
  std::string s(20000, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  const uint32_t whole = Crc32c(s);
  for (size_t cut : {1u, 680u, 2039u, 2040u, 2048u, 4097u, 19999u}) {
    EXPECT_EQ(Crc32cExtend(Crc32cExtend(0, s.data(), cut), s.data() + cut, s.size() - cut), whole) << cut;
  }
}

}  // namespace
}  // namespace driftkv
