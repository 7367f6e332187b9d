#include "eval/wush_eval.h"

#include <algorithm>
#include <cmath>

#include "codec/encoded_layer.h"

namespace driftkv {

void AblationErrors::Add(const AblationErrors& o) {
  for (int m = 0; m < kModes; ++m) {
    attn_num[m] += o.attn_num[m];
    attn_den[m] += o.attn_den[m];
    module_num[m] += o.module_num[m];
    module_den[m] += o.module_den[m];
  }
  key_bytes += o.key_bytes;
  value_bytes += o.value_bytes;
  values += o.values;
}

double AblationErrors::attention(int m) const {
  return attn_den[m] > 0 ? std::sqrt(attn_num[m] / attn_den[m]) : 0;
}
double AblationErrors::module(int m) const {
  return module_den[m] > 0 ? std::sqrt(module_num[m] / module_den[m]) : 0;
}

std::vector<float> AttentionOutputs(const AblationInput& in, const float* keys, const float* values) {
  const int d = in.head_dim, kvh = in.kv_heads, group = in.q_heads / in.kv_heads;
  const int64_t T = in.tokens, n = static_cast<int64_t>(kvh) * d;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  // Keys transposed per head, [kv_heads][d][T], so that the score loop runs
  // along tokens and vectorises.
  std::vector<float> kt(static_cast<size_t>(kvh) * d * T);
  for (int64_t t = 0; t < T; ++t) {
    for (int h = 0; h < kvh; ++h) {
      for (int j = 0; j < d; ++j) kt[(static_cast<size_t>(h) * d + j) * T + t] = keys[t * n + h * d + j];
    }
  }
  std::vector<float> out(static_cast<size_t>(in.query_tokens) * in.q_heads * d, 0.0f), s(T);
  for (int64_t i = 0; i < in.query_tokens; ++i) {
    const int64_t len = T - in.query_tokens + i + 1;
    for (int g = 0; g < in.q_heads; ++g) {
      const int h = g / group;
      const float* q = in.queries + (i * in.q_heads + g) * d;
      std::fill(s.begin(), s.begin() + len, 0.0f);
      for (int j = 0; j < d; ++j) {
        const float qj = q[j] * scale;
        const float* row = kt.data() + (static_cast<size_t>(h) * d + j) * T;
        for (int64_t t = 0; t < len; ++t) s[t] += qj * row[t];
      }
      const float m = *std::max_element(s.begin(), s.begin() + len);
      double denom = 0.0;
      for (int64_t t = 0; t < len; ++t) {
        s[t] = std::exp(s[t] - m);
        denom += s[t];
      }
      float* o = out.data() + (i * in.q_heads + g) * d;
      for (int64_t t = 0; t < len; ++t) {
        const float w = s[t];
        const float* v = values + t * n + h * d;
        for (int j = 0; j < d; ++j) o[j] += w * v[j];
      }
      const float inv = static_cast<float>(1.0 / denom);
      for (int j = 0; j < d; ++j) o[j] *= inv;
    }
  }
  return out;
}

absl::Status MeasureAblation(const KvCodec& codec, const AblationInput& in, const std::vector<float>& reference,
                             AblationErrors* acc) {
  EncodedLayer enc;
  absl::Status st = EncodeLayer(codec, in.keys, in.values, in.tokens, 0, 1, &enc, nullptr);
  if (!st.ok()) return st;
  const size_t size = static_cast<size_t>(in.tokens) * codec.n();
  std::vector<float> khat(size), vhat(size);
  st = DecodeLayer(codec, enc, khat.data(), vhat.data());
  if (!st.ok()) return st;
  acc->key_bytes += enc.key_bytes();
  acc->value_bytes += enc.value_bytes();
  acc->values += static_cast<int64_t>(size);
  const int64_t width = static_cast<int64_t>(in.q_heads) * in.head_dim;
  for (int mode = 0; mode < kModes; ++mode) {
    const std::vector<float> o =
        AttentionOutputs(in, mode == kValuesOnly ? in.keys : khat.data(), mode == kKeysOnly ? in.values : vhat.data());
    for (size_t j = 0; j < o.size(); ++j) {
      const double e = static_cast<double>(reference[j]) - o[j];
      acc->attn_num[mode] += e * e;
      acc->attn_den[mode] += static_cast<double>(reference[j]) * reference[j];
    }
    if (in.wo == nullptr) continue;
    // ||W_O (o - ohat)||^2 and ||W_O o||^2, per query; float dots over
    // q_heads * head_dim (contiguous, vectorised), summed in double.
    std::vector<float> diff(width);
    for (int64_t i = 0; i < in.query_tokens; ++i) {
      const float* r = reference.data() + i * width;
      const float* a = o.data() + i * width;
      for (int64_t j = 0; j < width; ++j) diff[j] = r[j] - a[j];
      for (int64_t e = 0; e < in.hidden; ++e) {
        const float* w = in.wo + e * width;
        float yr = 0.0f, yd = 0.0f;
        for (int64_t j = 0; j < width; ++j) {
          yr += w[j] * r[j];
          yd += w[j] * diff[j];
        }
        acc->module_num[mode] += static_cast<double>(yd) * yd;
        acc->module_den[mode] += static_cast<double>(yr) * yr;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace driftkv
