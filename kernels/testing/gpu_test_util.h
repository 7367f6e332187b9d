// Shared pieces of the GPU tests: the "skipped: no GPU" rule (CI has no GPU;
// the same binaries run on the GPU machine), a random WUSH transform set, and
// the error rule every attention kernel is checked with.
#ifndef DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_
#define DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"

// Ends the test as skipped, saying so on stdout, when no GPU is usable.
#define SKIP_WITHOUT_GPU()                 \
  do {                                     \
    if (!::driftkv::gpu::GpuAvailable()) { \
      std::printf("skipped: no GPU\n");    \
      GTEST_SKIP() << "skipped: no GPU";   \
    }                                      \
  } while (0)

namespace driftkv {
namespace gpu {

// A WUSH transform set of layers x kv_heads x head_dim built by the seed's
// construction from random SPD statistics: well conditioned, not
// orthogonal, deterministic for a seed.
inline TransformSet RandomWushSet(int layers, int kv_heads, int head_dim, uint64_t seed) {
  const int d = head_dim;
  TransformSet set;
  set.layers = layers;
  set.kv_heads = kv_heads;
  set.head_dim = d;
  set.gamma = kWushDefaultGamma;
  set.calibration_tokens = 1;
  set.Resize();
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto spd = [&] {
    std::vector<double> a(d * d), m(d * d, 0.0);
    for (double& x : a) x = normal(rng);
    for (int i = 0; i < d; ++i) {
      for (int j = 0; j < d; ++j) {
        for (int k = 0; k < d; ++k) m[i * d + j] += a[i * d + k] * a[j * d + k] / d;
      }
      m[i * d + i] += 0.1;
    }
    return m;
  };
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < kv_heads; ++h) {
      for (int kind = 0; kind < 2; ++kind) {
        absl::StatusOr<WushTransform> t = BuildWushTransform(spd(), spd(), d);
        EXPECT_TRUE(t.ok()) << t.status();
        float* fwd = set.matrix(l, h, kind == 0 ? Mat::kKey : Mat::kValue);
        float* inv = set.matrix(l, h, kind == 0 ? Mat::kKeyInverse : Mat::kValueInverse);
        for (int i = 0; i < d * d; ++i) fwd[i] = static_cast<float>(t->t[i]), inv[i] = static_cast<float>(t->inv[i]);
      }
    }
  }
  return set;
}

constexpr double kErrFactor = 4.0;
constexpr double kErrFloor = 2e-5;

// Plain fp32 attention of one item: two passes, no online rescaling.
inline void NaiveFloatAttention(const std::vector<float>& k, const std::vector<float>& v, int tokens, int kv_heads,
                                int d, const float* q, int q_heads, float scale, float* out) {
  const int n = kv_heads * d, group = q_heads / kv_heads;
  std::vector<float> s(tokens);
  for (int h = 0; h < q_heads; ++h) {
    const int g = h / group;
    float m = -std::numeric_limits<float>::infinity();
    for (int t = 0; t < tokens; ++t) {
      float dot = 0.0f;
      for (int j = 0; j < d; ++j) dot += q[h * d + j] * k[static_cast<size_t>(t) * n + g * d + j];
      s[t] = scale * dot;
      m = std::max(m, s[t]);
    }
    float l = 0.0f;
    for (int j = 0; j < d; ++j) out[h * d + j] = 0.0f;
    for (int t = 0; t < tokens; ++t) {
      const float w = std::exp(s[t] - m);
      l += w;
      for (int j = 0; j < d; ++j) out[h * d + j] += w * v[static_cast<size_t>(t) * n + g * d + j];
    }
    for (int j = 0; j < d; ++j) out[h * d + j] = tokens > 0 ? out[h * d + j] / l : 0.0f;
  }
}

inline double Norm(const std::vector<double>& a) {
  double s = 0.0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

template <typename T>
inline double DiffNorm(const T* a, const std::vector<double>& ref) {
  double s = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) s += (a[i] - ref[i]) * (a[i] - ref[i]);
  return std::sqrt(s);
}

// The largest error / bound of every CheckItem so far in this process: how
// close a kernel comes to the rule below (a test binary prints it at exit).
inline double& WorstErrorShare() {
  static double worst = 0.0;
  return worst;
}

// Prints WorstErrorShare when the test binary ends; a test file registers
// it once: AddGlobalTestEnvironment(new WorstErrorReport).
class WorstErrorReport : public ::testing::Environment {
 public:
  void TearDown() override { std::printf("worst error / bound of the float64 rule: %.4f\n", WorstErrorShare()); }
};

// Checks one item's GPU output against the references. Error rule
// (flash-attention's): ||gpu - ref64|| <= kErrFactor * ||naive32 - ref64|| +
// kErrFloor * ||ref64||, where ref64 is float64 attention over exactly the
// values the kernel must see and naive32 a plain fp32 implementation over the
// same values; every element must have been written (outputs are poisoned).
inline void CheckItem(const float* gpu_out, float gpu_lse, const std::vector<float>& keys,
                      const std::vector<float>& values, int tokens, int kv_heads, int d, const float* q, int q_heads,
                      float scale, const char* what, int item) {
  const size_t od = static_cast<size_t>(q_heads) * d;
  std::vector<double> ref(od), lse(q_heads);
  ReferenceAttention(keys.data(), values.data(), tokens, kv_heads, d, q, q_heads, scale, ref.data(), lse.data());
  std::vector<float> naive(od);
  NaiveFloatAttention(keys, values, tokens, kv_heads, d, q, q_heads, scale, naive.data());
  for (size_t i = 0; i < od; ++i)
    ASSERT_TRUE(std::isfinite(gpu_out[i])) << what << " item " << item << " element " << i << " not written";
  const double err = DiffNorm(gpu_out, ref), naive_err = DiffNorm(naive.data(), ref);
  const double bound = kErrFactor * naive_err + kErrFloor * Norm(ref);
  if (bound > 0.0) WorstErrorShare() = std::max(WorstErrorShare(), err / bound);
  EXPECT_LE(err, bound) << what << " item " << item << " tokens " << tokens << ": error " << err << " vs naive fp32 "
                        << naive_err << ", |ref| " << Norm(ref);
  if (tokens > 0) {
    EXPECT_NEAR(gpu_lse, lse[0], 1e-3 * (1.0 + std::fabs(lse[0]))) << what << " lse, item " << item;
  }
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_
