#include "wire/half.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace {

// fp16 value of bits h computed independently in double.
double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

TEST(Half, EveryFiniteHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (((h >> 10) & 31) == 31) continue;
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(static_cast<double>(f), HalfValue(static_cast<uint16_t>(h))) << h;
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
}

TEST(Half, RoundsToNearestEven) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> mag(-20.0f, 16.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::exp2(mag(rng)) * (rng() & 1 ? -1.0f : 1.0f);
    const uint16_t h = FloatToHalf(x);
    // No other half is strictly closer; at a tie the result is even.
    const double err = std::fabs(HalfValue(h) - x);
    for (int d : {-1, 1}) {
      const uint16_t o = static_cast<uint16_t>(h + d);
      if (((o >> 10) & 31) == 31 || ((o ^ h) & 0x8000)) continue;
      const double oerr = std::fabs(HalfValue(o) - x);
      ASSERT_TRUE(err < oerr || (err == oerr && (h & 1) == 0)) << x;
    }
  }
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.00390625f)), 1.0f);       // tie, even stays
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.01171875f)), 1.015625f);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
}

// The array conversions (vectorised where the CPU allows) give the scalar
// functions' bits for every input: random bit patterns (NaNs, infinities,
// subnormals, ties among them), at lengths that leave a scalar tail.
TEST(Bf16, ArraysMatchTheScalarConversionsBitForBit) {
  std::mt19937 rng(17);
  for (size_t count : {0, 1, 7, 8, 9, 63, 1024, 4099}) {
    std::vector<float> x(count);
    std::vector<uint16_t> b(count);
    for (size_t i = 0; i < count; ++i) {
      const uint32_t u = rng();
      std::memcpy(&x[i], &u, 4);
      b[i] = static_cast<uint16_t>(rng());
    }
    if (count >= 8) {
      const uint32_t edge[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u,
                               0x3f808000u, 0x3f818000u, 0x00000001u, 0x7f7fffffu};
      for (int k = 0; k < 8; ++k) std::memcpy(&x[k], &edge[k], 4);
    }
    std::vector<uint16_t> got(count);
    FloatsToBf16(x.data(), count, got.data());
    std::vector<float> back(count);
    Bf16ToFloats(b.data(), count, back.data());
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], FloatToBf16(x[i])) << "count " << count << " element " << i;
      const float want = Bf16ToFloat(b[i]);
      ASSERT_EQ(std::memcmp(&back[i], &want, 4), 0) << "count " << count << " element " << i;
    }
  }
}

}  // namespace
}  // namespace driftkv
