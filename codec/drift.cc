#include "codec/drift.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace driftkv {
namespace {

// Positions grouped into equal-width buckets (a counting sort), so that
// "how many u_i exceed b" costs one bucket scan instead of a pass over all n.
// Exact: bucket(v) is monotone in v, so every value in a higher bucket than
// b's is > b and every value in a lower bucket is < b.
class PositionIndex {
 public:
  PositionIndex(const float* u, int n) : n_(n) {
    float lo = u[0], hi = u[0];
    for (int i = 1; i < n; ++i) {
      lo = std::min(lo, u[i]);
      hi = std::max(hi, u[i]);
    }
    lo_ = lo;
    buckets_ = n;
    inv_width_ = hi > lo ? static_cast<float>(buckets_ / (static_cast<double>(hi) - lo)) : 0.0f;
    start_.assign(buckets_ + 1, 0);
    bucket_of_.resize(n);
    for (int i = 0; i < n; ++i) {
      bucket_of_[i] = Bucket(u[i]);
      ++start_[bucket_of_[i] + 1];
    }
    for (int k = 0; k < buckets_; ++k) start_[k + 1] += start_[k];
    grouped_.resize(n);
    fill_.assign(start_.begin(), start_.end() - 1);
    for (int i = 0; i < n; ++i) grouped_[fill_[bucket_of_[i]]++] = u[i];
  }

  int CountAbove(float b) const {
    const float pos = (b - lo_) * inv_width_;
    if (!(pos >= 0.0f)) return b < lo_ ? n_ : CountAboveScan(b);
    if (pos >= static_cast<float>(buckets_)) return CountAboveScan(b);
    const int k = Bucket(b);
    int count = n_ - start_[k + 1];
    for (int i = start_[k]; i < start_[k + 1]; ++i) count += grouped_[i] > b;
    return count;
  }

 private:
  int Bucket(float v) const {
    const float pos = (v - lo_) * inv_width_;
    const int k = pos > 0.0f ? static_cast<int>(pos) : 0;
    return std::min(k, buckets_ - 1);
  }
  // Rare: b at or beyond the top bucket (or inv_width_ = 0); scan that bucket.
  int CountAboveScan(float b) const {
    int count = 0;
    for (int i = start_[buckets_ - 1]; i < n_; ++i) count += grouped_[i] > b;
    if (inv_width_ == 0.0f) {
      count = 0;
      for (int i = 0; i < n_; ++i) count += grouped_[i] > b;
    }
    return count;
  }

  int n_;
  int buckets_;
  float lo_;
  float inv_width_;
  std::vector<int> start_, fill_, bucket_of_;
  std::vector<float> grouped_;
};

// Sum of costs of assignment `a`: interval j holds the positions above
// break j-1 and not above break j.
double AssignmentCost(const Assignment& a, const PositionIndex& index, int n, const float* cost) {
  int above_prev = n;
  double total = 0.0;
  for (int j = 0; j < a.count; ++j) {
    const int above = j + 1 < a.count ? index.CountAbove(a.breaks[j]) : 0;
    total += static_cast<double>(above_prev - above) * cost[a.level[j]];
    above_prev = above;
  }
  return total;
}

void Apply(const Assignment& a, const float* u, int n, uint8_t* symbols) {
  for (int i = 0; i < n; ++i) symbols[i] = static_cast<uint8_t>(a.Assign(u[i]));
}

// The lambda -> infinity limit: only the cheapest levels remain.
Assignment CheapestAssignment(const float* cost, int levels) {
  float min_cost = cost[0];
  for (int m = 1; m < levels; ++m) min_cost = std::min(min_cost, cost[m]);
  float masked[kMaxLevelsForDrift];
  for (int m = 0; m < levels; ++m) {
    masked[m] = cost[m] == min_cost ? 0.0f : std::numeric_limits<float>::infinity();
  }
  return BuildAssignment(masked, levels, 1.0);
}

}  // namespace

Assignment BuildAssignment(const float* cost, int levels, double lambda) {
  // Minimise (u - m)^2 + lambda c_m over m; dropping u^2 leaves lines
  // y = -2 m u + (m^2 + lambda c_m) with slopes falling as m grows, so the
  // lower envelope visits levels in increasing order. Lines of infinite
  // intercept never appear on it.
  Assignment a;
  double start[kMaxLevelsForDrift];  // u where stack[j] becomes optimal
  double intercept[kMaxLevelsForDrift];
  for (int m = 0; m < levels; ++m) {
    if (std::isinf(cost[m])) continue;
    const double b = static_cast<double>(m) * m + lambda * cost[m];
    double x = -std::numeric_limits<double>::infinity();
    while (a.count > 0) {
      const int top = a.level[a.count - 1];
      x = (b - intercept[a.count - 1]) / (2.0 * (m - top));
      if (a.count >= 2 && x <= start[a.count - 1]) {
        --a.count;  // `top` is never strictly better than both neighbours
        continue;
      }
      break;
    }
    a.level[a.count] = m;
    intercept[a.count] = b;
    start[a.count] = x;
    ++a.count;
  }
  for (int j = 1; j < a.count; ++j) a.breaks[j - 1] = static_cast<float>(start[j]);
  return a;
}

DriftResult Drift(const float* u, int n, const float* cost, int levels, double budget_bits, uint8_t* symbols) {
  DriftResult result;
  const PositionIndex index(u, n);
  const Assignment nearest = BuildAssignment(cost, levels, 0.0);
  const double nearest_cost = AssignmentCost(nearest, index, n, cost);
  if (nearest_cost <= budget_bits) {
    Apply(nearest, u, n, symbols);
    result.cost_bits = nearest_cost;
    return result;
  }
  // Distortion range over all (i, m), in grid units.
  double max_d = 0.0, min_d = std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    const double lo = u[i], hi = u[i] - (levels - 1);
    max_d = std::max(max_d, std::max(lo * lo, hi * hi));
    const double r = u[i] - nearest.Assign(u[i]);
    min_d = std::min(min_d, r * r);
  }
  double hi = std::log2(8.0 * std::max(max_d - min_d, 1e-30));
  double lo = hi - kDriftBracketOctaves;
  // Algorithm 1 assumes the top of the bracket is feasible. Costs of nearly
  // equal levels can make it not so; widen until it is (or give up and take
  // the limit).
  int widen = 0;
  Assignment top = BuildAssignment(cost, levels, std::exp2(hi));
  double top_cost = AssignmentCost(top, index, n, cost);
  while (top_cost > budget_bits && widen < 16) {
    lo = hi;
    hi += 8.0;
    ++widen;
    top = BuildAssignment(cost, levels, std::exp2(hi));
    top_cost = AssignmentCost(top, index, n, cost);
  }
  if (top_cost > budget_bits) {
    top = CheapestAssignment(cost, levels);
    Apply(top, u, n, symbols);
    result.lambda = std::numeric_limits<double>::infinity();
    result.cost_bits = AssignmentCost(top, index, n, cost);
    return result;
  }
  for (int step = 0; step < kDriftBisectionSteps; ++step) {
    const double mu = 0.5 * (lo + hi);
    const Assignment a = BuildAssignment(cost, levels, std::exp2(mu));
    const double c = AssignmentCost(a, index, n, cost);
    if (c <= budget_bits) {
      hi = mu;
      top = a;
      top_cost = c;
    } else {
      lo = mu;
    }
  }
  Apply(top, u, n, symbols);
  result.lambda = std::exp2(hi);
  result.cost_bits = top_cost;
  return result;
}

Assignment CheapestLevels(const float* cost, int levels) {
  return CheapestAssignment(cost, levels);
}

}  // namespace driftkv
