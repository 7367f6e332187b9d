#include "wire/half.h"

#include <cmath>
#include <random>

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

}  // namespace
}  // namespace driftkv
