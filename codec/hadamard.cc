#include "codec/hadamard.h"

#include <cmath>

namespace driftkv {

void HadamardInPlace(float* x, int d) {
  for (int len = 1; len < d; len <<= 1) {
    for (int i = 0; i < d; i += len << 1) {
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
    }
  }
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  for (int i = 0; i < d; ++i) x[i] *= norm;
}

}  // namespace driftkv
