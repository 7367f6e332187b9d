#include "codec/transform/linalg.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace linalg {

void MatMul(const double* a, const double* b, int d, double* c) {
  std::fill(c, c + static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i) {
    for (int k = 0; k < d; ++k) {
      const double aik = a[i * d + k];
      for (int j = 0; j < d; ++j) c[i * d + j] += aik * b[k * d + j];
    }
  }
}

std::vector<double> Transpose(const double* a, int d) {
  std::vector<double> t(static_cast<size_t>(d) * d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) t[j * d + i] = a[i * d + j];
  }
  return t;
}

absl::Status Cholesky(const double* a, int d, double* l) {
  std::fill(l, l + static_cast<size_t>(d) * d, 0.0);
  for (int j = 0; j < d; ++j) {
    double s = a[j * d + j];
    for (int k = 0; k < j; ++k) s -= l[j * d + k] * l[j * d + k];
    if (!(s > 0.0) || !std::isfinite(s)) {
      return absl::FailedPreconditionError(
          absl::StrCat("matrix is not positive definite (Cholesky pivot ", j, " is ", s, ")"));
    }
    const double ljj = std::sqrt(s);
    l[j * d + j] = ljj;
    for (int i = j + 1; i < d; ++i) {
      double t = a[i * d + j];
      for (int k = 0; k < j; ++k) t -= l[i * d + k] * l[j * d + k];
      l[i * d + j] = t / ljj;
    }
  }
  return absl::OkStatus();
}

absl::Status SymmetricEigen(const double* input, int d, double* w, double* v) {
  std::vector<double> a(input, input + static_cast<size_t>(d) * d);
  std::fill(v, v + static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i) v[i * d + i] = 1.0;
  double total = 0.0;
  for (double x : a) total += x * x;
  bool converged = total == 0.0;
  for (int sweep = 0; sweep < 100 && !converged; ++sweep) {
    double off = 0.0;
    for (int p = 0; p < d; ++p) {
      for (int q = p + 1; q < d; ++q) off += 2.0 * a[p * d + q] * a[p * d + q];
    }
    if (off <= 1e-30 * total) {
      converged = true;
      break;
    }
    for (int p = 0; p < d; ++p) {
      for (int q = p + 1; q < d; ++q) {
        const double apq = a[p * d + q];
        if (apq == 0.0) continue;
        // The rotation that zeroes a[p][q] (Golub & Van Loan, Alg. 8.4.1),
        // the smaller of the two angles for stability.
        const double theta = (a[q * d + q] - a[p * d + p]) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int k = 0; k < d; ++k) {  // columns p and q
          const double akp = a[k * d + p], akq = a[k * d + q];
          a[k * d + p] = c * akp - s * akq;
          a[k * d + q] = s * akp + c * akq;
        }
        for (int k = 0; k < d; ++k) {  // rows p and q
          const double apk = a[p * d + k], aqk = a[q * d + k];
          a[p * d + k] = c * apk - s * aqk;
          a[q * d + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < d; ++k) {
          const double vkp = v[k * d + p], vkq = v[k * d + q];
          v[k * d + p] = c * vkp - s * vkq;
          v[k * d + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  if (!converged) return absl::InternalError("Jacobi eigendecomposition did not converge in 100 sweeps");
  // Sort descending (stable on index for equal eigenvalues), fix signs.
  std::vector<int> order(d);
  for (int i = 0; i < d; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return a[x * d + x] > a[y * d + y]; });
  std::vector<double> vs(static_cast<size_t>(d) * d);
  for (int c = 0; c < d; ++c) {
    const int src = order[c];
    w[c] = a[src * d + src];
    int big = 0;
    for (int k = 1; k < d; ++k) {
      if (std::fabs(v[k * d + src]) > std::fabs(v[big * d + src])) big = k;
    }
    const double sign = v[big * d + src] < 0 ? -1.0 : 1.0;
    for (int k = 0; k < d; ++k) vs[k * d + c] = sign * v[k * d + src];
  }
  std::copy(vs.begin(), vs.end(), v);
  return absl::OkStatus();
}

void SolveLowerTransposed(const double* l, int d, double* x, int cols) {
  // l^T is upper triangular: solve from the last row up.
  for (int c = 0; c < cols; ++c) {
    for (int i = d - 1; i >= 0; --i) {
      double s = x[i * cols + c];
      for (int k = i + 1; k < d; ++k) s -= l[k * d + i] * x[k * cols + c];
      x[i * cols + c] = s / l[i * d + i];
    }
  }
}

}  // namespace linalg
}  // namespace driftkv
