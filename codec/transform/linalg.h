// Small dense linear algebra in double precision for the WUSH-KV transforms
// (codec/transform/wush.h): Cholesky, symmetric eigendecomposition, triangular solves.
// Matrices are d x d, row-major, a[i * d + j]; d is a head dimension (<= a
// few hundred), so O(d^3) Jacobi sweeps are cheap and no LAPACK is needed.
//
// Determinism: every routine runs a fixed sequence of floating-point
// operations that depends only on its input, so the same statistics give
// bit-identical transforms on every run and thread count.
#ifndef DRIFTKV_CODEC_TRANSFORM_LINALG_H_
#define DRIFTKV_CODEC_TRANSFORM_LINALG_H_

#include <vector>

#include "absl/status/status.h"

namespace driftkv {
namespace linalg {

// c = a * b, all d x d. c must not alias a or b.
void MatMul(const double* a, const double* b, int d, double* c);

// a^T, d x d.
std::vector<double> Transpose(const double* a, int d);

// Lower-triangular l with a = l l^T. FailedPrecondition (naming the pivot)
// if a is not symmetric positive definite to double precision.
absl::Status Cholesky(const double* a, int d, double* l);

// a = v diag(w) v^T for symmetric a (cyclic Jacobi rotations, run until the
// off-diagonal mass is below 1e-15 of the total, at most 100 sweeps).
// Eigenvalues w descending; eigenvectors are the columns of v, each signed so
// that its entry of largest magnitude is positive (a canonical choice, so the
// result does not depend on the rotation order's sign conventions).
// Internal if the sweeps do not converge.
absl::Status SymmetricEigen(const double* a, int d, double* w, double* v);

// x <- l^-T x for lower-triangular l (back substitution on l^T), applied to
// each of the `cols` columns of the d x cols matrix x.
void SolveLowerTransposed(const double* l, int d, double* x, int cols);

}  // namespace linalg
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_LINALG_H_
