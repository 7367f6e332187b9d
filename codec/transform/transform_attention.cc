#include "codec/transform/transform_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/dquant_kv_codec.h"

namespace driftkv {

namespace {

// The stage around the pages' attention: `pages(q', out', lse')` attends
// the compressed tokens with the transformed query; the window is attended
// in the model's domain with `window_scratch`, and the two merged.
template <typename PagesFn>
absl::Status TransformedAttention(const DQuantCodec& codec, const LayerTransform& transform, bool values_folded,
                                  const Bf16Tokens& window, const float* query, int q_heads, float softmax_scale,
                                  float* out, float* lse, AttentionScratch* window_scratch, PagesFn pages) {
  const DQuantConfig& c = codec.config();
  if (c.hadamard || c.kv_heads != transform.kv_heads() || c.head_dim != transform.head_dim()) {
    return absl::InvalidArgumentError(absl::StrCat("transformed attention needs a D-Quant codec without rotation of ",
                                                   transform.kv_heads(), " kv heads x ", transform.head_dim(),
                                                   "; the codec has ", c.kv_heads, " x ", c.head_dim,
                                                   c.hadamard ? " with its Hadamard rotation" : ""));
  }
  if (q_heads < 1 || q_heads % c.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", q_heads, " is not a multiple of kv_heads ", c.kv_heads));
  }
  const int d = c.head_dim;
  const size_t qd = static_cast<size_t>(q_heads) * d;
  std::vector<float> q2(qd), out1(qd), out2(qd), lse1(q_heads), lse2(q_heads);
  transform.Queries(query, q_heads, q2.data());
  absl::Status st = pages(q2.data(), out1.data(), lse1.data());
  if (!st.ok()) return st;
  if (!values_folded) transform.Outputs(out1.data(), q_heads, out1.data());
  st = CompressedAttention(codec, {}, window, query, q_heads, softmax_scale, out2.data(), lse2.data(), window_scratch);
  if (!st.ok()) return st;
  const float* outs[2] = {out1.data(), out2.data()};
  const float* lses[2] = {lse1.data(), lse2.data()};
  MergeAttentionParts(outs, lses, 2, q_heads, d, out, lse);
  return absl::OkStatus();
}

}  // namespace

absl::Status TransformedCompressedAttention(const DQuantCodec& codec, const LayerTransform& transform,
                                            bool values_folded, absl::Span<const CompressedBlock> blocks,
                                            const Bf16Tokens& window, const float* query, int q_heads,
                                            float softmax_scale, float* out, float* lse, AttentionScratch* scratch) {
  return TransformedAttention(codec, transform, values_folded, window, query, q_heads, softmax_scale, out, lse, scratch,
                              [&](const float* q2, float* out1, float* lse1) {
                                return CompressedAttention(codec, blocks, Bf16Tokens(), q2, q_heads, softmax_scale,
                                                           out1, lse1, scratch);
                              });
}

absl::Status TransformedLevelAttention(const DQuantCodec& codec, const LayerTransform& transform, bool values_folded,
                                       absl::Span<const LevelPageRef> pages, const Bf16Tokens& window,
                                       const float* query, int q_heads, float softmax_scale, float* out, float* lse,
                                       LevelAttentionScratch* scratch) {
  return TransformedAttention(codec, transform, values_folded, window, query, q_heads, softmax_scale, out, lse,
                              &scratch->attention, [&](const float* q2, float* out1, float* lse1) {
                                return LevelAttention(codec, pages, Bf16Tokens(), q2, q_heads, softmax_scale, out1,
                                                      lse1, scratch);
                              });
}

absl::Status TransformedCompressedAttention(const TransformedKvCodec& codec, absl::Span<const CompressedBlock> blocks,
                                            const Bf16Tokens& window, const float* query, int q_heads,
                                            float softmax_scale, float* out, float* lse, AttentionScratch* scratch) {
  const auto* dq = dynamic_cast<const DQuantKvCodec*>(&codec.inner());
  if (dq == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("compressed-domain attention needs a D-Quant inner codec, not ", codec.inner().name()));
  }
  return TransformedCompressedAttention(dq->codec(), codec.transform(), codec.values_folded(), blocks, window, query,
                                        q_heads, softmax_scale, out, lse, scratch);
}

}  // namespace driftkv
