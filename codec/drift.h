// Drift: the length-constrained symbol assignment of D-Quant (paper Sec. 4.3,
// Algorithm 1).
//
// Given grid positions u_i = (x_i - o) / s of a stream, level costs r_m (bits)
// and a budget B, find m minimising sum (u_i - m)^2 subject to
// sum r_{m_i} <= B. For a multiplier lambda the Lagrangian
// sum (u_i - m_i)^2 + lambda r_{m_i} separates per value, and lambda is found
// by bisection over log2(lambda) (12 steps over a 40-octave bracket).
//
// Working in grid units instead of the paper's D = (x - o - s m)^2 divides all
// distortions by s^2, which only shifts log2(lambda); the bracket is placed
// relative to the distortion range exactly as in Algorithm 1, so the
// bisection visits the same relative points.
//
// Fast path: for fixed lambda the parabolas (u - m)^2 + lambda r_m share their
// curvature, so the argmin over m is a monotone step function of u. Its
// breakpoints (a lower envelope of M lines, computed in O(M)) turn each
// value's assignment into a handful of comparisons instead of M evaluations.
#ifndef DRIFTKV_CODEC_DRIFT_H_
#define DRIFTKV_CODEC_DRIFT_H_

#include <cmath>
#include <cstdint>

#include "codec/format_constants.h"

namespace driftkv {

// kDriftBisectionSteps and kDriftBracketOctaves: codec/format_constants.h.
constexpr int kMaxLevelsForDrift = kMaxLevels;

// Step function u -> level for one lambda: level[j] on (break[j-1], break[j]].
struct Assignment {
  int count = 0;                      // number of envelope levels
  int level[kMaxLevels] = {};         // increasing level indices
  float breaks[kMaxLevels - 1] = {};  // increasing; count - 1 of them

  int Assign(float u) const {
    int j = 0;
    for (int b = 0; b + 1 < count; ++b) j += u > breaks[b];
    return level[j];
  }
};

// The argmin_m (u - m)^2 + lambda * cost[m] step function (lambda >= 0).
// Ties go to the lower level.
Assignment BuildAssignment(const float* cost, int levels, double lambda);

struct DriftResult {
  double lambda = 0.0;     // multiplier used (0 = plain rounding)
  double cost_bits = 0.0;  // sum of ideal costs of the assignment
};

// Assigns symbols[0..n) for positions u[0..n). Returns the assignment of the
// bracket end that satisfies the budget (Algorithm 1, line 17). If plain
// nearest rounding already fits, returns it without bisecting. If even the
// bracket end does not fit, the bracket is widened; the limit lambda -> inf
// assigns every value to its nearest cheapest level, which the caller must
// have checked fits.
DriftResult Drift(const float* u, int n, const float* cost, int levels, double budget_bits, uint8_t* symbols);

// The lambda -> infinity limit: each position goes to its nearest level
// among those of minimum cost.
Assignment CheapestLevels(const float* cost, int levels);

// Nearest level of grid position u, clamped to [0, M-1]; ties and NaN go to
// the lower level. Equals BuildAssignment(cost, M, 0).Assign(u).
inline int NearestLevel(float u, int levels) {
  if (!(u > 0.5f)) return 0;
  if (u >= static_cast<float>(levels - 1)) return levels - 1;
  return static_cast<int>(std::ceil(u - 0.5f));
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_DRIFT_H_
