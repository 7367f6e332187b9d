#include "codec/baselines/turbo_codec.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"
#include "wire/half.h"

namespace driftkv {
namespace baselines {
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int kLloydIterations = 500;

double Phi(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}
double Pdf(double x) {
  return std::exp(-0.5 * x * x) / std::sqrt(2.0 * kPi);
}

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Box-Muller on 53-bit uniforms in (0, 1).
double Gaussian(uint64_t* state) {
  const double u1 = ((SplitMix64(state) >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = ((SplitMix64(state) >> 11) + 0.5) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2);
}

}  // namespace

std::vector<double> GaussianLloydMax(int levels) {
  std::vector<double> c(levels);
  for (int i = 0; i < levels; ++i) c[i] = -2.0 + 4.0 * (i + 0.5) / levels;
  std::vector<double> b(levels + 1);
  for (int it = 0; it < kLloydIterations; ++it) {
    b[0] = -INFINITY;
    b[levels] = INFINITY;
    for (int i = 1; i < levels; ++i) b[i] = 0.5 * (c[i - 1] + c[i]);
    // Centroid of N(0,1) on [a, b): (pdf(a) - pdf(b)) / (Phi(b) - Phi(a)).
    for (int i = 0; i < levels; ++i) {
      const double pa = std::isinf(b[i]) ? 0.0 : Pdf(b[i]);
      const double pb = std::isinf(b[i + 1]) ? 0.0 : Pdf(b[i + 1]);
      const double mass = Phi(b[i + 1]) - Phi(b[i]);
      if (mass > 0.0) c[i] = (pa - pb) / mass;
    }
  }
  return c;
}

std::vector<float> RandomOrthogonal(int dim, uint64_t seed) {
  std::vector<double> a(static_cast<size_t>(dim) * dim);
  uint64_t state = seed;
  for (double& x : a) x = Gaussian(&state);
  // Modified Gram-Schmidt over the rows.
  for (int i = 0; i < dim; ++i) {
    double* ri = &a[static_cast<size_t>(i) * dim];
    for (int j = 0; j < i; ++j) {
      const double* rj = &a[static_cast<size_t>(j) * dim];
      double dot = 0.0;
      for (int k = 0; k < dim; ++k) dot += ri[k] * rj[k];
      for (int k = 0; k < dim; ++k) ri[k] -= dot * rj[k];
    }
    double norm = 0.0;
    for (int k = 0; k < dim; ++k) norm += ri[k] * ri[k];
    norm = std::sqrt(norm);
    for (int k = 0; k < dim; ++k) ri[k] /= norm;
  }
  return std::vector<float>(a.begin(), a.end());
}

absl::StatusOr<std::unique_ptr<KvCodec>> TurboCodec::Create(int kv_heads, int head_dim, int bits, int group,
                                                            uint64_t seed) {
  if (kv_heads < 1 || head_dim < 1 || head_dim > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("turbo: shape ", kv_heads, " x ", head_dim, " out of range"));
  }
  if (bits < 1 || bits > 4) {
    return absl::InvalidArgumentError(absl::StrCat("turbo: bits ", bits, " out of range [1, 4]"));
  }
  GroupSpec v;
  v.n = kv_heads * head_dim;
  v.group = group;
  v.bits = bits;
  absl::Status st = ValidateGroupSpec(v, "turbo");
  if (!st.ok()) return st;
  return std::unique_ptr<KvCodec>(new TurboCodec(kv_heads, head_dim, bits, v, seed));
}

TurboCodec::TurboCodec(int kv_heads, int head_dim, int bits, const GroupSpec& values, uint64_t seed)
    : TokenwiseCodec("turbo", kv_heads, head_dim, /*fp16_metadata=*/true),
      bits_(bits),
      values_(values),
      rotation_(RandomOrthogonal(head_dim, seed)) {
  const std::vector<double> c = GaussianLloydMax(1 << bits);
  centroids_.assign(c.begin(), c.end());
  for (size_t i = 1; i < c.size(); ++i) bounds_.push_back(static_cast<float>(0.5 * (c[i - 1] + c[i])));
}

size_t TurboCodec::key_stride() const {
  return 2 * static_cast<size_t>(kv_heads()) + PackedBytes(n(), bits_);
}

void TurboCodec::Rotate(const float* x, float* y, bool forward) const {
  const int d = head_dim();
  for (int h = 0; h < kv_heads(); ++h) {
    const float* xh = x + static_cast<size_t>(h) * d;
    float* yh = y + static_cast<size_t>(h) * d;
    for (int i = 0; i < d; ++i) {
      double acc = 0.0;
      for (int k = 0; k < d; ++k) {
        acc += static_cast<double>(forward ? rotation_[static_cast<size_t>(i) * d + k]
                                           : rotation_[static_cast<size_t>(k) * d + i]) *
               xh[k];
      }
      yh[i] = static_cast<float>(acc);
    }
  }
}

void TurboCodec::EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const {
  const int n = this->n(), d = head_dim();
  scratch->row.resize(n);
  scratch->symbols.resize(n);
  float* y = scratch->row.data();
  uint8_t* codes = scratch->symbols.data();
  Rotate(x, y, /*forward=*/true);
  if (!key) {
    EncodeGroups(values_, y, record, codes, &scratch->rows);
    return;
  }
  for (int h = 0; h < kv_heads(); ++h) {
    float* yh = y + static_cast<size_t>(h) * d;
    double norm2 = 0.0;
    for (int i = 0; i < d; ++i) norm2 += static_cast<double>(yh[i]) * yh[i];
    // The stored (fp16) norm is the one the decoder scales by.
    const float norm = RoundToHalf(static_cast<float>(std::min<double>(std::sqrt(norm2), kHalfMax)));
    StoreU16(record + 2 * h, FloatToHalf(norm));
    const float inv = norm > 0.0f ? static_cast<float>(std::sqrt(static_cast<double>(d)) / norm) : 0.0f;
    for (int i = 0; i < d; ++i) {
      codes[h * d + i] =
          static_cast<uint8_t>(std::upper_bound(bounds_.begin(), bounds_.end(), yh[i] * inv) - bounds_.begin());
    }
  }
  PackBits(codes, n, bits_, record + 2 * kv_heads());
}

absl::Status TurboCodec::DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const {
  const int n = this->n(), d = head_dim();
  scratch->row.resize(n);
  scratch->symbols.resize(n);
  float* y = scratch->row.data();
  uint8_t* codes = scratch->symbols.data();
  absl::Status st;
  if (!key) {
    st = DecodeGroups(values_, record, y, codes);
  } else {
    UnpackBits(record + 2 * kv_heads(), n, bits_, codes);
    for (int h = 0; h < kv_heads(); ++h) {
      float norm = HalfToFloat(LoadU16(record + 2 * h));
      if (!std::isfinite(norm) || norm < 0.0f) {
        st.Update(absl::DataLossError(absl::StrCat("turbo key record: norm of head ", h, " is ", norm)));
        norm = 0.0f;
      }
      const float s = static_cast<float>(norm / std::sqrt(static_cast<double>(d)));
      for (int i = 0; i < d; ++i) y[h * d + i] = s * centroids_[codes[h * d + i]];
    }
  }
  Rotate(y, x, /*forward=*/false);
  return st;
}

}  // namespace baselines
}  // namespace driftkv
