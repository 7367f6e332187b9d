// CheckValues (wire/tensor.h): the vectorised pass over the bits must
// accept and reject exactly what the element-by-element rule does
// (finite, |x| <= limit), at every length and position, and name the first
// bad element.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
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

}  // namespace
}  // namespace driftkv
