#include "codec/hadamard.h"

#include <cmath>

namespace driftkv {
namespace {

// One butterfly stage on a pair of disjoint halves; restrict lets the
// compiler vectorise it.
inline void Butterfly(float* __restrict lo, float* __restrict hi, int len) {
  for (int j = 0; j < len; ++j) {
    const float a = lo[j], b = hi[j];
    lo[j] = a + b;
    hi[j] = a - b;
  }
}

}  // namespace

void HadamardInPlace(float* x, int d) {
  int len = 1;
  if (d >= 4) {
    // Stages 1 and 2 fused per group of four; the same additions in the same
    // order as two separate stages, so results are bit-identical.
    for (int i = 0; i < d; i += 4) {
      const float s0 = x[i] + x[i + 1], d0 = x[i] - x[i + 1];
      const float s1 = x[i + 2] + x[i + 3], d1 = x[i + 2] - x[i + 3];
      x[i] = s0 + s1;
      x[i + 1] = d0 + d1;
      x[i + 2] = s0 - s1;
      x[i + 3] = d0 - d1;
    }
    len = 4;
  }
  for (; len < d; len <<= 1) {
    for (int i = 0; i < d; i += len << 1) Butterfly(x + i, x + i + len, len);
  }
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int i = 0; i < d; ++i) x[i] *= norm;
}

}  // namespace driftkv
