// Random but well-conditioned WUSH transforms for the service tests: the
// codec's own WUSH construction (codec/transform/wush.h) over random
// second-order statistics, different for every (layer, head, K/V) and
// deterministic for a seed. The golden checksums of service_golden_test
// were recorded with these exact matrices: changing the recipe changes them.
#ifndef DRIFTKV_TESTS_RANDOM_WUSH_H_
#define DRIFTKV_TESTS_RANDOM_WUSH_H_

#include <cstdint>
#include <random>
#include <vector>

#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace testing {

// Random SPD d x d, row-major: A A^T / d + 0.5 I with A standard normal
// (eigenvalues >= 0.5: well conditioned).
inline std::vector<double> RandomSpd(int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> g;
  std::vector<double> a(static_cast<size_t>(d) * d), m(a.size(), 0.0);
  for (double& x : a) x = g(rng);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      for (int k = 0; k < d; ++k) m[i * d + j] += a[i * d + k] * a[j * d + k] / d;
    }
    m[i * d + i] += 0.5;
  }
  return m;
}

// Transforms of layers x kv_heads x head_dim. Matrix (l, h, m), m being
// Mat::kKey or Mat::kValue, is built from RandomSpd seeded at = seed +
// 100 l + 10 h + int(m) and RandomSpd seeded at + 5000; its inverse goes to
// the matching *Inverse slot. A failed construction is a test failure.
inline TransformSet RandomWushSet(int layers, int kv_heads, int head_dim, uint64_t seed, uint64_t calibration_tokens) {
  TransformSet s;
  s.layers = layers;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.gamma = kWushDefaultGamma;
  s.calibration_tokens = calibration_tokens;
  s.Resize();
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < kv_heads; ++h) {
      for (Mat m : {Mat::kKey, Mat::kValue}) {
        const uint64_t at = seed + 100 * l + 10 * h + static_cast<int>(m);
        absl::StatusOr<WushTransform> t =
            BuildWushTransform(RandomSpd(head_dim, at), RandomSpd(head_dim, at + 5000), head_dim);
        EXPECT_TRUE(t.ok()) << t.status();
        if (!t.ok()) continue;
        const Mat inv = m == Mat::kKey ? Mat::kKeyInverse : Mat::kValueInverse;
        for (int i = 0; i < head_dim * head_dim; ++i) {
          s.matrix(l, h, m)[i] = static_cast<float>(t->t[i]);
          s.matrix(l, h, inv)[i] = static_cast<float>(t->inv[i]);
        }
      }
    }
  }
  return s;
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_RANDOM_WUSH_H_
