// The building blocks of the baseline codecs: exact base-M packing, bit
// packing, E4M3 rounding, Gaussian Lloyd-Max levels, quantiles.
#include <cmath>
#include <random>
#include <vector>

#include "codec/baselines/base_m.h"
#include "codec/baselines/common.h"
#include "codec/baselines/fp8_codec.h"
#include "codec/baselines/group_affine.h"
#include "codec/baselines/turbo_codec.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace baselines {
namespace {

TEST(BaseM, BytesAreTheIdealChargeRoundedUpOncePerStream) {
  EXPECT_EQ(BaseMBytes(512, 6), 166u);  // ceil(512 * log2 6 / 8) = ceil(165.4)
  EXPECT_EQ(BaseMBytes(512, 3), 102u);  // ceil(101.4)
  EXPECT_EQ(BaseMBytes(512, 4), 128u);  // power of two: exactly 2 bits each
  EXPECT_EQ(BaseMBytes(1, 2), 1u);
  EXPECT_EQ(BaseMBytes(3, 256), 3u);
  EXPECT_EQ(BaseMBytes(4, 256), 4u);
  for (int m : {3, 5, 6, 7, 11, 13}) {
    for (int n : {1, 7, 97, 512, 1024}) {
      EXPECT_EQ(BaseMBytes(n, m), static_cast<size_t>(std::ceil(n * std::log2(static_cast<double>(m)) / 8.0)))
          << "n " << n << " M " << m;
    }
  }
}

TEST(BaseM, RoundTripsRandomAndExtremeStreams) {
  std::mt19937 rng(7);
  std::vector<uint32_t> limbs;
  for (int m : {2, 3, 5, 6, 8, 16, 255, 256}) {
    for (int n : {1, 2, 13, 97, 512}) {
      const size_t bytes = BaseMBytes(n, m);
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<uint8_t> s(n), back(n), packed(bytes);
        for (int i = 0; i < n; ++i) {
          s[i] = pattern == 0 ? rng() % m : pattern == 1 ? m - 1 : 0;
        }
        PackBaseM(s.data(), n, m, bytes, packed.data(), &limbs);
        ASSERT_TRUE(UnpackBaseM(packed.data(), bytes, n, m, back.data(), &limbs).ok());
        EXPECT_EQ(s, back) << "n " << n << " M " << m << " pattern " << pattern;
      }
    }
  }
}

TEST(BaseM, ValueAtLeastMToTheNIsDataLoss) {
  std::vector<uint32_t> limbs;
  const int n = 512, m = 6;
  std::vector<uint8_t> packed(BaseMBytes(n, m), 0xff), s(n);
  const absl::Status st = UnpackBaseM(packed.data(), packed.size(), n, m, s.data(), &limbs);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  for (uint8_t v : s) EXPECT_LT(v, m);
}

TEST(BitPacking, RoundTripsEveryWidth) {
  std::mt19937 rng(3);
  for (int bits = 1; bits <= 8; ++bits) {
    const int n = 97;
    std::vector<uint8_t> codes(n), back(n), packed(PackedBytes(n, bits));
    for (auto& c : codes) c = rng() & ((1u << bits) - 1);
    PackBits(codes.data(), n, bits, packed.data());
    UnpackBits(packed.data(), n, bits, back.data());
    EXPECT_EQ(codes, back) << bits;
  }
}

TEST(E4M3, KnownValuesAndRoundingToNearestEven) {
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(FloatToE4M3(-1000.0f), 0xfe);
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);  // tie between 1 and 1.125: even
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3a);  // tie between 1.125 and 1.25: even
  for (int c = 0; c < 0x7f; ++c) {
    EXPECT_EQ(FloatToE4M3(E4M3ToFloat(static_cast<uint8_t>(c))), c);
  }
}

TEST(LloydMax, MatchesTheTabulatedGaussianQuantizers) {
  const std::vector<double> one = GaussianLloydMax(2);
  EXPECT_NEAR(one[1], std::sqrt(2.0 / M_PI), 1e-6);
  const std::vector<double> two = GaussianLloydMax(4);  // Max (1960): 0.4528, 1.5104
  EXPECT_NEAR(two[2], 0.4528, 1e-3);
  EXPECT_NEAR(two[3], 1.5104, 1e-3);
  EXPECT_NEAR(two[0], -two[3], 1e-9);
}

TEST(RandomOrthogonal, IsOrthonormalAndDeterministic) {
  const int d = 32;
  const std::vector<float> r = RandomOrthogonal(d, 11);
  EXPECT_EQ(r, RandomOrthogonal(d, 11));
  EXPECT_NE(r, RandomOrthogonal(d, 12));
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += static_cast<double>(r[i * d + k]) * r[j * d + k];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
    }
  }
}

TEST(Quantile, InterpolatesOrderStatistics) {
  std::vector<float> v = {4, 0, 3, 1, 2};
  EXPECT_FLOAT_EQ(Quantile(v.data(), 5, 0.5), 2.0f);
  v = {4, 0, 3, 1, 2};
  EXPECT_FLOAT_EQ(Quantile(v.data(), 5, 0.9), 3.6f);
  v = {4, 0, 3, 1, 2};
  EXPECT_FLOAT_EQ(Quantile(v.data(), 5, 1.0), 4.0f);
}

}  // namespace
}  // namespace baselines
}  // namespace driftkv
