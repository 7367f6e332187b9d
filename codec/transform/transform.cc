#include "codec/transform/transform.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace {

// out = m x (transpose = false) or m^T x, for one d-vector. Both run as
// axpy over rows of a row-major matrix (`rows_of` = m^T for m x, m itself
// for m^T x), so the inner loop is contiguous and vectorises; float sums of
// d terms, whose rounding (~d * 2^-24 relative) is far below any codec's
// error. x may alias out: it is copied first.
void MatVec(const float* rows_of, const float* x, int d, float* out) {
  float in[4096], acc[4096];
  for (int j = 0; j < d; ++j) in[j] = x[j], acc[j] = 0.0f;
  for (int j = 0; j < d; ++j) {
    const float* row = rows_of + static_cast<size_t>(j) * d;
    const float xj = in[j];
    for (int i = 0; i < d; ++i) acc[i] += row[i] * xj;
  }
  for (int i = 0; i < d; ++i) out[i] = acc[i];
}

}  // namespace

absl::StatusOr<TransformKind> ParseTransformKind(const std::string& name) {
  if (name == "identity") return TransformKind::kIdentity;
  if (name == "hadamard") return TransformKind::kHadamard;
  if (name == "wush") return TransformKind::kWush;
  return absl::InvalidArgumentError(absl::StrCat("transform \"", name, "\" unknown; use identity, hadamard or wush"));
}

absl::StatusOr<LayerTransform> LayerTransform::FromSet(const TransformSet& set, int layer) {
  if (layer < 0 || layer >= set.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " out of range [0, ", set.layers, ") of the transforms file"));
  }
  if (set.head_dim > 4096) return absl::InvalidArgumentError("head_dim above 4096");
  LayerTransform t;
  t.kv_heads_ = set.kv_heads;
  t.head_dim_ = set.head_dim;
  // Stored transposed: MatVec(m^T rows) computes m x.
  const int d = set.head_dim;
  t.data_.resize(static_cast<size_t>(set.kv_heads) * 4 * set.matrix_floats());
  for (int h = 0; h < set.kv_heads; ++h) {
    for (int m = 0; m < 4; ++m) {
      const float* src = set.matrix(layer, h, static_cast<Mat>(m));
      float* dst = t.data_.data() + (static_cast<size_t>(h) * 4 + m) * set.matrix_floats();
      for (int i = 0; i < d; ++i) {
        for (int j = 0; j < d; ++j) dst[j * d + i] = src[i * d + j];
      }
    }
  }
  return t;
}

void LayerTransform::Apply(Mat m, const float* x, int64_t tokens, float* out) const {
  const int d = head_dim_;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int h = 0; h < kv_heads_; ++h) {
      const size_t off = (static_cast<size_t>(t) * kv_heads_ + h) * d;
      MatVec(matrix(h, m), x + off, d, out + off);
    }
  }
}

void LayerTransform::Queries(const float* q, int q_heads, float* out) const {
  const int group = q_heads / kv_heads_;
  // T_K^-T q: data_ holds (T_K^-1)^T, whose transpose's rows are T_K^-1's.
  std::vector<float> inv(static_cast<size_t>(head_dim_) * head_dim_);
  for (int h = 0; h < q_heads; ++h) {
    if (h % group == 0) {
      const float* t = matrix(h / group, Mat::kKeyInverse);
      for (int i = 0; i < head_dim_; ++i) {
        for (int j = 0; j < head_dim_; ++j) inv[j * head_dim_ + i] = t[i * head_dim_ + j];
      }
    }
    MatVec(inv.data(), q + h * head_dim_, head_dim_, out + h * head_dim_);
  }
}

void LayerTransform::Outputs(const float* o, int q_heads, float* out) const {
  const int group = q_heads / kv_heads_;
  for (int h = 0; h < q_heads; ++h) {
    MatVec(matrix(h / group, Mat::kValueInverse), o + h * head_dim_, head_dim_, out + h * head_dim_);
  }
}

absl::StatusOr<std::unique_ptr<TransformedKvCodec>> TransformedKvCodec::Create(std::unique_ptr<KvCodec> inner,
                                                                               LayerTransform transform,
                                                                               bool values_folded) {
  if (inner == nullptr) return absl::InvalidArgumentError("no inner codec");
  if (inner->kv_heads() != transform.kv_heads() || inner->head_dim() != transform.head_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("transforms are for ", transform.kv_heads(), " kv heads x ",
                                                   transform.head_dim(), ", the codec has ", inner->kv_heads(), " x ",
                                                   inner->head_dim()));
  }
  return std::unique_ptr<TransformedKvCodec>(
      new TransformedKvCodec(std::move(inner), std::move(transform), values_folded));
}

absl::Status TransformedKvCodec::EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                                             uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                                             CodecStats* stats) const {
  // The inner codec owns `scratch`; the transformed block lives here.
  const size_t size = static_cast<size_t>(count) * n();
  std::vector<float> k(size), v;
  transform_.Apply(Mat::kKey, keys, count, k.data());
  if (!values_folded_) {
    v.resize(size);
    transform_.Apply(Mat::kValue, values, count, v.data());
  }
  return inner_->EncodeBlock(k.data(), values_folded_ ? values : v.data(), count, key_records, value_records, side,
                             scratch, stats);
}

absl::Status TransformedKvCodec::DecodeBlock(const uint8_t* key_records, const uint8_t* value_records,
                                             const uint8_t* side, int count, float* keys, float* values,
                                             CodecScratch* scratch) const {
  absl::Status st = inner_->DecodeBlock(key_records, value_records, side, count, keys, values, scratch);
  transform_.Apply(Mat::kKeyInverse, keys, count, keys);
  if (!values_folded_) transform_.Apply(Mat::kValueInverse, values, count, values);
  return st;
}

absl::StatusOr<std::unique_ptr<KvCodec>> MakeTransformedCodec(CodecOptions options, TransformKind kind,
                                                              const TransformSet* set, int layer, bool values_folded) {
  options.rotation = kind == TransformKind::kHadamard ? "hadamard" : "identity";
  absl::StatusOr<std::unique_ptr<KvCodec>> inner = MakeKvCodec(options);
  if (!inner.ok() || kind != TransformKind::kWush) return inner;
  if (set == nullptr) return absl::InvalidArgumentError("transform wush needs a transforms file");
  absl::StatusOr<LayerTransform> t = LayerTransform::FromSet(*set, layer);
  if (!t.ok()) return t.status();
  absl::StatusOr<std::unique_ptr<TransformedKvCodec>> c =
      TransformedKvCodec::Create(*std::move(inner), *std::move(t), values_folded);
  if (!c.ok()) return c.status();
  return std::unique_ptr<KvCodec>(std::move(*c));
}

}  // namespace driftkv
