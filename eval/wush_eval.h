// The measurements of the WUSH-KV ablation (docs/quality.md, a controlled
// ablation): one layer's keys/values go through a codec (any transform),
// and causal attention of the given queries is computed over
//   K: quantized keys, exact values;  V: exact keys, quantized values;
//   KV: both quantized,
// against attention over the exact cache. Errors are accumulated as sums of
// squares so they can be pooled over windows:
//   attention error  ||o - ohat|| / ||o||        (per query head output,
//                                                 what driftkv-codec eval
//                                                 calls attn_rel_err)
//   module error     ||W_O (o - ohat)|| / ||W_O o||  (after o_proj; only
//                                                 with W_O)
// Attention runs in float (softmax max-shifted); its own rounding (~1e-6
// relative) is far below the errors measured.
#ifndef DRIFTKV_EVAL_WUSH_EVAL_H_
#define DRIFTKV_EVAL_WUSH_EVAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "codec/kv_codec.h"

namespace driftkv {

struct AblationInput {
  const float* keys = nullptr;  // [tokens][kv_heads][head_dim]
  const float* values = nullptr;
  int64_t tokens = 0;
  const float* queries = nullptr;  // [query_tokens][q_heads][head_dim], query i at tokens - query_tokens + i
  int64_t query_tokens = 0;
  int kv_heads = 0, q_heads = 0, head_dim = 0;
  const float* wo = nullptr;  // [hidden][q_heads * head_dim] or null
  int64_t hidden = 0;
};

enum AblationMode { kKeysOnly = 0, kValuesOnly = 1, kBoth = 2, kModes = 3 };

struct AblationErrors {
  double attn_num[kModes] = {0, 0, 0}, attn_den[kModes] = {0, 0, 0};
  double module_num[kModes] = {0, 0, 0}, module_den[kModes] = {0, 0, 0};
  int64_t key_bytes = 0, value_bytes = 0, values = 0;
  void Add(const AblationErrors& o);
  double attention(int mode) const;
  double module(int mode) const;
};

// Causal attention outputs [query_tokens][q_heads][head_dim] over the given
// keys/values (same shapes as in.keys/in.values).
std::vector<float> AttentionOutputs(const AblationInput& in, const float* keys, const float* values);

// Encodes and decodes the layer with `codec` (no bf16 window) and adds the
// three modes' errors against `reference` = AttentionOutputs(in, keys, values).
absl::Status MeasureAblation(const KvCodec& codec, const AblationInput& in, const std::vector<float>& reference,
                             AblationErrors* acc);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_WUSH_EVAL_H_
