#include "codec/compressed_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "codec/hadamard.h"
#include "codec/lse_merge.h"

namespace driftkv {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

absl::Status AttentionCore::Begin(const float* query, int q_heads, float softmax_scale) {
  const int kv_heads = codec_.config().kv_heads, d = codec_.config().head_dim, n = codec_.n();
  if (q_heads < 1 || q_heads % kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("q_heads ", q_heads, " is not a multiple of kv_heads ", kv_heads));
  }
  query_ = query;
  q_heads_ = q_heads;
  group_ = q_heads / kv_heads;
  softmax_scale_ = softmax_scale;
  kernels_ = s_->kernels != nullptr ? s_->kernels : &BestAttentionKernels();
  shape_.q_heads = q_heads;
  shape_.group = group_;
  shape_.head_dim = d;
  AttentionScratch* s = s_;
  const size_t qd = static_cast<size_t>(q_heads) * d;
  s->q_rot.assign(query, query + qd);
  codec_.Rotate(s->q_rot.data(), q_heads);
  s->q_sum.assign(q_heads, 0.0f);
  for (int h = 0; h < q_heads; ++h) {
    for (int j = 0; j < d; ++j) s->q_sum[h] += s->q_rot[h * d + j];
  }
  s->q_mu.resize(q_heads);
  s->mu.resize(n);
  s->acc_rot.assign(qd, 0.0f);
  s->acc_raw.assign(qd, 0.0f);
  s->offset.assign(q_heads, 0.0f);
  s->max.assign(q_heads, kNegInf);
  s->denom.assign(q_heads, 0.0f);
  return absl::OkStatus();
}

// Raises the running max of head h to `m`, rescaling its state.
void AttentionCore::Rescale(int h, float m) {
  AttentionScratch* s = s_;
  const int d = codec_.config().head_dim;
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

void AttentionCore::BeginBlock(const uint8_t* mean_record, int tokens) {
  AttentionScratch* s = s_;
  const int d = codec_.config().head_dim, n = codec_.n(), group = group_;
  block_tokens_ = tokens;
  DQuantCodec::LoadMean(mean_record, n, s->mu.data());
  for (int h = 0; h < q_heads_; ++h) {
    const float* q = s->q_rot.data() + h * d;
    const float* mu = s->mu.data() + (h / group) * d;
    float acc = 0.0f;
    for (int j = 0; j < d; ++j) acc += q[j] * mu[j];
    s->q_mu[h] = acc;
  }
  s->scores.resize(static_cast<size_t>(tokens) * q_heads_);
}

// Scores, eq. (8).
void AttentionCore::KeyTokens(int t0, int count, const uint8_t* levels, const float* sc, const float* off) {
  AttentionScratch* s = s_;
  const int q_heads = q_heads_;
  const float softmax_scale = softmax_scale_;
  float* scores = s->scores.data() + static_cast<size_t>(t0) * q_heads;
  kernels_->dots_levels(shape_, s->q_rot.data(), levels, count, scores);
  for (int k = 0; k < count; ++k) {
    float* row = scores + static_cast<size_t>(k) * q_heads;
    for (int h = 0; h < q_heads; ++h) {
      row[h] = softmax_scale * (sc[k] * row[h] + off[k] * s->q_sum[h] + s->q_mu[h]);
    }
  }
}

void AttentionCore::Softmax(float* scores, int tokens) {
  AttentionScratch* s = s_;
  const int q_heads = q_heads_;
  for (int h = 0; h < q_heads; ++h) {
    float m = kNegInf;
    for (int t = 0; t < tokens; ++t) m = std::max(m, scores[static_cast<size_t>(t) * q_heads + h]);
    Rescale(h, m);
  }
  for (int t = 0; t < tokens; ++t) {
    float* row = scores + static_cast<size_t>(t) * q_heads;
    for (int h = 0; h < q_heads; ++h) {
      row[h] = std::exp(row[h] - s->max[h]);
      s->denom[h] += row[h];
    }
  }
}

void AttentionCore::EndKeys() {
  Softmax(s_->scores.data(), block_tokens_);
}

// Values, eq. (9).
void AttentionCore::ValueTokens(int t0, int count, const uint8_t* levels, const float* sc, const float* off) {
  AttentionScratch* s = s_;
  const int q_heads = q_heads_;
  const float* w = s->scores.data() + static_cast<size_t>(t0) * q_heads;
  s->coef.resize(static_cast<size_t>(count) * q_heads);
  for (int k = 0; k < count; ++k) {
    for (int h = 0; h < q_heads; ++h) {
      const float wk = w[static_cast<size_t>(k) * q_heads + h];
      s->offset[h] += wk * off[k];
      s->coef[static_cast<size_t>(k) * q_heads + h] = wk * sc[k];
    }
  }
  kernels_->accumulate_levels(shape_, s->coef.data(), levels, count, s->acc_rot.data());
}

// The bf16 window, in the model's domain.
void AttentionCore::Window(const Bf16Tokens& window) {
  AttentionScratch* s = s_;
  const size_t n = codec_.n();
  const int q_heads = q_heads_;
  s->scores.resize(static_cast<size_t>(kWindowBlockTokens) * q_heads);
  float* scores = s->scores.data();
  for (int64_t t0 = 0; t0 < window.tokens; t0 += kWindowBlockTokens) {
    const int count = static_cast<int>(std::min<int64_t>(kWindowBlockTokens, window.tokens - t0));
    kernels_->dots_bf16(shape_, query_, window.keys + t0 * n, count, scores);
    for (size_t i = 0; i < static_cast<size_t>(count) * q_heads; ++i) scores[i] *= softmax_scale_;
    Softmax(scores, count);
    kernels_->accumulate_bf16(shape_, scores, window.values + t0 * n, count, s->acc_raw.data());
  }
}

void AttentionCore::Finish(float* out, float* lse) {
  AttentionScratch* s = s_;
  const int d = codec_.config().head_dim;
  for (int h = 0; h < q_heads_; ++h) {
    float* a = s->acc_rot.data() + h * d;
    for (int j = 0; j < d; ++j) a[j] += s->offset[h];
    codec_.Rotate(a, 1);
    const float inv = s->denom[h] > 0.0f ? 1.0f / s->denom[h] : 0.0f;
    const float* r = s->acc_raw.data() + h * d;
    for (int j = 0; j < d; ++j) out[h * d + j] = (a[j] + r[j]) * inv;
    lse[h] = s->denom[h] > 0.0f ? s->max[h] + std::log(s->denom[h]) : kNegInf;
  }
}

absl::Status CompressedAttention(const DQuantCodec& codec, absl::Span<const CompressedBlock> blocks,
                                 const Bf16Tokens& window, const float* query, int q_heads, float softmax_scale,
                                 float* out, float* lse, AttentionScratch* s) {
  AttentionCore core(codec, s);
  absl::Status st = core.Begin(query, q_heads, softmax_scale);
  if (!st.ok()) return st;
  const int n = codec.n();
  s->levels.resize(2 * static_cast<size_t>(n));
  for (const CompressedBlock& b : blocks) {
    core.BeginBlock(b.mean_record, b.tokens);
    // Tokens go two at a time so that their rANS chains interleave.
    for (int t0 = 0; t0 < b.tokens; t0 += 2) {
      const int pair = std::min(2, b.tokens - t0);
      float sc[2], off[2];
      st = codec.key_codec().DecodeSymbolsUpTo2(b.key_records + t0 * codec.key_stride(), pair, s->levels.data(), sc,
                                                off);
      if (!st.ok()) return absl::DataLossError(absl::StrCat("key record of token ", t0, " in block: ", st.message()));
      core.KeyTokens(t0, pair, s->levels.data(), sc, off);
    }
    core.EndKeys();
    for (int t0 = 0; t0 < b.tokens; t0 += 2) {
      const int pair = std::min(2, b.tokens - t0);
      float sc[2], off[2];
      st = codec.value_codec().DecodeSymbolsUpTo2(b.value_records + t0 * codec.value_stride(), pair, s->levels.data(),
                                                  sc, off);
      if (!st.ok()) return absl::DataLossError(absl::StrCat("value record of token ", t0, " in block: ", st.message()));
      core.ValueTokens(t0, pair, s->levels.data(), sc, off);
    }
  }
  core.Window(window);
  core.Finish(out, lse);
  return absl::OkStatus();
}

std::vector<CompressedBlock> LayerBlocks(const KvCodec& codec, const EncodedLayer& layer, int64_t tokens) {
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

void MergeAttentionParts(const float* const* outs, const float* const* lses, int parts, int q_heads, int head_dim,
                         float* out, float* lse) {
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

void ReferenceAttention(const float* keys, const float* values, int64_t tokens, int kv_heads, int head_dim,
                        const float* query, int q_heads, double softmax_scale, double* out, double* lse) {
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
