// The query's power of two (kernels/query_scale.h), on the host: the
// range it gives, its clamps, and that a query scaled by it splits into
// finite fp16 hi and lo halves that keep its bits where the unscaled
// query's split would overflow or lose them.
#include "kernels/query_scale.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "wire/half.h"

namespace driftkv {
namespace gpu {
namespace {

TEST(QueryScale, Pow2IsExactOverTheNormalRange) {
  for (int e = -126; e <= 127; ++e) EXPECT_EQ(Pow2(e), std::ldexp(1.0f, e)) << e;
}

TEST(QueryScale, LargestElementLandsIn256To512) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int k = -92; k <= 108; ++k) {
    for (int rep = 0; rep < 20; ++rep) {
      const float m = std::ldexp(rep == 0 ? 1.0f : mant(rng), k);
      const int e = QueryExponent(m);
      const float scaled = m * Pow2(e);
      EXPECT_GE(scaled, 256.0f) << "m " << m << " e " << e;
      EXPECT_LT(scaled, 512.0f) << "m " << m << " e " << e;
    }
  }
}

TEST(QueryScale, ClampsKeepEveryFactorNormal) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(QueryExponent(0.0f), kQueryExponentLimit);
  EXPECT_EQ(QueryExponent(tiny), kQueryExponentLimit);
  EXPECT_EQ(QueryExponent(std::ldexp(1.0f, -93)), kQueryExponentLimit);
  EXPECT_EQ(QueryExponent(std::numeric_limits<float>::max()), -kQueryExponentLimit);
  for (float m : {0.0f, tiny, 1e-30f, 1.0f, 1e30f, std::numeric_limits<float>::max()}) {
    const int e = QueryExponent(m);
    // The factors the kernels build from e: 2^e, 2^-e, and the level
    // kernel's 2^(18 - e) times the softmax unit.
    for (int f : {e, -e, 18 - e}) {
      EXPECT_TRUE(std::isnormal(Pow2(f))) << "m " << m << " factor 2^" << f;
    }
  }
}

// hi = fp16(x), lo = fp16(x - hi), as the kernels' SplitHalf.
void Split(float x, float* hi, float* lo) {
  *hi = HalfToFloat(FloatToHalf(x));
  *lo = HalfToFloat(FloatToHalf(x - *hi));
}

// Queries of the usual size times 3e5 and 2e-7: unscaled, the large ones'
// halves overflow and the tiny ones' fall into fp16's subnormals; scaled
// by 2^e (and the keys' largest factor 2^6), hi + lo is the scaled
// element to about 2^-21 of the largest.
TEST(QueryScale, ScaledSplitStaysFiniteAndAccurate) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float size : {1.0f, 3e5f, 2e-7f, 1e20f, 1e-20f}) {
    std::vector<float> q(128);
    float m = 0.0f;
    for (float& x : q) x = normal(rng) * size, m = std::fmax(m, std::fabs(x));
    const int e = QueryExponent(m);
    bool unscaled_finite = true;
    for (float x : q) {
      float hi, lo;
      Split(x, &hi, &lo);
      unscaled_finite = unscaled_finite && std::isfinite(hi) && std::isfinite(lo);
      const float xs = x * Pow2(e) * 64.0f;
      Split(xs, &hi, &lo);
      ASSERT_TRUE(std::isfinite(hi) && std::isfinite(lo)) << "size " << size << " x " << x;
      EXPECT_LE(std::fabs(static_cast<double>(hi) + lo - xs), std::ldexp(m * Pow2(e) * 64.0, -21))
          << "size " << size << " x " << x;
    }
    if (size == 3e5f) {
      EXPECT_FALSE(unscaled_finite) << "the case must reach past fp16's range";
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
