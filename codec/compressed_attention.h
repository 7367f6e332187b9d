// Decode attention of one query token over a compressed KV history, on the
// CPU, without materialising a dequantised cache (paper eq. 7-9).
//
// Keys: with q' = H q (the query rotated like the keys),
//   q . k_t = s_t * sum_j q'_j m_tj + o_t * sum_j q'_j + sum_j q'_j mu_j,
// so the contraction runs over integer levels m_tj and the affine terms are
// applied once per token. Values: sum_t a_t v'_t = sum_t (a_t s_t) m_t + sum_t a_t o_t,
// accumulated in the rotated domain and rotated back once at the end.
// Each token's key and value streams are decoded once and serve all query
// heads of their KV head (GQA). The newest tokens may be held uncompressed
// in bf16 (the "window") and are attended to in the model's domain.
//
// Softmax is online over blocks: (max, denominator, accumulator) per query
// head, rescaled once a block (the window runs in blocks of
// kWindowBlockTokens). An empty history gives out = 0 and lse = -inf, the
// identity of the merge rule below. Dot products and value sums run in the
// fixed order of codec/attention_kernels.h, so the bits depend on the
// tokens and their blocks only: not on the batch, the thread or the CPU.
#ifndef DRIFTKV_CODEC_COMPRESSED_ATTENTION_H_
#define DRIFTKV_CODEC_COMPRESSED_ATTENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/attention_kernels.h"
#include "codec/dquant_codec.h"
#include "codec/encoded_layer.h"

namespace driftkv {

// Up to one mean window of compressed tokens, records contiguous.
struct CompressedBlock {
  const uint8_t* key_records = nullptr;    // tokens * key_stride bytes
  const uint8_t* value_records = nullptr;  // tokens * value_stride bytes
  const uint8_t* mean_record = nullptr;    // mean_stride bytes
  int tokens = 0;
};

// Uncompressed tokens, bf16 bits, [tokens][kv_heads][head_dim].
struct Bf16Tokens {
  const uint16_t* keys = nullptr;
  const uint16_t* values = nullptr;
  int64_t tokens = 0;
};

struct AttentionScratch {
  CodecScratch codec;
  // scores: [block tokens][q_heads], the softmax weights after EndKeys;
  // coef: [tokens][q_heads], weight x value scale of ValueTokens' tokens.
  std::vector<float> q_rot, q_sum, q_mu, mu, scores, coef, acc_rot, acc_raw, offset, max, denom;
  std::vector<uint8_t> levels;
  // The loops' implementation (codec/attention_kernels.h); null: the
  // fastest this CPU runs. Every implementation gives the same bits.
  const AttentionKernels* kernels = nullptr;
};

// The window's tokens go through the softmax this many at a time: large
// enough that the rescaling is rare, small enough that their scores
// ([kWindowBlockTokens][q_heads] floats) stay in the L1 cache.
constexpr int kWindowBlockTokens = 128;

// The blocks holding the first `tokens` (at most layer.compressed) compressed
// tokens of a layer stored contiguously by `codec`; the last may be partial.
// The pointers alias `layer`, which must outlive them.
std::vector<CompressedBlock> LayerBlocks(const KvCodec& codec, const EncodedLayer& layer, int64_t tokens);

// The arithmetic of CompressedAttention once a block's symbols are decoded:
// scores (eq. 8), the online softmax and the value sums (eq. 9), the bf16
// window and the final rotation. CompressedAttention and LevelAttention
// (codec/level_attention.h) both run it, so the same tokens give the same
// bits whichever tier holds them. Calls, in this order:
//   Begin;
//   per block: BeginBlock; KeyTokens over the block's tokens in order (any
//     split into calls); EndKeys; ValueTokens over the tokens in order;
//   Window (any number of tokens, also none); Finish.
// Levels are not range-checked here (the decoders produce levels < M).
// The block's softmax weights are computed once, in EndKeys; the window's
// tokens are scored, weighted and summed kWindowBlockTokens at a time.
class AttentionCore {
 public:
  // `codec` and `scratch` must outlive the core; the core owns no memory.
  AttentionCore(const DQuantCodec& codec, AttentionScratch* scratch) : codec_(codec), s_(scratch) {}

  // query [q_heads][head_dim] floats, kept by pointer until Finish.
  // InvalidArgument if q_heads is not a positive multiple of kv_heads.
  absl::Status Begin(const float* query, int q_heads, float softmax_scale);
  // A block of `tokens` tokens sharing `mean_record` (4 + n bytes).
  void BeginBlock(const uint8_t* mean_record, int tokens);
  // Tokens [t, t + count) of the block: levels [count][n] in channel order,
  // the grids scale[count], offset[count] of their key (value) records.
  void KeyTokens(int t, int count, const uint8_t* levels, const float* scale, const float* offset);
  void EndKeys();
  void ValueTokens(int t, int count, const uint8_t* levels, const float* scale, const float* offset);
  void Window(const Bf16Tokens& window);
  // out [q_heads][head_dim], lse [q_heads] (see CompressedAttention).
  void Finish(float* out, float* lse);

 private:
  void Rescale(int h, float m);
  // Raises each head's max to the largest of scores [tokens][q_heads],
  // turns the scores into weights exp(score - max) and adds them to the
  // denominators.
  void Softmax(float* scores, int tokens);

  const DQuantCodec& codec_;
  AttentionScratch* s_;
  const AttentionKernels* kernels_ = nullptr;
  AttentionShape shape_;
  const float* query_ = nullptr;
  int q_heads_ = 0, group_ = 1, block_tokens_ = 0;
  float softmax_scale_ = 0.0f;
};

// query: [q_heads][head_dim] floats; q_heads a multiple of kv_heads (query
// head h reads KV head h / (q_heads / kv_heads)). out: [q_heads][head_dim];
// lse: [q_heads], natural-log sum of exp(scale * q.k) over all tokens.
// Returns DataLoss if a record is corrupt (outputs then unspecified).
absl::Status CompressedAttention(const DQuantCodec& codec, absl::Span<const CompressedBlock> blocks,
                                 const Bf16Tokens& window, const float* query, int q_heads, float softmax_scale,
                                 float* out, float* lse, AttentionScratch* scratch);

// Merges `parts` normalised partial outputs of the same q_heads query
// heads over disjoint tokens by their log-sum-exp (codec/lse_merge.h):
// outs[k] is [q_heads][head_dim], lses[k] is [q_heads]; out and lse as for
// CompressedAttention (may not alias the parts). Weights and the
// denominator in double.
void MergeAttentionParts(const float* const* outs, const float* const* lses, int parts, int q_heads, int head_dim,
                         float* out, float* lse);

// Reference attention over float keys/values [tokens][kv_heads][head_dim] in
// double precision (tests and the error measurements).
void ReferenceAttention(const float* keys, const float* values, int64_t tokens, int kv_heads, int head_dim,
                        const float* query, int q_heads, double softmax_scale, double* out, double* lse);

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_COMPRESSED_ATTENTION_H_
