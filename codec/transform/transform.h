// The transform stage in front of any KvCodec: "identity",
// "hadamard" (the codecs' own per-head rotation, the default) or "wush"
// (per-(layer, KV head) matrices from a transforms file).
//
// With T_K, T_V of one KV head (codec/transform/wush.h):
//   keys    k' = T_K k      stored;  queries q' = T_K^-T q, so q'.k' = q.k;
//   values  v' = T_V v      stored;  outputs o = T_V^-1 o', since attention
//                                    output is linear in the values.
// TransformedKvCodec applies T before the inner codec's EncodeBlock and the
// inverses after its DecodeBlock, so every KvCodec user (EncodeLayer,
// DecodeLayer, the pool file, eval) sees the model's domain. The inner codec
// is built with rotation "identity": the Hadamard factor is already inside
// T. Attention may instead run in the transformed domain with Queries() and
// Outputs(); both routes give the same numbers up to float rounding.
// If the user folds T_V into the model's v_proj and o_proj weights, the
// value half is skipped (values_folded).
#ifndef DRIFTKV_CODEC_TRANSFORM_TRANSFORM_H_
#define DRIFTKV_CODEC_TRANSFORM_TRANSFORM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/kv_codec.h"
#include "codec/registry.h"
#include "codec/transform/transforms_file.h"

namespace driftkv {

enum class TransformKind { kIdentity, kHadamard, kWush };
absl::StatusOr<TransformKind> ParseTransformKind(const std::string& name);

// The four matrices of every KV head of one layer, float, row-major.
class LayerTransform {
 public:
  // InvalidArgument if `layer` is outside the set.
  static absl::StatusOr<LayerTransform> FromSet(const TransformSet& set, int layer);

  int kv_heads() const { return kv_heads_; }
  int head_dim() const { return head_dim_; }

  // x and out are [tokens][kv_heads][head_dim]; they may alias.
  void Apply(Mat m, const float* x, int64_t tokens, float* out) const;
  // q' = T_K^-T q per query head; q and out are [q_heads][head_dim],
  // q_heads a multiple of kv_heads (query head h reads KV head
  // h / (q_heads / kv_heads)). May alias.
  void Queries(const float* q, int q_heads, float* out) const;
  // o = T_V^-1 o' per query head; same shapes as Queries.
  void Outputs(const float* o, int q_heads, float* out) const;

 private:
  int kv_heads_ = 0, head_dim_ = 0;
  std::vector<float> data_;  // [kv_heads][4][head_dim][head_dim], each transposed
  const float* matrix(int head, Mat m) const {
    return data_.data() + (static_cast<size_t>(head) * 4 + static_cast<int>(m)) * head_dim_ * head_dim_;
  }
};

class TransformedKvCodec : public KvCodec {
 public:
  // `inner` must have been built with rotation "identity" and match the
  // transform's kv_heads and head_dim (InvalidArgument otherwise).
  static absl::StatusOr<std::unique_ptr<TransformedKvCodec>> Create(std::unique_ptr<KvCodec> inner,
                                                                    LayerTransform transform, bool values_folded);

  const KvCodec& inner() const { return *inner_; }
  const LayerTransform& transform() const { return transform_; }
  bool values_folded() const { return values_folded_; }

  std::string name() const override { return inner_->name(); }
  int kv_heads() const override { return inner_->kv_heads(); }
  int head_dim() const override { return inner_->head_dim(); }
  size_t key_stride() const override { return inner_->key_stride(); }
  size_t value_stride() const override { return inner_->value_stride(); }
  int block_tokens() const override { return inner_->block_tokens(); }
  size_t side_stride() const override { return inner_->side_stride(); }

  absl::Status EncodeBlock(const float* keys, const float* values, int count, uint8_t* key_records,
                           uint8_t* value_records, uint8_t* side, CodecScratch* scratch,
                           CodecStats* stats) const override;
  absl::Status DecodeBlock(const uint8_t* key_records, const uint8_t* value_records, const uint8_t* side, int count,
                           float* keys, float* values, CodecScratch* scratch) const override;

 private:
  TransformedKvCodec(std::unique_ptr<KvCodec> inner, LayerTransform t, bool folded)
      : inner_(std::move(inner)), transform_(std::move(t)), values_folded_(folded) {}

  std::unique_ptr<KvCodec> inner_;
  LayerTransform transform_;
  bool values_folded_;
};

// The codec `options` names, behind the transform `kind`: identity and
// hadamard set options.rotation; wush builds the inner codec with rotation
// "identity" and wraps it with layer `layer` of `set` (required then).
absl::StatusOr<std::unique_ptr<KvCodec>> MakeTransformedCodec(CodecOptions options, TransformKind kind,
                                                              const TransformSet* set, int layer, bool values_folded);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_TRANSFORM_H_
