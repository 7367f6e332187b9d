#include "codec/transform/wush.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"
#include "codec/transform/linalg.h"

namespace driftkv {
namespace {

// Md = M + gamma * tr(M)/d * I, after checking M. `what` names M in errors.
absl::StatusOr<std::vector<double>> Damp(const std::vector<double>& m, int d, double gamma, const char* what) {
  double trace = 0.0;
  for (int i = 0; i < d; ++i) trace += m[i * d + i];
  for (double x : m) {
    if (!std::isfinite(x)) return absl::FailedPreconditionError(absl::StrCat(what, " has a non-finite entry"));
  }
  if (!(trace > 0.0)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is singular (trace ", trace, "): no calibration data reached it"));
  }
  std::vector<double> out = m;
  for (int i = 0; i < d; ++i) out[i * d + i] += gamma * trace / d;
  return out;
}

// The normalised Hadamard matrix of order d (hadamard.h's, in double).
std::vector<double> HadamardMatrix(int d) {
  std::vector<double> h(static_cast<size_t>(d) * d);
  std::vector<float> e(d);
  for (int j = 0; j < d; ++j) {
    std::fill(e.begin(), e.end(), 0.0f);
    e[j] = 1.0f;
    HadamardInPlace(e.data(), d);
    // Entries are exactly +-1/sqrt(d) up to float rounding: restore them.
    for (int i = 0; i < d; ++i) h[i * d + j] = (e[i] > 0 ? 1.0 : -1.0) / std::sqrt(static_cast<double>(d));
  }
  return h;
}

}  // namespace

void OuterSum::Add(const float* x, int64_t rows, int64_t stride, double weight) {
  const int d = d_;
  std::vector<double> row(d);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    for (int j = 0; j < d; ++j) row[j] = xr[j];
    for (int i = 0; i < d; ++i) {
      const double a = weight * row[i];
      double* s = sum_.data() + static_cast<size_t>(i) * d;
      for (int j = 0; j <= i; ++j) s[j] += a * row[j];
    }
  }
  // Only the lower triangle is accumulated; mirror it.
  for (int i = 0; i < d; ++i) {
    for (int j = i + 1; j < d; ++j) sum_[i * d + j] = sum_[j * d + i];
  }
  count_ += rows;
}

void OuterSum::AddIdentity(double weight) {
  for (int i = 0; i < d_; ++i) sum_[i * d_ + i] += weight;
  ++count_;
}

void OuterSum::Merge(const OuterSum& other) {
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += other.sum_[i];
  count_ += other.count_;
}

absl::StatusOr<WushTransform> BuildWushTransform(const std::vector<double>& gram, const std::vector<double>& hessian,
                                                 int d, double gamma) {
  const size_t dd = static_cast<size_t>(d) * d;
  if (!IsPowerOfTwo(d)) return absl::InvalidArgumentError(absl::StrCat("head_dim ", d, " is not a power of two"));
  if (gram.size() != dd || hessian.size() != dd) {
    return absl::InvalidArgumentError(absl::StrCat("statistics are ", gram.size(), " and ", hessian.size(),
                                                   " entries, expected ", dd, " (", d, " x ", d, ")"));
  }
  if (!(gamma >= 0.0) || !std::isfinite(gamma)) {
    return absl::InvalidArgumentError(absl::StrCat("damping gamma ", gamma, " must be >= 0"));
  }
  absl::StatusOr<std::vector<double>> md = Damp(gram, d, gamma, "Gram matrix");
  if (!md.ok()) return md.status();
  absl::StatusOr<std::vector<double>> hd = Damp(hessian, d, gamma, "Hessian");
  if (!hd.ok()) return hd.status();

  std::vector<double> l(dd);
  absl::Status st = linalg::Cholesky(hd->data(), d, l.data());
  if (!st.ok()) return absl::FailedPreconditionError(absl::StrCat("damped Hessian: ", st.message()));
  // S = L^T Md L.
  std::vector<double> lt = linalg::Transpose(l.data(), d), tmp(dd), s(dd);
  linalg::MatMul(lt.data(), md->data(), d, tmp.data());
  linalg::MatMul(tmp.data(), l.data(), d, s.data());
  for (int i = 0; i < d; ++i) {  // symmetrise rounding
    for (int j = 0; j < i; ++j) s[i * d + j] = s[j * d + i] = 0.5 * (s[i * d + j] + s[j * d + i]);
  }
  std::vector<double> lambda(d), u(dd);
  st = linalg::SymmetricEigen(s.data(), d, lambda.data(), u.data());
  if (!st.ok()) return st;
  if (!(lambda[d - 1] > 0.0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "damped Gram matrix is singular in Hessian coordinates (smallest eigenvalue ", lambda[d - 1], ")"));
  }
  // A = Lambda^(-1/4) U^T L^T; T = Had A.
  std::vector<double> a(dd), ut = linalg::Transpose(u.data(), d);
  linalg::MatMul(ut.data(), lt.data(), d, a.data());
  for (int i = 0; i < d; ++i) {
    const double f = std::pow(lambda[i], -0.25);
    for (int j = 0; j < d; ++j) a[i * d + j] *= f;
  }
  const std::vector<double> had = HadamardMatrix(d);
  WushTransform out;
  out.d = d;
  out.t.resize(dd);
  linalg::MatMul(had.data(), a.data(), d, out.t.data());
  // c from tr(T M T^T) = tr(M) on the undamped M.
  double num = 0.0, den = 0.0;
  linalg::MatMul(out.t.data(), gram.data(), d, tmp.data());
  for (int i = 0; i < d; ++i) {
    num += gram[i * d + i];
    for (int j = 0; j < d; ++j) den += tmp[i * d + j] * out.t[i * d + j];
  }
  if (!(den > 0.0)) return absl::FailedPreconditionError("transformed calibration data has zero norm");
  out.c = std::sqrt(num / den);
  for (double& x : out.t) x *= out.c;
  // inv = (1/c) L^-T U Lambda^(1/4) Had.
  std::vector<double> b(dd);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) b[i * d + j] = u[i * d + j] * std::pow(lambda[j], 0.25);
  }
  out.inv.resize(dd);
  linalg::MatMul(b.data(), had.data(), d, out.inv.data());
  linalg::SolveLowerTransposed(l.data(), d, out.inv.data(), d);
  for (double& x : out.inv) x /= out.c;
  return out;
}

}  // namespace driftkv
