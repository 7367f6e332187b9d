// Compressed-domain decode attention (codec/attention.h) through a WUSH
// transform stage whose inner codec is D-Quant: the query is mapped to
// q' = T_K^-T q for the compressed blocks, whose output o' is mapped back by
// T_V^-1; the bf16 window holds model-domain tokens and is attended with q
// itself. The two parts are separate softmax states merged by their
// log-sum-exp:
//   out = (e^lse1 * out1 + e^lse2 * out2) / (e^lse1 + e^lse2),
//   lse = log(e^lse1 + e^lse2),
// where an empty part has lse = -inf and drops out.
#ifndef DRIFTKV_CODEC_TRANSFORM_ATTENTION_H_
#define DRIFTKV_CODEC_TRANSFORM_ATTENTION_H_

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/attention.h"
#include "codec/transform.h"

namespace driftkv {

// Same contract as CompressedAttention; InvalidArgument if the codec's inner
// codec is not D-Quant or its values are folded (then o' is already in the
// model's domain but the window's values would not be: the caller owns that
// case).
absl::Status TransformedCompressedAttention(const TransformedKvCodec& codec,
                                            absl::Span<const CompressedBlock> blocks, const Bf16Tokens& window,
                                            const float* query, int q_heads, float softmax_scale, float* out,
                                            float* lse, AttentionScratch* scratch);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_TRANSFORM_ATTENTION_H_
