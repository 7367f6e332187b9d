// The calibration-free probability model of D-Quant (paper Sec. 4.2, 4.4).
//
// After rotation (and key mean removal) the n values of a stream behave like
// n i.i.d. standard normals. The token-wise min-max grid maps [min, max] onto
// levels 0..M-1, and for n normals the extremes sit near -a_n and +a_n with
// a_n = E[max of n standard normals] (an order statistic). Level m therefore
// receives the normal mass of the interval whose grid position lies in
// [m - 1/2, m + 1/2): p_m = Phi(t_{m+1}) - Phi(t_m), t_m = a_n (2m - 1 - (M - 1)) / (M - 1),
// the two outer intervals extended to infinity. Drift moves symbols towards
// the cheap centre, so the coded table is sharpened, p'_m ~ p_m^alpha, and
// quantised to integer frequencies summing to 256 (each >= 1).
//
// Everything is computed in double precision with a fixed quadrature, so the
// same (n, M, alpha) gives the same frequencies on every machine of a build.
// The pool format stores the frequencies themselves, so readers never
// recompute them.
#ifndef DRIFTKV_CODEC_PROB_MODEL_H_
#define DRIFTKV_CODEC_PROB_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace driftkv {

// E[max of n i.i.d. standard normals]; n = 1 is treated as n = 2 (a single
// value has no spread to model; such streams are constant anyway).
double ExpectedNormalMax(int n);

// Level probabilities p_m (unsharpened) for n values and M levels.
std::vector<double> LevelProbabilities(int n, int levels);

// Sharpens with alpha and quantises to 8-bit frequencies: f_m >= 1, sum 256.
// Rounds, then repairs the sum one unit at a time, each time choosing the
// level whose change costs the least expected code length (ties: lowest m).
absl::Status ModelFrequencies(int n, int levels, double alpha, uint16_t* freq);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_PROB_MODEL_H_
