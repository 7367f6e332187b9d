#include "codec/transform_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::Status TransformedCompressedAttention(const TransformedKvCodec& codec,
                                            absl::Span<const CompressedBlock> blocks, const Bf16Tokens& window,
                                            const float* query, int q_heads, float softmax_scale, float* out,
                                            float* lse, AttentionScratch* scratch) {
  const auto* dq = dynamic_cast<const DQuantKvCodec*>(&codec.inner());
  if (dq == nullptr || codec.values_folded()) {
    return absl::InvalidArgumentError(absl::StrCat("compressed-domain attention needs a D-Quant inner codec with "
                                                   "transformed values, not ", codec.inner().name()));
  }
  if (q_heads < 1 || q_heads % codec.kv_heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_heads ", q_heads, " is not a multiple of kv_heads ", codec.kv_heads()));
  }
  const int d = codec.head_dim();
  const size_t qd = static_cast<size_t>(q_heads) * d;
  std::vector<float> q2(qd), out1(qd), out2(qd), lse1(q_heads), lse2(q_heads);
  codec.transform().Queries(query, q_heads, q2.data());
  absl::Status st = CompressedAttention(dq->codec(), blocks, Bf16Tokens(), q2.data(), q_heads, softmax_scale,
                                        out1.data(), lse1.data(), scratch);
  if (!st.ok()) return st;
  codec.transform().Outputs(out1.data(), q_heads, out1.data());
  st = CompressedAttention(dq->codec(), {}, window, query, q_heads, softmax_scale, out2.data(), lse2.data(), scratch);
  if (!st.ok()) return st;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int h = 0; h < q_heads; ++h) {
    const float m = std::max(lse1[h], lse2[h]);
    if (m == kNegInf) {
      for (int j = 0; j < d; ++j) out[h * d + j] = 0.0f;
      lse[h] = kNegInf;
      continue;
    }
    const float w1 = std::exp(lse1[h] - m), w2 = std::exp(lse2[h] - m), inv = 1.0f / (w1 + w2);
    for (int j = 0; j < d; ++j) out[h * d + j] = (w1 * out1[h * d + j] + w2 * out2[h * d + j]) * inv;
    lse[h] = m + std::log(w1 + w2);
  }
  return absl::OkStatus();
}

}  // namespace driftkv
