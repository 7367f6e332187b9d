// The final grid refit of a D-Quant stream (codec/stream_codec.h, step 6),
// shared by the CPU encoder and the GPU encoder (kernels/encode.cu) so that
// both take the same decisions from the same sums. nvcc compiles it (its only
// include of the project is codec/host_device.h).
#ifndef DRIFTKV_CODEC_FINAL_GRID_H_
#define DRIFTKV_CODEC_FINAL_GRID_H_

#include <cmath>

#include "codec/host_device.h"

namespace driftkv {

// a * b rounded on its own: nvcc would otherwise fuse a product with the
// following addition (one rounding) where the CPU rounds twice.
DRIFTKV_HOST_DEVICE inline double MulRn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Values of Refit (codec/stream_codec.h) as the kernels pass them.
constexpr int kRefitLeastSquares = 0;
constexpr int kRefitUnbiased = 1;
constexpr int kRefitNormPreserving = 2;

// From the sums over the stream of m, m^2, x, x^2 and x m (symbols m, inputs
// x, n values), the grid (s, o) of `mode` before fp16 rounding; false when
// the step-3 grid should stay: least squares, a degenerate or weakly
// correlated stream (2 Cxm^2 < Cxx Cmm: the unbiased scale would more than
// double the least-squares one), or a grid beyond the fp16 range. The
// centred sums are scaled by n (Cxx = n Sxx) to avoid divisions.
DRIFTKV_HOST_DEVICE inline bool FinalGrid(int mode, int n, double sm, double smm, double sx, double sxx, double sxm,
                                          double* s, double* o) {
  if (mode != kRefitUnbiased && mode != kRefitNormPreserving) return false;
  const double cxx = MulRn(n, sxx) - MulRn(sx, sx);
  const double cmm = MulRn(n, smm) - MulRn(sm, sm);
  const double cxm = MulRn(n, sxm) - MulRn(sx, sm);
  if (!(cxx > 0.0) || !(cmm > 0.0) || !(cxm > 0.0) || !(MulRn(2.0 * cxm, cxm) >= MulRn(cxx, cmm))) {
    return false;
  }
  const double scale = mode == kRefitUnbiased ? cxx / cxm : sqrt(cxx / cmm);
  const double offset = (sx - MulRn(scale, sm)) / n;
  constexpr double kMax = 65504.0;  // the largest fp16
  if (!(scale > 0.0 && scale <= kMax) || !(offset >= -kMax && offset <= kMax)) return false;
  *s = scale;
  *o = offset;
  return true;
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_FINAL_GRID_H_
