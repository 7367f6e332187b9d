#include "eval/codec_eval.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_kv_codec.h"
#include "codec/transform/transform_attention.h"
#include "wire/half.h"

namespace driftkv {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// attention of every query over tokens [0, pos] of the stored layer, against
// float64 attention over in.keys and `values` (the model's). `unfold` (folded
// values only): vhat is in the folded domain and the stored layer's output
// o' is mapped back by T_V^-1 before the comparison.
absl::Status MeasureAttention(const KvCodec& codec, const EvalLayerInput& in, const float* values,
                              const EncodedLayer& enc, const std::vector<float>& khat, const std::vector<float>& vhat,
                              const LayerTransform* unfold, EvalAccumulator* acc) {
  const int d = codec.head_dim(), n = codec.n(), qh = in.q_heads;
  if (qh < 1 || qh % codec.kv_heads() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q_heads ", qh, " is not a multiple of kv_heads ", codec.kv_heads()));
  }
  if (in.query_tokens > in.tokens) {
    return absl::InvalidArgumentError(absl::StrCat("query tokens ", in.query_tokens, " exceed tokens ", in.tokens));
  }
  const double scale = in.softmax_scale > 0 ? in.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));
  const auto* dq = dynamic_cast<const DQuantKvCodec*>(&codec);
  // D-Quant behind a WUSH stage also attends in the compressed domain.
  const auto* tq = dynamic_cast<const TransformedKvCodec*>(&codec);
  if (tq != nullptr && dynamic_cast<const DQuantKvCodec*>(&tq->inner()) == nullptr) {
    tq = nullptr;
  }
  std::vector<double> ref(static_cast<size_t>(qh) * d), ref_lse(qh), alt(ref.size()), alt_lse(qh);
  std::vector<float> out(ref.size()), lse(qh);
  AttentionScratch scratch;
  for (int64_t i = 0; i < in.query_tokens; ++i) {
    const int64_t pos = in.tokens - in.query_tokens + i;
    const float* q = in.queries + i * qh * d;
    ReferenceAttention(in.keys, values, pos + 1, codec.kv_heads(), d, q, qh, scale, ref.data(), ref_lse.data());
    if (dq != nullptr || tq != nullptr) {
      const std::vector<CompressedBlock> blocks = LayerBlocks(codec, enc, pos + 1);
      Bf16Tokens window;
      window.keys = enc.window_keys.data();
      window.values = enc.window_values.data();
      window.tokens = std::max<int64_t>(0, pos + 1 - enc.compressed);
      absl::Status st = dq != nullptr
                            ? CompressedAttention(dq->codec(), blocks, window, q, qh, static_cast<float>(scale),
                                                  out.data(), lse.data(), &scratch)
                            : TransformedCompressedAttention(*tq, blocks, window, q, qh, static_cast<float>(scale),
                                                             out.data(), lse.data(), &scratch);
      // Folded: o' = T_V o, what the folded o_proj reads; o = T_V^-1 o'.
      if (unfold != nullptr) unfold->Outputs(out.data(), qh, out.data());
      for (size_t j = 0; j < out.size(); ++j) alt[j] = out[j];
    } else {
      ReferenceAttention(khat.data(), vhat.data(), pos + 1, codec.kv_heads(), d, q, qh, scale, alt.data(),
                         alt_lse.data());
      if (unfold != nullptr) {  // the same mapping, in float as above
        for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(alt[j]);
        unfold->Outputs(out.data(), qh, out.data());
        for (size_t j = 0; j < out.size(); ++j) alt[j] = out[j];
      }
    }
    for (size_t j = 0; j < ref.size(); ++j) {
      acc->attn_err += (ref[j] - alt[j]) * (ref[j] - alt[j]);
      acc->attn_sum += ref[j] * ref[j];
    }
  }
  (void)n;
  acc->has_attention = true;
  return absl::OkStatus();
}

}  // namespace

absl::Status EvaluateLayer(const KvCodec& codec, const EvalLayerInput& in, EvalAccumulator* acc,
                           EncodedLayer* encoded) {
  const int64_t n = codec.n();
  // Folded values (eval_lib.h): `stored` goes to the codec (v'), `model` is
  // the reference (v).
  const auto* folded = dynamic_cast<const TransformedKvCodec*>(&codec);
  if (folded != nullptr && !folded->values_folded()) folded = nullptr;
  const LayerTransform* unfold = folded != nullptr ? &folded->transform() : nullptr;
  std::vector<float> converted;
  const float* stored = in.values;
  const float* model = in.values;
  if (unfold != nullptr) {
    converted.resize(in.tokens * n);
    unfold->Apply(in.values_already_folded ? Mat::kValueInverse : Mat::kValue, in.values, in.tokens, converted.data());
    if (in.values_already_folded) {
      model = converted.data();
    } else {
      stored = converted.data();
    }
  }
  EncodedLayer enc;
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = EncodeLayer(codec, in.keys, stored, in.tokens, in.residual, in.threads, &enc, &acc->stats);
  if (!st.ok()) return st;
  acc->encode_seconds += Seconds(t0);
  acc->encoded_streams += 2 * enc.compressed;

  std::vector<float> khat(in.tokens * n), vhat(in.tokens * n);
  const auto t1 = std::chrono::steady_clock::now();
  st = DecodeLayer(codec, enc, khat.data(), vhat.data());
  if (!st.ok()) return st;
  acc->decode_seconds += Seconds(t1);
  // Folded: vhat is vhat'; the model's reconstruction is T_V^-1 vhat' (the
  // same product an unfolded TransformedKvCodec's DecodeBlock computes).
  std::vector<float> vhat_model;
  if (unfold != nullptr) {
    vhat_model.resize(vhat.size());
    unfold->Apply(Mat::kValueInverse, vhat.data(), in.tokens, vhat_model.data());
  }
  const float* vm = unfold != nullptr ? vhat_model.data() : vhat.data();

  for (int64_t i = 0; i < in.tokens * n; ++i) {
    const double dk = static_cast<double>(in.keys[i]) - khat[i];
    const double dv = static_cast<double>(model[i]) - vm[i];
    acc->err_k += dk * dk;
    acc->sum_k += static_cast<double>(in.keys[i]) * in.keys[i];
    acc->err_v += dv * dv;
    acc->sum_v += static_cast<double>(model[i]) * model[i];
  }
  acc->key_bytes += enc.key_bytes();
  acc->value_bytes += enc.value_bytes();
  acc->values += in.tokens * n;
  if (in.queries != nullptr && in.query_tokens > 0) {
    st = MeasureAttention(codec, in, model, enc, khat, vhat, unfold, acc);
    if (!st.ok()) return st;
  }
  if (encoded != nullptr) *encoded = std::move(enc);
  return absl::OkStatus();
}

std::string EvalJson(const KvCodec& codec, const EvalAccumulator& a) {
  const StreamStats& k = a.stats.keys;
  const StreamStats& v = a.stats.values;
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  const double bk = ratio(8.0 * a.key_bytes, a.values), bv = ratio(8.0 * a.value_bytes, a.values);
  std::string json = absl::StrFormat(
      "{\"codec\":\"%s\",\"bits_per_value\":{\"k\":%.6f,\"v\":%.6f,\"mean\":%.6f},"
      "\"nmse_k\":%.6g,\"nmse_v\":%.6g,\"drift_rate_k\":%.6g,\"drift_rate_v\":%.6g,"
      "\"max_drift_levels\":%d,\"budget_utilization_k\":%.6g,\"budget_utilization_v\":%.6g,"
      "\"overflow_retries\":%d,\"fallback_streams\":%d,\"constant_streams\":%d,\"streams\":%d,"
      "\"encode_streams_per_s\":%.1f,\"decode_streams_per_s\":%.1f",
      codec.name(), bk, bv, 0.5 * (bk + bv), ratio(a.err_k, a.sum_k), ratio(a.err_v, a.sum_v),
      ratio(k.moved, k.symbols), ratio(v.moved, v.symbols), std::max(k.max_move, v.max_move),
      ratio(k.bytes_used, k.bytes_budget), ratio(v.bytes_used, v.bytes_budget), static_cast<int>(k.retries + v.retries),
      static_cast<int>(k.fallbacks + v.fallbacks), static_cast<int>(k.constant + v.constant),
      static_cast<int>(a.encoded_streams), ratio(a.encoded_streams, a.encode_seconds),
      ratio(a.encoded_streams, a.decode_seconds));
  if (a.has_attention) {
    absl::StrAppendFormat(&json, ",\"attn_rel_err\":%.6g", std::sqrt(ratio(a.attn_err, a.attn_sum)));
  }
  json += "}";
  return json;
}

}  // namespace driftkv
