// Drift: the envelope assignment equals a per-value argmin, and the
// Lagrangian solution equals the brute-force optimum where it must.
#include "codec/drift.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace {

TEST(Drift, EnvelopeEqualsArgminPerValue) {
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<float> uni(-1.0f, 16.0f);
  for (int iter = 0; iter < 3000; ++iter) {
    const int levels = 2 + iter % 15;
    float cost[16];
    for (int m = 0; m < levels; ++m) cost[m] = 0.1f + 8.0f * std::uniform_real_distribution<float>()(rng);
    const double lambda = std::exp2(std::uniform_real_distribution<double>(-12, 8)(rng));
    const Assignment a = BuildAssignment(cost, levels, lambda);
    for (int k = 0; k < 64; ++k) {
      const float u = uni(rng);
      double best = std::numeric_limits<double>::infinity();
      for (int m = 0; m < levels; ++m) {
        best = std::min(best, (u - m) * static_cast<double>(u - m) + lambda * cost[m]);
      }
      const int m = a.Assign(u);
      const double got = (u - m) * static_cast<double>(u - m) + lambda * cost[m];
      ASSERT_NEAR(got, best, 1e-9 * (1 + std::fabs(best))) << "levels " << levels << " u " << u;
    }
  }
}

TEST(Drift, NearestAtZeroLambda) {
  const float cost[8] = {8, 6, 3, 1.4f, 1.4f, 3, 6, 8};
  const Assignment a = BuildAssignment(cost, 8, 0.0);
  for (float u = -2.0f; u < 10.0f; u += 0.013f) EXPECT_EQ(a.Assign(u), NearestLevel(u, 8)) << u;
}

// Lagrangian sufficiency: the assignment minimising D + lambda R is optimal
// among all assignments whose cost is at most its own. Checked against
// exhaustive search on tiny streams.
TEST(Drift, MatchesBruteForceOptimumOnTinyStreams) {
  std::mt19937_64 rng(2);
  for (int iter = 0; iter < 400; ++iter) {
    const int n = 1 + iter % 6, levels = 2 + iter % 3;
    float cost[16];
    for (int m = 0; m < levels; ++m) cost[m] = 0.5f + 4.0f * std::uniform_real_distribution<float>()(rng);
    std::vector<float> u(n);
    for (float& x : u) x = std::uniform_real_distribution<float>(0.0f, levels - 1.0f)(rng);
    // A budget between the cheapest and the nearest-rounding cost.
    double cheap = 0, nearest = 0;
    float min_cost = cost[0];
    for (int m = 1; m < levels; ++m) min_cost = std::min(min_cost, cost[m]);
    for (float x : u) {
      cheap += min_cost;
      nearest += cost[NearestLevel(x, levels)];
    }
    const double budget = cheap + (nearest - cheap) * std::uniform_real_distribution<double>()(rng);
    std::vector<uint8_t> sym(n);
    const DriftResult r = Drift(u.data(), n, cost, levels, budget, sym.data());
    double d = 0, c = 0;
    for (int i = 0; i < n; ++i) {
      d += (u[i] - sym[i]) * static_cast<double>(u[i] - sym[i]);
      c += cost[sym[i]];
    }
    ASSERT_LE(c, budget + 1e-9);
    ASSERT_NEAR(c, r.cost_bits, 1e-6);
    // Best distortion among all assignments with cost <= c (exhaustive).
    double best = std::numeric_limits<double>::infinity();
    int total = 1;
    for (int i = 0; i < n; ++i) total *= levels;
    for (int code = 0; code < total; ++code) {
      double dd = 0, cc = 0;
      for (int i = 0, k = code; i < n; ++i, k /= levels) {
        const int m = k % levels;
        dd += (u[i] - m) * static_cast<double>(u[i] - m);
        cc += cost[m];
      }
      if (cc <= c + 1e-9) best = std::min(best, dd);
    }
    ASSERT_NEAR(d, best, 1e-6) << "iteration " << iter;
  }
}

TEST(Drift, AlwaysMeetsAFeasibleBudget) {
  std::mt19937_64 rng(4);
  const float cost[6] = {8, 4.19f, 1.18f, 1.18f, 4.19f, 8};
  std::normal_distribution<float> nd;
  for (int iter = 0; iter < 200; ++iter) {
    const int n = 1024;
    std::vector<float> u(n);
    for (float& x : u) x = 2.5f + 0.8f * nd(rng);
    std::vector<uint8_t> sym(n);
    const double budget = n * 1.18 + std::uniform_real_distribution<double>(0, 800)(rng);
    const DriftResult r = Drift(u.data(), n, cost, 6, budget, sym.data());
    double c = 0;
    for (uint8_t s : sym) c += cost[s];
    ASSERT_LE(c, budget + 1e-6);
    ASSERT_NEAR(c, r.cost_bits, 1e-3);
  }
}

}  // namespace
}  // namespace driftkv
