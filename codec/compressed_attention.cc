#include "codec/compressed_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"
#include "codec/lse_merge.h"
#include "wire/half.h"

namespace driftkv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// q . m for integer levels m. Eight independent partial sums in a fixed
// order: the compiler can vectorise without -ffast-math, and the result does
// not depend on the machine.
float DotLevels(const float* q, const uint8_t* m, int d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int j = 0;
  for (; j + 8 <= d; j += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += q[j + k] * static_cast<float>(m[j + k]);
  }
  for (; j < d; ++j) acc[j & 7] += q[j] * static_cast<float>(m[j]);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Raises the running max of head h to `m`, rescaling its state.
void Rescale(AttentionScratch* s, int h, float m, int d) {
  if (m <= s->max[h]) return;
  const float factor = s->max[h] == kNegInf ? 0.0f : std::exp(s->max[h] - m);
  s->max[h] = m;
  s->denom[h] *= factor;
  s->offset[h] *= factor;
  float* a = s->acc_rot.data() + static_cast<size_t>(h) * d;
  float* r = s->acc_raw.data() + static_cast<size_t>(h) * d;
  for (int j = 0; j < d; ++j) {
    a[j] *= factor;
    r[j] *= factor;
  }
}

}  // namespace

absl::Status CompressedAttention(const DQuantCodec& codec, absl::Span<const CompressedBlock> blocks,
                                 const Bf16Tokens& window, const float* query, int q_heads,
                                 float softmax_scale, float* out, float* lse,
                                 AttentionScratch* s) {
  const int kv_heads = codec.config().kv_heads, d = codec.config().head_dim, n = codec.n();
  if (q_heads < 1 || q_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", q_heads, " is not a multiple of kv_heads ", kv_heads));
  }
  const int group = q_heads / kv_heads;
  const size_t qd = static_cast<size_t>(q_heads) * d;
  s->q_rot.assign(query, query + qd);
  codec.Rotate(s->q_rot.data(), q_heads);
  s->q_sum.assign(q_heads, 0.0f);
  for (int h = 0; h < q_heads; ++h) {
    for (int j = 0; j < d; ++j) s->q_sum[h] += s->q_rot[h * d + j];
  }
  s->q_mu.resize(q_heads);
  s->mu.resize(n);
  s->levels.resize(2 * static_cast<size_t>(n));
  s->acc_rot.assign(qd, 0.0f);
  s->acc_raw.assign(qd, 0.0f);
  s->offset.assign(q_heads, 0.0f);
  s->max.assign(q_heads, kNegInf);
  s->denom.assign(q_heads, 0.0f);
  s->k_raw.resize(n);

  for (const CompressedBlock& b : blocks) {
    DQuantCodec::LoadMean(b.mean_record, n, s->mu.data());
    for (int h = 0; h < q_heads; ++h) {
      const float* q = s->q_rot.data() + h * d;
      const float* mu = s->mu.data() + (h / group) * d;
      float acc = 0.0f;
      for (int j = 0; j < d; ++j) acc += q[j] * mu[j];
      s->q_mu[h] = acc;
    }
    // Scores of the block, eq. (8).
    // Tokens go two at a time so that their rANS chains interleave.
    s->scores.resize(static_cast<size_t>(b.tokens) * q_heads);
    for (int t0 = 0; t0 < b.tokens; t0 += 2) {
      const int pair = std::min(2, b.tokens - t0);
      float sc[2], off[2];
      absl::Status st = codec.key_codec().DecodeSymbolsUpTo2(b.key_records + t0 * codec.key_stride(), pair,
                                                             s->levels.data(), sc, off);
      if (!st.ok()) return absl::DataLossError(absl::StrCat("key record of token ", t0, " in block: ", st.message()));
      for (int k = 0; k < pair; ++k) {
        const int t = t0 + k;
        for (int h = 0; h < q_heads; ++h) {
          const float* q = s->q_rot.data() + h * d;
          const uint8_t* m = s->levels.data() + k * n + (h / group) * d;
          const float dot = DotLevels(q, m, d);
          s->scores[t * q_heads + h] = softmax_scale * (sc[k] * dot + off[k] * s->q_sum[h] + s->q_mu[h]);
        }
      }
    }
    for (int h = 0; h < q_heads; ++h) {
      float m = kNegInf;
      for (int t = 0; t < b.tokens; ++t) m = std::max(m, s->scores[t * q_heads + h]);
      Rescale(s, h, m, d);
    }
    // Values, eq. (9).
    for (int t0 = 0; t0 < b.tokens; t0 += 2) {
      const int pair = std::min(2, b.tokens - t0);
      float sc[2], off[2];
      absl::Status st = codec.value_codec().DecodeSymbolsUpTo2(b.value_records + t0 * codec.value_stride(),
                                                               pair, s->levels.data(), sc, off);
      if (!st.ok()) return absl::DataLossError(absl::StrCat("value record of token ", t0, " in block: ", st.message()));
      for (int k = 0; k < pair; ++k) {
        const int t = t0 + k;
        for (int h = 0; h < q_heads; ++h) {
          const float w = std::exp(s->scores[t * q_heads + h] - s->max[h]);
          s->denom[h] += w;
          s->offset[h] += w * off[k];
          const float ws = w * sc[k];
          float* a = s->acc_rot.data() + h * d;
          const uint8_t* m = s->levels.data() + k * n + (h / group) * d;
          for (int j = 0; j < d; ++j) a[j] += ws * static_cast<float>(m[j]);
        }
      }
    }
  }

  // The bf16 window, in the model's domain.
  for (int64_t t = 0; t < window.tokens; ++t) {
    const uint16_t* k = window.keys + t * n;
    for (int j = 0; j < n; ++j) s->k_raw[j] = Bf16ToFloat(k[j]);
    for (int h = 0; h < q_heads; ++h) {
      const float* q = query + h * d;
      const float* kk = s->k_raw.data() + (h / group) * d;
      float dot = 0.0f;
      for (int j = 0; j < d; ++j) dot += q[j] * kk[j];
      const float score = softmax_scale * dot;
      Rescale(s, h, score, d);
      const float w = std::exp(score - s->max[h]);
      s->denom[h] += w;
      const uint16_t* v = window.values + t * n + (h / group) * d;
      float* r = s->acc_raw.data() + h * d;
      for (int j = 0; j < d; ++j) r[j] += w * Bf16ToFloat(v[j]);
    }
  }

  for (int h = 0; h < q_heads; ++h) {
    float* a = s->acc_rot.data() + h * d;
    for (int j = 0; j < d; ++j) a[j] += s->offset[h];
    codec.Rotate(a, 1);
    const float inv = s->denom[h] > 0.0f ? 1.0f / s->denom[h] : 0.0f;
    const float* r = s->acc_raw.data() + h * d;
    for (int j = 0; j < d; ++j) out[h * d + j] = (a[j] + r[j]) * inv;
    lse[h] = s->denom[h] > 0.0f ? s->max[h] + std::log(s->denom[h]) : kNegInf;
  }
  return absl::OkStatus();
}

std::vector<CompressedBlock> LayerBlocks(const KvCodec& codec, const EncodedLayer& layer,
                                         int64_t tokens) {
  const int bt = codec.block_tokens();
  tokens = std::min(tokens, layer.compressed);
  std::vector<CompressedBlock> blocks;
  for (int64_t t0 = 0; t0 < tokens; t0 += bt) {
    CompressedBlock b;
    b.key_records = layer.key_records.data() + t0 * codec.key_stride();
    b.value_records = layer.value_records.data() + t0 * codec.value_stride();
    b.mean_record = layer.side.data() + (t0 / bt) * codec.side_stride();
    b.tokens = static_cast<int>(std::min<int64_t>(bt, tokens - t0));
    blocks.push_back(b);
  }
  return blocks;
}

void MergeAttentionParts(const float* const* outs, const float* const* lses, int parts, int q_heads,
                         int head_dim, float* out, float* lse) {
  const auto exp = [](double x) { return std::exp(x); };
  for (int h = 0; h < q_heads; ++h) {
    float m = kNegInf;
    for (int k = 0; k < parts; ++k) m = std::max(m, lses[k][h]);
    float* o = out + static_cast<size_t>(h) * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    if (m == kNegInf) {
      lse[h] = m;
      continue;
    }
    double denom = 0.0;
    for (int k = 0; k < parts; ++k) denom += LseWeight<double>(lses[k][h], m, exp);
    lse[h] = m + static_cast<float>(std::log(denom));
    for (int k = 0; k < parts; ++k) {
      const float w = static_cast<float>(LseWeight<double>(lses[k][h], m, exp) / denom);
      const float* po = outs[k] + static_cast<size_t>(h) * head_dim;
      for (int e = 0; e < head_dim; ++e) o[e] += w * po[e];
    }
  }
}

void ReferenceAttention(const float* keys, const float* values, int64_t tokens, int kv_heads,
                        int head_dim, const float* query, int q_heads, double softmax_scale,
                        double* out, double* lse) {
  const int d = head_dim, n = kv_heads * head_dim, group = q_heads / kv_heads;
  std::vector<double> scores(tokens);
  for (int h = 0; h < q_heads; ++h) {
    const int kh = h / group;
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t t = 0; t < tokens; ++t) {
      double dot = 0.0;
      for (int j = 0; j < d; ++j) dot += static_cast<double>(query[h * d + j]) * keys[t * n + kh * d + j];
      scores[t] = softmax_scale * dot;
      m = std::max(m, scores[t]);
    }
    double denom = 0.0;
    for (int j = 0; j < d; ++j) out[h * d + j] = 0.0;
    for (int64_t t = 0; t < tokens; ++t) {
      const double w = std::exp(scores[t] - m);
      denom += w;
      for (int j = 0; j < d; ++j) out[h * d + j] += w * values[t * n + kh * d + j];
    }
    for (int j = 0; j < d; ++j) out[h * d + j] = denom > 0 ? out[h * d + j] / denom : 0.0;
    lse[h] = denom > 0 ? m + std::log(denom) : -std::numeric_limits<double>::infinity();
  }
}

}  // namespace driftkv
