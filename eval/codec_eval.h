// The measurements of `driftkv-codec eval`, for any KvCodec, one layer at a
// time, accumulated over layers.
//
// Definitions (docs/quality.md repeats them):
//   nmse_k = sum (k - khat)^2 / sum k^2 over the whole tensor (likewise v);
//   attn_rel_err = ||o - ohat|| / ||o|| over all queries and heads, where o
//     is causal attention in float64 over the original keys/values and ohat
//     the same attention over the stored cache (for D-Quant, also behind a
//     WUSH transform, through the compressed-domain path of
//     codec/compressed_attention.h / codec/transform/transform_attention.h, otherwise over the
//     decoded cache); query i of Tq sits at position T - Tq + i;
//   bits per value: every stored byte (records, side records, bf16 window)
//     * 8 / values.
// Folded values (a TransformedKvCodec with values_folded(): T_V folded into
// v_proj/o_proj, eval/transform_flags.h): the codec stores v' = T_V v as
// given and attention over the store yields o' = T_V o, which the folded
// o_proj consumes. EvaluateLayer simulates that model and still measures in
// the model's domain, with the same denominators as without folding:
//   - `values` are the model's v (eval, sweep): v' = T_V v is computed here
//     (LayerTransform::Apply, the very product an unfolded TransformedKvCodec
//     feeds its inner codec) and stored; or, with values_already_folded
//     (encode), `values` are v' and are stored as given, the model's v being
//     T_V^-1 v';
//   - nmse_v compares T_V^-1 vhat' with v;
//   - attention runs over the stored (folded) cache, as the folded model
//     does, and its output o' is mapped back by T_V^-1 before it is compared
//     with float64 attention over the model's k and v.
// Without this the codec would code the model's v unrotated and the errors
// would be those of no value transform at all.
#ifndef DRIFTKV_EVAL_CODEC_EVAL_H_
#define DRIFTKV_EVAL_CODEC_EVAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "codec/encoded_layer.h"
#include "codec/kv_codec.h"

namespace driftkv {

struct EvalLayerInput {
  const float* keys = nullptr;  // [tokens][kv_heads][head_dim]
  const float* values = nullptr;
  int64_t tokens = 0;
  const float* queries = nullptr;  // [query_tokens][q_heads][head_dim] or null
  int64_t query_tokens = 0;
  int q_heads = 0;
  int64_t residual = 0;        // newest tokens kept in bf16
  double softmax_scale = 0.0;  // 0: 1 / sqrt(head_dim)
  int threads = 1;             // encode threads (timings are per thread at 1)
  // Folded-values codecs only (see above): `values` already hold v' = T_V v.
  bool values_already_folded = false;
};

struct EvalAccumulator {
  CodecStats stats;
  double err_k = 0, sum_k = 0, err_v = 0, sum_v = 0;
  double attn_err = 0, attn_sum = 0;
  bool has_attention = false;
  int64_t key_bytes = 0, value_bytes = 0, values = 0;  // values per tensor
  double encode_seconds = 0, decode_seconds = 0;
  int64_t encoded_streams = 0;

  void Add(const EvalAccumulator& o) {
    stats.Add(o.stats);
    err_k += o.err_k;
    sum_k += o.sum_k;
    err_v += o.err_v;
    sum_v += o.sum_v;
    attn_err += o.attn_err;
    attn_sum += o.attn_sum;
    has_attention |= o.has_attention;
    key_bytes += o.key_bytes;
    value_bytes += o.value_bytes;
    values += o.values;
    encode_seconds += o.encode_seconds;
    decode_seconds += o.decode_seconds;
    encoded_streams += o.encoded_streams;
  }
};

// Encodes, decodes and measures one layer; adds to `acc`. If `encoded` is
// not null it receives the encoded layer (for the pool file).
absl::Status EvaluateLayer(const KvCodec& codec, const EvalLayerInput& in, EvalAccumulator* acc, EncodedLayer* encoded);

// The JSON object of `driftkv-codec eval` (one line, keys documented in
// docs/quality.md).
std::string EvalJson(const KvCodec& codec, const EvalAccumulator& acc);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_CODEC_EVAL_H_
