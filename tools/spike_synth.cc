#include "tools/spike_synth.h"

#include <cmath>
#include <random>

namespace driftkv {
namespace {

class Normal {
 public:
  explicit Normal(uint64_t seed) : rng_(seed) {}
  double operator()() {
    if (has_) {
      has_ = false;
      return next_;
    }
    const double u1 = (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    next_ = r * std::sin(a);
    has_ = true;
    return r * std::cos(a);
  }
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 rng_;
  bool has_ = false;
  double next_ = 0.0;
};

}  // namespace

SpikeCase MakeSpikeCase(const SpikeOptions& o) {
  Normal normal(o.seed);
  const int d = o.head_dim;
  const int64_t n = static_cast<int64_t>(o.kv_heads) * d;
  SpikeCase c;
  c.keys.resize(o.tokens * n);
  c.values.resize(o.tokens * n);
  // Channel scales decaying from 2 to 0.5: an anisotropic (RoPE-like) bulk.
  std::vector<double> scale(d);
  for (int j = 0; j < d; ++j) scale[j] = 2.0 * std::pow(0.25, static_cast<double>(j) / (d - 1));
  for (int64_t t = 0; t < o.tokens; ++t) {
    for (int h = 0; h < o.kv_heads; ++h) {
      float* k = c.keys.data() + t * n + h * d;
      float* v = c.values.data() + t * n + h * d;
      for (int j = 0; j < d; ++j) {
        k[j] = static_cast<float>(scale[j] * normal());
        v[j] = static_cast<float>(normal());
      }
      if (normal.Uniform() < o.spike_probability) k[0] += static_cast<float>(o.spike);
    }
  }
  c.queries.resize(o.query_tokens * o.q_heads * d);
  for (int64_t i = 0; i < o.query_tokens; ++i) {
    for (int g = 0; g < o.q_heads; ++g) {
      float* q = c.queries.data() + (i * o.q_heads + g) * d;
      for (int j = 0; j < d; ++j) q[j] = static_cast<float>(0.5 * normal());
      q[0] += static_cast<float>(o.query_read + 0.5 * normal());
    }
  }
  return c;
}

}  // namespace driftkv
