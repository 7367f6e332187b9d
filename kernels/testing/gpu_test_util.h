// Shared pieces of the GPU tests: the "skipped: no GPU" rule (CI has no GPU;
// the same binaries run on the GPU machine) and a random WUSH transform set.
#ifndef DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_
#define DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_

#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "gtest/gtest.h"
#include "kernels/attention.h"

// Ends the test as skipped, saying so on stdout, when no GPU is usable.
#define SKIP_WITHOUT_GPU()                         \
  do {                                             \
    if (!::driftkv::gpu::GpuAvailable()) {         \
      std::printf("skipped: no GPU\n");            \
      GTEST_SKIP() << "skipped: no GPU";           \
    }                                              \
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

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_TESTING_GPU_TEST_UTIL_H_
