// CheckValues (wire/tensor.h): the vectorised pass over the bits must
// accept and reject exactly what the element-by-element rule does
// (finite, |x| <= limit), at every length and position, and name the first
// bad element.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "proto/driftkv.pb.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

bool Reference(const std::vector<float>& x, float limit) {
  for (float v : x) {
    if (!std::isfinite(v) || std::fabs(v) > limit) return false;
  }
  return true;
}

TEST(CheckValuesTest, AgreesWithTheElementRuleAtEveryLengthAndPosition) {
  const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  const float kMax = std::numeric_limits<float>::max();
  const float bad_values[] = {kInf, -kInf, kNaN, -kNaN, 2.5f, -2.5f, std::nextafter(2.0f, 3.0f)};
  for (size_t n : {1, 7, 8, 9, 16, 97}) {
    for (size_t at = 0; at < n; ++at) {
      for (float bad : bad_values) {
        std::vector<float> x(n, -2.0f);
        x[0] = -0.0f;
        x[at] = bad;
        for (float limit : {2.0f, kMax, kInf}) {
          const absl::Status st = CheckValues("q", x.data(), n, limit);
          EXPECT_EQ(st.ok(), Reference(x, limit)) << n << " " << at << " " << bad << " " << limit;
          if (!st.ok()) {
            EXPECT_NE(st.message().find("element " + std::to_string(at)), std::string::npos) << st;
          }
        }
      }
    }
  }
  const std::vector<float> edge = {2.0f, -2.0f, 0.0f, -0.0f, 1e-45f};
  EXPECT_TRUE(CheckValues("q", edge.data(), edge.size(), 2.0f).ok());
  EXPECT_TRUE(CheckValues("q", nullptr, 0, 2.0f).ok());
}

// CheckBf16Values gives CheckValues' verdict and message on the floats of
// the same bf16 values: every bf16 bit pattern against limits that are and
// are not bf16 values themselves, and a bad value at every position.
TEST(CheckBf16ValuesTest, AgreesWithCheckValuesOnTheFloatsForEveryBitPattern) {
  const float kInf = std::numeric_limits<float>::infinity();
  const float limits[] = {0.0f,       1e-30f, 2.0f,  std::nextafter(2.0f, 3.0f),
                          2.0078125f, 3.3e4f, 1e38f, std::numeric_limits<float>::max(),
                          kInf};
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t b = static_cast<uint16_t>(bits);
    const float f = Bf16ToFloat(b);
    for (float limit : limits) {
      const absl::Status a = CheckBf16Values("k", &b, 1, limit), want = CheckValues("k", &f, 1, limit);
      ASSERT_EQ(a, want) << std::hex << bits << " " << limit;
    }
  }
  for (size_t n : {1, 8, 33}) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<uint16_t> x(n, FloatToBf16(-1.5f));
      x[at] = FloatToBf16(3.0f);
      std::vector<float> f(n);
      for (size_t i = 0; i < n; ++i) f[i] = Bf16ToFloat(x[i]);
      EXPECT_EQ(CheckBf16Values("k", x.data(), n, 2.0f), CheckValues("k", f.data(), n, 2.0f));
      EXPECT_FALSE(CheckBf16Values("k", x.data(), n, 2.0f).ok());
    }
  }
}

// FirstNonFinite checks tensors in their wire form: the first non-finite
// element (infinities and NaNs of bf16, fp16 and f32) at every length and
// position, the vector pass and the scalar tail alike; large finite values
// pass.
TEST(FirstNonFiniteTest, FindsTheFirstNonFiniteElementInEveryDtype) {
  struct Case {
    int dtype;
    std::vector<uint16_t> bad;  // 16-bit patterns (bf16, fp16)
    uint16_t big_finite;
  };
  const Case cases[] = {{v1::DTYPE_BF16, {0x7f80, 0xff80, 0x7fc0, 0x7f81}, 0x7f7f},
                        {v1::DTYPE_FP16, {0x7c00, 0xfc00, 0x7e00, 0x7c01}, 0x7bff}};
  for (const Case& c : cases) {
    for (size_t n : {1, 15, 16, 17, 33, 100}) {
      std::vector<uint16_t> x(n, c.big_finite);
      EXPECT_EQ(FirstNonFinite(x.data(), c.dtype, n), -1) << c.dtype << " " << n;
      for (size_t at = 0; at < n; ++at) {
        for (uint16_t bad : c.bad) {
          std::vector<uint16_t> y = x;
          y[at] = bad;
          if (at + 1 < n) y[n - 1] = bad;  // a later one is not the first
          EXPECT_EQ(FirstNonFinite(y.data(), c.dtype, n), static_cast<int64_t>(at)) << c.dtype << " " << n << " " << at;
        }
      }
    }
  }
  const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  for (size_t n : {1, 8, 31, 64}) {
    std::vector<float> x(n, std::numeric_limits<float>::max());
    EXPECT_EQ(FirstNonFinite(x.data(), v1::DTYPE_F32, n), -1);
    for (size_t at = 0; at < n; ++at) {
      for (float bad : {kInf, -kInf, kNaN}) {
        std::vector<float> y = x;
        y[at] = bad;
        EXPECT_EQ(FirstNonFinite(y.data(), v1::DTYPE_F32, n), static_cast<int64_t>(at)) << n << " " << at;
      }
    }
  }
}

// FirstOutOfRange with kQueryLimit: at every length and position, the
// first element above the limit or non-finite, in each dtype; the limit
// itself and the values just below it pass, the next value above fails.
// (fp16 has no finite value near 2^96: only its non-finite ones fail.)
TEST(FirstOutOfRangeTest, FindsTheFirstElementAboveTheLimitInEveryDtype) {
  const float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
  const float above = std::nextafter(kQueryLimit, kInf);
  for (size_t n : {1, 8, 31, 64}) {
    std::vector<float> x(n, kQueryLimit);
    x[0] = -kQueryLimit;
    x[n - 1] = std::nextafter(kQueryLimit, 0.0f);
    EXPECT_EQ(FirstOutOfRange(x.data(), v1::DTYPE_F32, n, kQueryLimit), -1) << n;
    for (size_t at = 0; at < n; ++at) {
      for (float bad : {above, -above, 1e38f, kInf, kNaN}) {
        std::vector<float> y = x;
        y[at] = bad;
        if (at + 1 < n) y[n - 1] = bad;
        EXPECT_EQ(FirstOutOfRange(y.data(), v1::DTYPE_F32, n, kQueryLimit), static_cast<int64_t>(at))
            << n << " " << at << " " << bad;
      }
    }
  }
  // bf16: 2^96 is 0x6f80; 0x6f81 is the next value above it.
  for (size_t n : {1, 15, 16, 17, 33, 100}) {
    std::vector<uint16_t> x(n, 0x6f80);
    x[0] = 0xef80;
    x[n - 1] = 0x6f7f;
    EXPECT_EQ(FirstOutOfRange(x.data(), v1::DTYPE_BF16, n, kQueryLimit), -1) << n;
    for (size_t at = 0; at < n; ++at) {
      for (uint16_t bad : {0x6f81, 0xef81, 0x7f7f, 0x7f80, 0x7fc0}) {
        std::vector<uint16_t> y = x;
        y[at] = bad;
        if (at + 1 < n) y[n - 1] = bad;
        EXPECT_EQ(FirstOutOfRange(y.data(), v1::DTYPE_BF16, n, kQueryLimit), static_cast<int64_t>(at))
            << n << " " << at << " " << bad;
      }
    }
    std::vector<uint16_t> h(n, 0x7bff);  // fp16's largest finite value
    EXPECT_EQ(FirstOutOfRange(h.data(), v1::DTYPE_FP16, n, kQueryLimit), -1) << n;
    h[n / 2] = 0x7e00;
    EXPECT_EQ(FirstOutOfRange(h.data(), v1::DTYPE_FP16, n, kQueryLimit), static_cast<int64_t>(n / 2)) << n;
  }
  // A limit of float's largest value is FirstNonFinite's check.
  std::vector<float> big(8, std::numeric_limits<float>::max());
  EXPECT_EQ(FirstOutOfRange(big.data(), v1::DTYPE_F32, 8, std::numeric_limits<float>::max()), -1);
  big[3] = kInf;
  EXPECT_EQ(FirstOutOfRange(big.data(), v1::DTYPE_F32, 8, std::numeric_limits<float>::max()), 3);
}

}  // namespace
}  // namespace driftkv
