// Compressed-domain decode attention (codec/compressed_attention.h) through a WUSH
// transform stage whose inner codec is D-Quant: the query is mapped to
// q' = T_K^-T q for the compressed blocks, whose output o' is mapped back by
// T_V^-1; the bf16 window holds model-domain tokens and is attended with q
// itself. The two parts are separate softmax states merged by their
// log-sum-exp (MergeAttentionParts, codec/lse_merge.h); an empty part has
// lse = -inf and drops out.
//
// Folded values (values_folded: T_V is folded into the model's v_proj and
// o_proj): the model emits v' = T_V v, which is what is cached, both in the
// compressed blocks (stored untouched) and in the bf16 window. Both parts'
// outputs are then in the same (folded) domain, o' is not mapped, and the
// merge, a convex combination, stays in that domain; the model's folded
// o_proj maps it back. Scores are unaffected: keys are transformed as usual.
#ifndef DRIFTKV_CODEC_TRANSFORM_TRANSFORM_ATTENTION_H_
#define DRIFTKV_CODEC_TRANSFORM_TRANSFORM_ATTENTION_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/compressed_attention.h"
#include "codec/level_attention.h"
#include "codec/transform/transform.h"

namespace driftkv {

// Same contract as CompressedAttention. `codec` must have been built
// without its own rotation (DQuantConfig::hadamard false: the Hadamard
// factor is inside T) and match the transform's kv_heads and head_dim;
// InvalidArgument otherwise, or if q_heads is not a multiple of kv_heads.
absl::Status TransformedCompressedAttention(const DQuantCodec& codec, const LayerTransform& transform,
                                            bool values_folded, absl::Span<const CompressedBlock> blocks,
                                            const Bf16Tokens& window, const float* query, int q_heads,
                                            float softmax_scale, float* out, float* lse, AttentionScratch* scratch);

// The same over level pages of the hot tier (codec/level_attention.h):
// bit-identical to the function above on the cold pages they were promoted
// from (the same stage around LevelAttention, which is bit-identical to
// CompressedAttention).
absl::Status TransformedLevelAttention(const DQuantCodec& codec, const LayerTransform& transform, bool values_folded,
                                       absl::Span<const LevelPageRef> pages, const Bf16Tokens& window,
                                       const float* query, int q_heads, float softmax_scale, float* out, float* lse,
                                       LevelAttentionScratch* scratch);

// The same for a TransformedKvCodec; InvalidArgument if its inner codec is
// not D-Quant.
absl::Status TransformedCompressedAttention(const TransformedKvCodec& codec, absl::Span<const CompressedBlock> blocks,
                                            const Bf16Tokens& window, const float* query, int q_heads,
                                            float softmax_scale, float* out, float* lse, AttentionScratch* scratch);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_TRANSFORM_ATTENTION_H_
