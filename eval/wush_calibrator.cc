#include "eval/wush_calibrator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"

namespace driftkv {

WushCalibrator::WushCalibrator(int layers, int kv_heads, int q_heads, int head_dim)
    : layers_(layers),
      kv_heads_(kv_heads),
      q_heads_(q_heads),
      head_dim_(head_dim),
      has_wo_(layers, false),
      key_tokens_(layers, 0) {
  HeadStats empty{OuterSum(head_dim), OuterSum(head_dim), OuterSum(head_dim), OuterSum(head_dim)};
  stats_.assign(static_cast<size_t>(layers) * kv_heads, empty);
}

absl::StatusOr<WushCalibrator> WushCalibrator::Create(int layers, int kv_heads, int q_heads, int head_dim) {
  if (layers < 1 || kv_heads < 1 || q_heads < 1 || head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat("shape layers ", layers, ", kv_heads ", kv_heads, ", q_heads ",
                                                   q_heads, ", head_dim ", head_dim, " must be positive"));
  }
  if (q_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", q_heads, " is not a multiple of kv_heads ", kv_heads));
  }
  if (!IsPowerOfTwo(head_dim) || head_dim > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " is not a power of two <= 4096"));
  }
  return WushCalibrator(layers, kv_heads, q_heads, head_dim);
}

absl::Status WushCalibrator::AddLayer(int layer, const float* keys, const float* values, int64_t tokens,
                                      const float* queries, int64_t query_tokens) {
  if (layer < 0 || layer >= layers_) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range [0, ", layers_, ")"));
  }
  if (tokens < 0 || query_tokens < 0 || (query_tokens > 0 && queries == nullptr)) {
    return absl::InvalidArgumentError("negative token count or missing queries");
  }
  const int d = head_dim_, group = q_heads_ / kv_heads_;
  const int64_t kv_stride = static_cast<int64_t>(kv_heads_) * d, q_stride = static_cast<int64_t>(q_heads_) * d;
  for (int h = 0; h < kv_heads_; ++h) {
    HeadStats& s = at(layer, h);
    if (key_center_window_ > 0) {
      std::vector<float> block;
      for (int64_t t0 = 0; t0 < tokens; t0 += key_center_window_) {
        const int64_t count = std::min<int64_t>(key_center_window_, tokens - t0);
        std::vector<double> mean(d, 0.0);
        for (int64_t t = t0; t < t0 + count; ++t) {
          for (int j = 0; j < d; ++j) mean[j] += keys[t * kv_stride + h * d + j];
        }
        block.resize(count * d);
        for (int64_t t = 0; t < count; ++t) {
          for (int j = 0; j < d; ++j) {
            block[t * d + j] = static_cast<float>(keys[(t0 + t) * kv_stride + h * d + j] - mean[j] / count);
          }
        }
        s.key_gram.Add(block.data(), count, d, 1.0);
      }
    } else {
      s.key_gram.Add(keys + h * d, tokens, kv_stride, 1.0);
    }
    s.value_gram.Add(values + h * d, tokens, kv_stride, 1.0);
    for (int g = h * group; query_tokens > 0 && g < (h + 1) * group; ++g) {
      s.key_hessian.Add(queries + g * d, query_tokens, q_stride, 2.0);
    }
  }
  key_tokens_[layer] += tokens;
  return absl::OkStatus();
}

absl::Status WushCalibrator::AddOutputProjection(int layer, const float* wo, int64_t hidden) {
  if (layer < 0 || layer >= layers_) {
    return absl::InvalidArgumentError(absl::StrCat("W_O layer ", layer, " out of range [0, ", layers_, ")"));
  }
  if (hidden < 1) return absl::InvalidArgumentError(absl::StrCat("hidden ", hidden, " must be positive"));
  const int d = head_dim_, group = q_heads_ / kv_heads_;
  const int64_t row = static_cast<int64_t>(q_heads_) * d;
  for (int h = 0; h < kv_heads_; ++h) {
    // Query head g's output o_g meets columns [g d, (g+1) d) of W_O.
    for (int g = h * group; g < (h + 1) * group; ++g) at(layer, h).value_hessian.Add(wo + g * d, hidden, row, 2.0);
  }
  has_wo_[layer] = true;
  return absl::OkStatus();
}

absl::StatusOr<TransformSet> WushCalibrator::Build(double gamma) const {
  TransformSet set;
  set.layers = layers_;
  set.kv_heads = kv_heads_;
  set.head_dim = head_dim_;
  set.gamma = gamma;
  bool all_wo = true;
  for (bool b : has_wo_) all_wo &= b;
  set.flags = all_wo ? kTransformsFlagValueWo : 0;
  set.key_center_window = static_cast<uint32_t>(key_center_window_);
  set.calibration_tokens = key_tokens_[0];
  set.Resize();
  const int d = head_dim_;
  for (int l = 0; l < layers_; ++l) {
    if (has_wo_[l] != all_wo) {
      return absl::InvalidArgumentError(absl::StrCat("W_O given for some layers but not layer ", l));
    }
    for (int h = 0; h < kv_heads_; ++h) {
      const HeadStats& s = stats_[static_cast<size_t>(l) * kv_heads_ + h];
      absl::StatusOr<WushTransform> k = BuildWushTransform(s.key_gram.sum(), s.key_hessian.sum(), d, gamma);
      if (!k.ok()) {
        return absl::Status(k.status().code(),
                            absl::StrCat("layer ", l, " kv head ", h, " keys: ", k.status().message()));
      }
      std::vector<double> identity(static_cast<size_t>(d) * d, 0.0);
      for (int i = 0; i < d; ++i) identity[i * d + i] = 1.0;
      absl::StatusOr<WushTransform> v =
          BuildWushTransform(s.value_gram.sum(), has_wo_[l] ? s.value_hessian.sum() : identity, d, gamma);
      if (!v.ok()) {
        return absl::Status(v.status().code(),
                            absl::StrCat("layer ", l, " kv head ", h, " values: ", v.status().message()));
      }
      const std::vector<double>* src[4] = {&k->t, &k->inv, &v->t, &v->inv};
      for (int m = 0; m < 4; ++m) {
        float* out = set.matrix(l, h, static_cast<Mat>(m));
        for (size_t i = 0; i < src[m]->size(); ++i) out[i] = static_cast<float>((*src[m])[i]);
      }
    }
  }
  return set;
}

}  // namespace driftkv
