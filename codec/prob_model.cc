#include "codec/prob_model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/rans.h"

namespace driftkv {
namespace {

double NormalCdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

}  // namespace

double ExpectedNormalMax(int n) {
  if (n < 2) n = 2;
  // E[max] = integral of x * n * phi(x) * Phi(x)^(n-1) dx, by the midpoint
  // rule on [-12, 12] with 2^15 steps: the integrand is smooth and negligible
  // outside that range for any n a stream can have.
  constexpr double kLo = -12.0, kHi = 12.0;
  constexpr int kSteps = 1 << 15;
  const double h = (kHi - kLo) / kSteps;
  const double inv_sqrt_2pi = 1.0 / std::sqrt(2.0 * M_PI);
  double sum = 0.0;
  for (int i = 0; i < kSteps; ++i) {
    const double x = kLo + (i + 0.5) * h;
    const double phi = inv_sqrt_2pi * std::exp(-0.5 * x * x);
    const double cdf = NormalCdf(x);
    // Phi^(n-1) through log to avoid pow(0, big) corner cases.
    const double tail = cdf > 0.0 ? std::exp((n - 1) * std::log(cdf)) : 0.0;
    sum += x * n * phi * tail;
  }
  return sum * h;
}

std::vector<double> LevelProbabilities(int n, int levels) {
  const double a = ExpectedNormalMax(n);
  std::vector<double> p(levels);
  const double step = 2.0 * a / (levels - 1);  // grid spacing in normal units
  for (int m = 0; m < levels; ++m) {
    const double lo = m == 0 ? -INFINITY : -a + (m - 0.5) * step;
    const double hi = m == levels - 1 ? INFINITY : -a + (m + 0.5) * step;
    p[m] = (std::isinf(hi) ? 1.0 : NormalCdf(hi)) - (std::isinf(lo) ? 0.0 : NormalCdf(lo));
  }
  return p;
}

absl::Status ModelFrequencies(int n, int levels, double alpha, uint16_t* freq) {
  if (levels < kMinLevels || levels > kMaxLevels) {
    return absl::InvalidArgumentError(
        absl::StrCat("levels ", levels, " out of range [", kMinLevels, ", ", kMaxLevels, "]"));
  }
  if (!(alpha > 0.0) || !(alpha <= 16.0)) {
    return absl::InvalidArgumentError(absl::StrCat("alpha ", alpha, " out of range (0, 16]"));
  }
  std::vector<double> p = LevelProbabilities(n, levels);
  double total = 0.0;
  for (double& v : p) {
    v = std::pow(v, alpha);
    total += v;
  }
  int sum = 0;
  std::vector<int> f(levels);
  for (int m = 0; m < levels; ++m) {
    p[m] /= total;
    f[m] = static_cast<int>(std::lround(p[m] * kProbScale));
    if (f[m] < 1) f[m] = 1;
    sum += f[m];
  }
  // Repair the sum. Taking one unit from level m costs p_m * log2(f/(f-1))
  // expected bits; giving one saves p_m * log2((f+1)/f).
  while (sum != static_cast<int>(kProbScale)) {
    int best = -1;
    double best_score = 0.0;
    for (int m = 0; m < levels; ++m) {
      double score;
      if (sum > static_cast<int>(kProbScale)) {
        if (f[m] <= 1) continue;
        score = -p[m] * std::log2(static_cast<double>(f[m]) / (f[m] - 1));
      } else {
        score = p[m] * std::log2(static_cast<double>(f[m] + 1) / f[m]);
      }
      if (best < 0 || score > best_score) {
        best = m;
        best_score = score;
      }
    }
    if (sum > static_cast<int>(kProbScale)) {
      --f[best];
      --sum;
    } else {
      ++f[best];
      ++sum;
    }
  }
  for (int m = 0; m < levels; ++m) freq[m] = static_cast<uint16_t>(f[m]);
  return absl::OkStatus();
}

}  // namespace driftkv
