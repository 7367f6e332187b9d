// WUSH-KV transforms (seed 003): for one (layer, KV head) and one of keys or
// values, a d x d transform built in closed form from two second-order
// statistics:
//   M  the Gram matrix of the cached vectors, sum_t x_t x_t^T;
//   H  the Hessian of the output loss w.r.t. a perturbation of x:
//      keys:   2 * sum over the group's query heads g, sum_i q_gi q_gi^T;
//      values: 2 * sum_g W_g^T W_g, W_g the [hidden][d] block of o_proj that
//              reads query head g's output (identity when not given).
// Construction (seed, "Methodology"):
//   Hd = H + gamma * tr(H)/d * I,   Md = M + gamma * tr(M)/d * I
//   Hd = L L^T                       (Cholesky, L lower)
//   L^T Md L = U Lambda U^T          (eigenvalues descending)
//   T = c * Had * Lambda^(-1/4) * U^T * L^T
//   T^-1 = (1/c) * L^-T * U * Lambda^(1/4) * Had   (Had symmetric orthonormal)
// c > 0 keeps the Frobenius norm of the calibration data:
//   tr(T M T^T) = tr(M), i.e. sum_t ||T x_t||^2 = sum_t ||x_t||^2.
// Then T Md T^T and T^-T Hd T^-1 are both c^(+-2) Had Lambda^(1/2) Had: the
// quantized coordinates are balanced in size and in sensitivity.
// Damping relative to the mean diagonal makes the construction invariant to
// rescaling M or H, as the seed requires (gamma = 1e-2 by default).
#ifndef DRIFTKV_CODEC_TRANSFORM_WUSH_H_
#define DRIFTKV_CODEC_TRANSFORM_WUSH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace driftkv {

constexpr double kWushDefaultGamma = 1e-2;

// A running sum of outer products, sum_t w * x_t x_t^T, in double.
class OuterSum {
 public:
  explicit OuterSum(int d = 0) : d_(d), sum_(static_cast<size_t>(d) * d, 0.0) {}
  int dim() const { return d_; }
  int64_t count() const { return count_; }
  const std::vector<double>& sum() const { return sum_; }
  // Adds `rows` vectors of d floats, row r at x + r * stride. For a W_O
  // block [hidden][d] (row stride q_heads * d) this adds weight * W^T W.
  void Add(const float* x, int64_t rows, int64_t stride, double weight);
  void AddIdentity(double weight);
  void Merge(const OuterSum& other);

 private:
  int d_;
  int64_t count_ = 0;
  std::vector<double> sum_;  // full symmetric d x d, row-major
};

struct WushTransform {
  int d = 0;
  std::vector<double> t;    // d x d, row-major: x' = t x
  std::vector<double> inv;  // d x d, t^-1
  double c = 0.0;           // the norm-keeping scale
};

// d must be a power of two (the Hadamard factor). FailedPrecondition, with a
// message saying which statistic, when M or H is zero, not finite, or not
// positive definite after damping; InvalidArgument on shape mismatch.
absl::StatusOr<WushTransform> BuildWushTransform(const std::vector<double>& gram, const std::vector<double>& hessian,
                                                 int d, double gamma = kWushDefaultGamma);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_WUSH_H_
