#include "eval/synthetic_kv.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kRopeTheta = 10000.0;

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return (static_cast<double>(gen_() >> 11) + 0.5) * 0x1.0p-53; }
  double UniformFromZero() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Normal() { return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(2.0 * kPi * Uniform()); }
  // Box-Muller with both outputs used (cos, then sin): kind "spike".
  double NormalPaired() {
    if (has_pair_) {
      has_pair_ = false;
      return pair_;
    }
    const double u1 = Uniform();
    const double u2 = UniformFromZero();
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * kPi * u2;
    pair_ = r * std::sin(a);
    has_pair_ = true;
    return r * std::cos(a);
  }
  // Marsaglia-Tsang; shape >= 1 (dof > 2 is validated).
  double Gamma(double shape) {
    const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = Normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = Uniform();
      if (std::log(u) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
    }
  }
  // Student-t as N / sqrt(chi2_dof / dof), chi2_dof / dof = Gamma(dof/2) / (dof/2).
  double UnitStudentT(double dof) {
    const double t = Normal() / std::sqrt(Gamma(dof / 2.0) / (dof / 2.0));
    return t * std::sqrt((dof - 2.0) / dof);  // unit variance
  }

 private:
  std::mt19937_64 gen_;
  bool has_pair_ = false;
  double pair_ = 0.0;
};

// Rotate-half RoPE of one head in place: pairs (i, i + d/2), frequency
// theta^(-2i/d); pair 0 has the highest frequency, pair d/2 - 1 the lowest.
void Rope(float* x, int d, int64_t pos) {
  const int half = d / 2;
  for (int i = 0; i < half; ++i) {
    const double a = pos * std::pow(kRopeTheta, -2.0 * i / d);
    const double c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + half];
    x[i] = static_cast<float>(x0 * c - x1 * s);
    x[i + half] = static_cast<float>(x0 * s + x1 * c);
  }
}

void GenerateLayer(const SynthParams& p, int layer, SynthKv* out) {
  const int h = p.kv_heads, d = p.head_dim, n = h * d, qh = out->q_heads;
  Rng rng(p.seed + layer);
  const bool iid = p.kind == "iid";
  // data() + offset, not &v[offset]: with query_tokens 0 `queries` is
  // empty, and indexing an empty vector is undefined (UBSan reports it).
  float* keys = out->keys.data() + static_cast<size_t>(layer) * p.tokens * n;
  float* values = out->values.data() + static_cast<size_t>(layer) * p.tokens * n;
  float* queries = out->queries.data() + static_cast<size_t>(layer) * p.query_tokens * qh * d;
  if (iid) {
    for (int64_t i = 0; i < static_cast<int64_t>(p.tokens) * n; ++i) keys[i] = rng.Normal();
    for (int64_t i = 0; i < static_cast<int64_t>(p.tokens) * n; ++i) values[i] = rng.Normal();
    for (int64_t i = 0; i < static_cast<int64_t>(p.query_tokens) * qh * d; ++i) queries[i] = rng.Normal();
    return;
  }
  std::vector<double> mu(n), sigma(n), vsigma(n);
  for (int j = 0; j < n; ++j) {
    const int dim = j % d, pair = dim % (d / 2);
    const bool outlier = pair >= d / 2 - p.outlier_channels / 2 - p.outlier_channels % 2;
    const double boost = outlier ? p.outlier_scale : 1.0;
    mu[j] = boost * p.key_mean * rng.Normal();
    sigma[j] = boost * std::exp(p.channel_spread * rng.Normal());
    vsigma[j] = std::exp(p.channel_spread * rng.Normal());
  }
  for (int t = 0; t < p.tokens; ++t) {
    const double gk = t == 0 ? p.sink_scale : std::exp(p.token_norm_sigma * rng.Normal());
    const double gv = t == 0 ? p.sink_scale : std::exp(p.token_norm_sigma * rng.Normal());
    float* k = keys + static_cast<size_t>(t) * n;
    float* v = values + static_cast<size_t>(t) * n;
    for (int j = 0; j < n; ++j) {
      k[j] = static_cast<float>(gk * (mu[j] + sigma[j] * rng.Normal()));
      v[j] = static_cast<float>(gv * vsigma[j] * rng.UnitStudentT(p.value_dof));
    }
    for (int hh = 0; hh < h; ++hh) Rope(k + hh * d, d, t);
  }
  for (int i = 0; i < p.query_tokens; ++i) {
    const int64_t pos = p.tokens - p.query_tokens + i;
    for (int q = 0; q < qh; ++q) {
      const int kvh = q / (qh / h);
      double norm = 0;
      for (int c = 0; c < d; ++c) norm += mu[kvh * d + c] * mu[kvh * d + c];
      const double a = norm > 0 ? p.query_align * std::sqrt(d / norm) : 0.0;
      float* qv = queries + (static_cast<size_t>(i) * qh + q) * d;
      for (int c = 0; c < d; ++c) qv[c] = static_cast<float>(a * mu[kvh * d + c] + rng.Normal());
      Rope(qv, d, pos);
    }
  }
}

}  // namespace

absl::Status ValidateSynth(const SynthParams& p) {
  if (p.kind != "llm" && p.kind != "iid") {
    return absl::InvalidArgumentError(absl::StrCat("kind \"", p.kind, "\" is neither llm nor iid"));
  }
  if (p.layers < 1 || p.tokens < 1 || p.kv_heads < 1 || p.head_dim < 2 || p.head_dim % 2 != 0) {
    return absl::InvalidArgumentError("layers, tokens, kv_heads must be >= 1 and head_dim even");
  }
  if (p.query_tokens < 0 || p.query_tokens > p.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("query_tokens ", p.query_tokens, " out of [0, tokens]"));
  }
  if (p.outlier_channels < 0 || p.outlier_channels > p.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("outlier_channels ", p.outlier_channels, " out of range"));
  }
  if (!(p.value_dof > 2.0)) {
    return absl::InvalidArgumentError(absl::StrCat("value_dof ", p.value_dof, " must exceed 2 (finite variance)"));
  }
  return absl::OkStatus();
}

SynthKv GenerateSynth(const SynthParams& p) {
  SynthKv out;
  out.q_heads = 2 * p.kv_heads;
  const size_t kv = static_cast<size_t>(p.layers) * p.tokens * p.kv_heads * p.head_dim;
  out.keys.resize(kv);
  out.values.resize(kv);
  out.queries.resize(static_cast<size_t>(p.layers) * p.query_tokens * out.q_heads * p.head_dim);
  for (int l = 0; l < p.layers; ++l) GenerateLayer(p, l, &out);
  return out;
}

SynthKv SynthLayer(int tokens, int kv_heads, int head_dim, uint64_t seed) {
  SynthParams p;
  p.layers = 1;
  p.tokens = tokens;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.query_tokens = 0;
  p.seed = seed;
  return GenerateSynth(p);
}

SpikeCase MakeSpikeCase(const SpikeOptions& o) {
  Rng rng(o.seed);
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
        k[j] = static_cast<float>(scale[j] * rng.NormalPaired());
        v[j] = static_cast<float>(rng.NormalPaired());
      }
      if (rng.UniformFromZero() < o.spike_probability) k[0] += static_cast<float>(o.spike);
    }
  }
  c.queries.resize(o.query_tokens * o.q_heads * d);
  for (int64_t i = 0; i < o.query_tokens; ++i) {
    for (int g = 0; g < o.q_heads; ++g) {
      float* q = c.queries.data() + (i * o.q_heads + g) * d;
      for (int j = 0; j < d; ++j) q[j] = static_cast<float>(0.5 * rng.NormalPaired());
      q[0] += static_cast<float>(o.query_read + 0.5 * rng.NormalPaired());
    }
  }
  return c;
}

}  // namespace driftkv
