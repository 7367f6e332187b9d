#include "codec/baselines/fp8_codec.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"

namespace driftkv {
namespace baselines {
namespace {

constexpr int kMaxFiniteCode = 0x7e;  // 448; 0x7f is NaN

// Values of the positive codes 0..0x7e, ascending (the encoding is monotone).
const std::array<float, kMaxFiniteCode + 1>& PositiveValues() {
  static const std::array<float, kMaxFiniteCode + 1> table = [] {
    std::array<float, kMaxFiniteCode + 1> t{};
    for (int c = 0; c <= kMaxFiniteCode; ++c) t[c] = E4M3ToFloat(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace

float E4M3ToFloat(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 0xf && mantissa == 7) return NAN;
  const float magnitude =
      exponent == 0 ? std::ldexp(mantissa / 8.0f, -6) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return (code & 0x80) ? -magnitude : magnitude;
}

uint8_t FloatToE4M3(float x) {
  const auto& t = PositiveValues();
  const float a = std::fabs(x);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (a >= kE4M3Max) return sign | kMaxFiniteCode;
  const int hi = static_cast<int>(std::upper_bound(t.begin(), t.end(), a) - t.begin());
  const int lo = hi - 1;  // t[lo] <= a < t[hi]
  const float dlo = a - t[lo], dhi = t[hi] - a;
  int c = dlo < dhi ? lo : hi;
  if (dlo == dhi) c = (lo & 1) ? hi : lo;  // tie: the even mantissa
  return sign | static_cast<uint8_t>(c);
}

absl::StatusOr<std::unique_ptr<KvCodec>> Fp8Codec::Create(int kv_heads, int head_dim) {
  if (kv_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("fp8: shape ", kv_heads, " x ", head_dim, " must be positive"));
  }
  return std::unique_ptr<KvCodec>(new Fp8Codec(kv_heads, head_dim));
}

void Fp8Codec::EncodeStream(bool /*key*/, const float* x, uint8_t* record, CodecScratch* /*scratch*/) const {
  const int n = this->n();
  float max_abs = 0.0f;
  for (int i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
  const float scale = max_abs / kE4M3Max;
  StoreF32(record, scale);
  // x / scale may round a hair above 448; FloatToE4M3 saturates.
  for (int i = 0; i < n; ++i) record[4 + i] = scale > 0.0f ? FloatToE4M3(x[i] / scale) : 0;
}

absl::Status Fp8Codec::DecodeStream(bool /*key*/, const uint8_t* record, float* x, CodecScratch* /*scratch*/) const {
  const int n = this->n();
  float scale = LoadF32(record);
  absl::Status st;
  if (!std::isfinite(scale) || scale < 0.0f) {
    st = absl::DataLossError(absl::StrCat("fp8 record: scale ", scale));
    scale = 0.0f;
  }
  for (int i = 0; i < n; ++i) {
    const float v = E4M3ToFloat(record[4 + i]);
    if (std::isnan(v)) {
      if (st.ok()) st = absl::DataLossError(absl::StrCat("fp8 record: NaN code at position ", i));
      x[i] = 0.0f;
    } else {
      x[i] = scale * v;
    }
  }
  return st;
}

}  // namespace baselines
}  // namespace driftkv
