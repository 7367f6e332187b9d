// WUSH-KV: the linear algebra, the transform construction, the
// exactness of the transform stage without quantization, calibration
// determinism, the transforms file, error messages, and the synthetic spike
// case where WUSH must beat Hadamard with int --bits 2.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/encoded_layer.h"
#include "codec/registry.h"
#include "codec/transform/linalg.h"
#include "codec/transform/transform.h"
#include "codec/transform/transform_attention.h"
#include "codec/transform/transforms_file.h"
#include "codec/transform/wush.h"
#include "eval/codec_eval.h"
#include "eval/synthetic_kv.h"
#include "eval/wush_calibrator.h"
#include "eval/wush_eval.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

std::vector<float> Gaussian(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// Random SPD d x d: A A^T / d + 0.1 I.
std::vector<double> RandomSpd(int d, uint64_t seed) {
  const std::vector<float> a = Gaussian(static_cast<size_t>(d) * d, seed);
  std::vector<double> m(static_cast<size_t>(d) * d, 0.0);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      for (int k = 0; k < d; ++k) m[i * d + j] += static_cast<double>(a[i * d + k]) * a[j * d + k] / d;
    }
    m[i * d + i] += 0.1;
  }
  return m;
}

TEST(LinalgTest, CholeskyAndEigenReconstruct) {
  const int d = 24;
  const std::vector<double> a = RandomSpd(d, 1);
  std::vector<double> l(d * d), w(d), v(d * d), r(d * d);
  ASSERT_TRUE(linalg::Cholesky(a.data(), d, l.data()).ok());
  const std::vector<double> lt = linalg::Transpose(l.data(), d);
  linalg::MatMul(l.data(), lt.data(), d, r.data());
  for (int i = 0; i < d * d; ++i) EXPECT_NEAR(r[i], a[i], 1e-12);
  ASSERT_TRUE(linalg::SymmetricEigen(a.data(), d, w.data(), v.data()).ok());
  for (int i = 1; i < d; ++i) EXPECT_GE(w[i - 1], w[i]);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      double s = 0.0;
      for (int k = 0; k < d; ++k) s += v[i * d + k] * w[k] * v[j * d + k];
      EXPECT_NEAR(s, a[i * d + j], 1e-10);
    }
  }
  std::vector<double> bad(d * d, 0.0);
  EXPECT_EQ(linalg::Cholesky(bad.data(), d, l.data()).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(WushTransformTest, InverseBalanceAndNorm) {
  const int d = 32;
  const std::vector<double> m = RandomSpd(d, 2), h = RandomSpd(d, 3);
  absl::StatusOr<WushTransform> t = BuildWushTransform(m, h, d);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<double> p(d * d);
  linalg::MatMul(t->t.data(), t->inv.data(), d, p.data());
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) EXPECT_NEAR(p[i * d + j], i == j ? 1.0 : 0.0, 1e-10);
  }
  // Damped statistics as BuildWushTransform uses them.
  double tm = 0.0, th = 0.0;
  for (int i = 0; i < d; ++i) tm += m[i * d + i], th += h[i * d + i];
  std::vector<double> md = m, hd = h;
  for (int i = 0; i < d; ++i) md[i * d + i] += kWushDefaultGamma * tm / d, hd[i * d + i] += kWushDefaultGamma * th / d;
  // diag(T Md T^T) and diag(T^-T Hd T^-1) are constant (Had Lambda^(1/2) Had).
  std::vector<double> a(d * d), b(d * d);
  const std::vector<double> tt = linalg::Transpose(t->t.data(), d), it = linalg::Transpose(t->inv.data(), d);
  linalg::MatMul(t->t.data(), md.data(), d, a.data());
  linalg::MatMul(a.data(), tt.data(), d, b.data());
  std::vector<double> c(d * d), e(d * d);
  linalg::MatMul(it.data(), hd.data(), d, c.data());
  linalg::MatMul(c.data(), t->inv.data(), d, e.data());
  for (int i = 1; i < d; ++i) {
    EXPECT_NEAR(b[i * d + i], b[0], 1e-9 * b[0]);
    EXPECT_NEAR(e[i * d + i], e[0], 1e-9 * e[0]);
  }
  // c keeps the Frobenius norm of the (undamped) calibration data.
  linalg::MatMul(t->t.data(), m.data(), d, a.data());
  linalg::MatMul(a.data(), tt.data(), d, b.data());
  double tr = 0.0;
  for (int i = 0; i < d; ++i) tr += b[i * d + i];
  EXPECT_NEAR(tr, tm, 1e-9 * tm);
}

// A calibrated set for 2 layers, 2 KV heads, 4 query heads, head_dim 64.
TransformSet Calibrated(uint64_t seed, bool with_wo) {
  const int L = 2, H = 2, N = 4, D = 64;
  const int64_t T = 300, Tq = 200;
  absl::StatusOr<WushCalibrator> c = WushCalibrator::Create(L, H, N, D);
  EXPECT_TRUE(c.ok());
  for (int l = 0; l < L; ++l) {
    std::vector<float> k = Gaussian(T * H * D, seed + 10 * l), v = Gaussian(T * H * D, seed + 10 * l + 1);
    std::vector<float> q = Gaussian(Tq * N * D, seed + 10 * l + 2);
    for (int64_t t = 0; t < T; ++t) k[t * H * D + 5] += 6.0f;  // an outlier channel
    EXPECT_TRUE(c->AddLayer(l, k.data(), v.data(), T, q.data(), Tq).ok());
    if (with_wo) {
      const std::vector<float> wo = Gaussian(96 * N * D, seed + 10 * l + 3);
      EXPECT_TRUE(c->AddOutputProjection(l, wo.data(), 96).ok());
    }
  }
  absl::StatusOr<TransformSet> s = c->Build();
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(TransformStageTest, ScoresAndOutputsExactWithoutQuantization) {
  const TransformSet set = Calibrated(7, true);
  absl::StatusOr<LayerTransform> t = LayerTransform::FromSet(set, 1);
  ASSERT_TRUE(t.ok());
  const int H = 2, N = 4, D = 64;
  const int64_t T = 97;
  const std::vector<float> k = Gaussian(T * H * D, 100, 2.0f), v = Gaussian(T * H * D, 101);
  const std::vector<float> q = Gaussian(N * D, 102);
  std::vector<float> k2(k.size()), v2(v.size()), q2(q.size());
  t->Apply(Mat::kKey, k.data(), T, k2.data());
  t->Apply(Mat::kValue, v.data(), T, v2.data());
  t->Queries(q.data(), N, q2.data());
  // q'.k' = q.k for every (query head, token).
  for (int g = 0; g < N; ++g) {
    for (int64_t i = 0; i < T; ++i) {
      double a = 0.0, b = 0.0, scale = 0.0;
      for (int j = 0; j < D; ++j) {
        a += static_cast<double>(q[g * D + j]) * k[(i * H + g / 2) * D + j];
        b += static_cast<double>(q2[g * D + j]) * k2[(i * H + g / 2) * D + j];
        scale += std::fabs(static_cast<double>(q[g * D + j]) * k[(i * H + g / 2) * D + j]);
      }
      EXPECT_NEAR(a, b, 1e-5 * scale);
    }
  }
  // Attention in the transformed domain, mapped back by T_V^-1, equals
  // attention in the model's domain to float precision.
  std::vector<double> ref(N * D), ref_lse(N), alt(N * D), alt_lse(N);
  ReferenceAttention(k.data(), v.data(), T, H, D, q.data(), N, 0.125, ref.data(), ref_lse.data());
  ReferenceAttention(k2.data(), v2.data(), T, H, D, q2.data(), N, 0.125, alt.data(), alt_lse.data());
  std::vector<float> o2(alt.begin(), alt.end()), o(N * D);
  t->Outputs(o2.data(), N, o.data());
  double err = 0.0, norm = 0.0;
  for (int i = 0; i < N * D; ++i) err += (o[i] - ref[i]) * (o[i] - ref[i]), norm += ref[i] * ref[i];
  EXPECT_LT(std::sqrt(err / norm), 1e-5);
  for (int g = 0; g < N; ++g) EXPECT_NEAR(ref_lse[g], alt_lse[g], 1e-4);
  // Inverses: T^-1 T k = k.
  std::vector<float> back(k.size());
  t->Apply(Mat::kKeyInverse, k2.data(), T, back.data());
  for (size_t i = 0; i < k.size(); ++i) EXPECT_NEAR(back[i], k[i], 1e-4);
}

TEST(TransformStageTest, WrappedCodecDecodesToTheModelDomain) {
  const TransformSet set = Calibrated(8, false);
  CodecOptions o;
  o.name = "int";
  o.bits = 8;
  o.kv_heads = 2;
  o.head_dim = 64;
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeTransformedCodec(o, TransformKind::kWush, &set, 0, false);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const int64_t T = 130, n = 128;
  const std::vector<float> k = Gaussian(T * n, 5), v = Gaussian(T * n, 6);
  EncodedLayer enc;
  ASSERT_TRUE(EncodeLayer(**codec, k.data(), v.data(), T, 2, 1, &enc, nullptr).ok());
  std::vector<float> kh(T * n), vh(T * n);
  ASSERT_TRUE(DecodeLayer(**codec, enc, kh.data(), vh.data()).ok());
  double ek = 0, ev = 0, sk = 0, sv = 0;
  for (int64_t i = 0; i < T * n; ++i) {
    ek += (k[i] - kh[i]) * (k[i] - kh[i]), sk += k[i] * k[i];
    ev += (v[i] - vh[i]) * (v[i] - vh[i]), sv += v[i] * v[i];
  }
  EXPECT_LT(ek / sk, 1e-3);  // INT8: small error only if T^-1 undid T
  EXPECT_LT(ev / sv, 1e-3);
}

// D-Quant behind WUSH, attended in the compressed domain (q' = T_K^-T q,
// o = T_V^-1 o', bf16 window in the model's domain), equals float64
// attention over the decoded cache.
TEST(TransformStageTest, CompressedAttentionMatchesDecodedCache) {
  const TransformSet set = Calibrated(10, true);
  CodecOptions o;
  o.kv_heads = 2;
  o.head_dim = 64;
  absl::StatusOr<std::unique_ptr<KvCodec>> made = MakeTransformedCodec(o, TransformKind::kWush, &set, 1, false);
  ASSERT_TRUE(made.ok()) << made.status();
  const auto& codec = dynamic_cast<const TransformedKvCodec&>(**made);
  const int64_t T = 300, window = 44, n = 128;
  const int N = 4, d = 64;
  const std::vector<float> k = Gaussian(T * n, 20), v = Gaussian(T * n, 21), q = Gaussian(N * d, 22, 0.5f);
  EncodedLayer enc;
  ASSERT_TRUE(EncodeLayer(codec, k.data(), v.data(), T, window, 1, &enc, nullptr).ok());
  std::vector<float> kh(T * n), vh(T * n);
  ASSERT_TRUE(DecodeLayer(codec, enc, kh.data(), vh.data()).ok());
  const std::vector<CompressedBlock> blocks = LayerBlocks(codec, enc, enc.compressed);
  Bf16Tokens w;
  w.keys = enc.window_keys.data();
  w.values = enc.window_values.data();
  w.tokens = window;
  std::vector<float> out(N * d), lse(N);
  AttentionScratch scratch;
  ASSERT_TRUE(
      TransformedCompressedAttention(codec, blocks, w, q.data(), N, 0.125f, out.data(), lse.data(), &scratch).ok());
  std::vector<double> ref(N * d), ref_lse(N);
  ReferenceAttention(kh.data(), vh.data(), T, 2, d, q.data(), N, 0.125, ref.data(), ref_lse.data());
  double err = 0.0, norm = 0.0;
  for (int i = 0; i < N * d; ++i) err += (out[i] - ref[i]) * (out[i] - ref[i]), norm += ref[i] * ref[i];
  EXPECT_LT(std::sqrt(err / norm), 1e-4);
  for (int h = 0; h < N; ++h) EXPECT_NEAR(lse[h], ref_lse[h], 1e-3);
}

// --values-folded in driftkv-codec eval: EvaluateLayer simulates
// the folded model (stores v' = T_V v, maps vhat' and the attention output
// o' back by T_V^-1) and reports the unfolded codec's errors up to float
// rounding, through the decoded cache (int) and D-Quant's compressed-domain
// path; given v' itself (values_already_folded, encode's case) the same.
// Coding the model's v unrotated instead (the evaluation before) fails this.
TEST(FoldedValuesEvalTest, ModelDomainErrorsMatchUnfolded) {
  const TransformSet set = Calibrated(30, true);
  const int64_t T = 300, Tq = 40, n = 128;
  const int N = 4;
  std::vector<float> k = Gaussian(T * n, 31), v = Gaussian(T * n, 32), q = Gaussian(Tq * N * 64, 33, 0.5f);
  // Uneven value channels, so that no orthogonal-like map codes them alike.
  for (int64_t i = 0; i < T * n; ++i) v[i] *= 0.25f + 2.0f * ((i % 64) % 7 == 0);
  absl::StatusOr<LayerTransform> t = LayerTransform::FromSet(set, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<float> vf(v.size());
  t->Apply(Mat::kValue, v.data(), T, vf.data());
  auto rel = [](double a, double b) { return std::abs(a - b) / b; };
  for (const char* name : {"int", "dquant"}) {
    for (int64_t residual : {0, 44}) {
      SCOPED_TRACE(std::string(name) + " residual " + std::to_string(residual));
      CodecOptions o;
      o.name = name;
      o.bits = 2;
      o.kv_heads = 2;
      o.head_dim = 64;
      absl::StatusOr<std::unique_ptr<KvCodec>> unfolded = MakeTransformedCodec(o, TransformKind::kWush, &set, 1, false);
      absl::StatusOr<std::unique_ptr<KvCodec>> folded = MakeTransformedCodec(o, TransformKind::kWush, &set, 1, true);
      ASSERT_TRUE(unfolded.ok() && folded.ok());
      EvalLayerInput in;
      in.keys = k.data();
      in.values = v.data();
      in.tokens = T;
      in.queries = q.data();
      in.query_tokens = Tq;
      in.q_heads = N;
      in.residual = residual;
      EvalAccumulator a, b, c;
      ASSERT_TRUE(EvaluateLayer(**unfolded, in, &a, nullptr).ok());
      ASSERT_TRUE(EvaluateLayer(**folded, in, &b, nullptr).ok());
      EvalLayerInput given = in;
      given.values = vf.data();
      given.values_already_folded = true;
      ASSERT_TRUE(EvaluateLayer(**folded, given, &c, nullptr).ok());
      // The window holds bf16(v') instead of bf16(v): a little more slack.
      const double tol = residual > 0 ? 1e-3 : 1e-5;
      EXPECT_EQ(a.err_k, b.err_k);
      EXPECT_LT(rel(b.err_v / b.sum_v, a.err_v / a.sum_v), tol);
      EXPECT_LT(rel(b.attn_err / b.attn_sum, a.attn_err / a.attn_sum), tol);
      EXPECT_LT(rel(c.err_v / c.sum_v, a.err_v / a.sum_v), tol);
      EXPECT_LT(rel(c.attn_err / c.attn_sum, a.attn_err / a.attn_sum), tol);
      EXPECT_EQ(a.value_bytes, b.value_bytes);
    }
  }
}

TEST(CalibrationTest, DeterministicAndFileRoundTrips) {
  const std::string a = SerializeTransforms(Calibrated(9, true));
  const std::string b = SerializeTransforms(Calibrated(9, true));
  EXPECT_EQ(a, b);
  absl::StatusOr<TransformSet> parsed = ParseTransforms(a);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(SerializeTransforms(*parsed), a);
  EXPECT_EQ(parsed->flags, kTransformsFlagValueWo);
  EXPECT_EQ(parsed->gamma, kWushDefaultGamma);
  EXPECT_EQ(parsed->calibration_tokens, 300u);

  std::string flipped = a;
  flipped[kTransformsHeaderBytes + 1000] ^= 0x10;
  EXPECT_EQ(ParseTransforms(flipped).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(ParseTransforms(flipped).status().message().find("checksum"), std::string::npos);
  EXPECT_EQ(ParseTransforms(a.substr(0, a.size() - 3)).status().code(), absl::StatusCode::kDataLoss);
  std::string version = a;
  version[8] = 9;
  EXPECT_NE(ParseTransforms(version).status().message().find("version 9"), std::string::npos);
  std::string magic = a;
  magic[0] = 'X';
  EXPECT_NE(ParseTransforms(magic).status().message().find("magic"), std::string::npos);
}

// With --center-keys W the key statistics ignore each W-token block's mean:
// keys shifted by a constant per block give the same transforms.
TEST(CalibrationTest, CenteredKeysIgnoreBlockMeans) {
  const int H = 1, N = 2, D = 16;
  const int64_t T = 64;
  std::vector<float> k = Gaussian(T * D, 11), v = Gaussian(T * D, 12), q = Gaussian(T * N * D, 13);
  std::vector<float> shifted = k;
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < D; ++j) shifted[t * D + j] += (t < 32 ? 5.0f : -3.0f) * (j % 3);
  }
  std::vector<float> out[2];
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<WushCalibrator> c = WushCalibrator::Create(1, H, N, D);
    c->set_key_center_window(32);
    ASSERT_TRUE(c->AddLayer(0, i ? shifted.data() : k.data(), v.data(), T, q.data(), T).ok());
    absl::StatusOr<TransformSet> s = c->Build();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->key_center_window, 32u);
    absl::StatusOr<TransformSet> back = ParseTransforms(SerializeTransforms(*s));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->key_center_window, 32u);
    out[i] = s->data;
  }
  // Equal up to the float rounding of the shifted keys.
  for (size_t i = 0; i < out[0].size(); ++i) EXPECT_NEAR(out[0][i], out[1][i], 1e-3 * (1 + std::fabs(out[0][i])));
}

TEST(CalibrationTest, ClearErrors) {
  EXPECT_EQ(WushCalibrator::Create(1, 3, 4, 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WushCalibrator::Create(1, 2, 4, 48).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<WushCalibrator> c = WushCalibrator::Create(1, 1, 2, 16);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->AddLayer(1, nullptr, nullptr, 0, nullptr, 0).code(), absl::StatusCode::kInvalidArgument);
  // Keys and values but no queries: the key Hessian is singular.
  const std::vector<float> k = Gaussian(64 * 16, 1);
  ASSERT_TRUE(c->AddLayer(0, k.data(), k.data(), 64, nullptr, 0).ok());
  absl::StatusOr<TransformSet> s = c->Build();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("layer 0 kv head 0 keys: Hessian is singular"), std::string::npos) << s.status();
  // All-zero keys: the Gram matrix is singular.
  absl::StatusOr<WushCalibrator> z = WushCalibrator::Create(1, 1, 2, 16);
  const std::vector<float> zeros(64 * 16, 0.0f), q = Gaussian(64 * 2 * 16, 2);
  ASSERT_TRUE(z->AddLayer(0, zeros.data(), k.data(), 64, q.data(), 64).ok());
  s = z->Build();
  EXPECT_NE(s.status().message().find("Gram matrix is singular"), std::string::npos) << s.status();
  // Shape mismatches.
  EXPECT_EQ(BuildWushTransform(std::vector<double>(10), std::vector<double>(16 * 16), 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  const TransformSet set = Calibrated(3, false);
  EXPECT_EQ(LayerTransform::FromSet(set, 2).status().code(), absl::StatusCode::kInvalidArgument);
  CodecOptions o;
  o.name = "int";
  o.kv_heads = 4;
  o.head_dim = 64;
  absl::StatusOr<std::unique_ptr<KvCodec>> wrong = MakeTransformedCodec(o, TransformKind::kWush, &set, 0, false);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("transforms are for 2 kv heads"), std::string::npos);
  o.rotation = "random";
  EXPECT_EQ(MakeKvCodec(o).status().code(), absl::StatusCode::kInvalidArgument);
}

// The seed's failure mode (eval/synthetic_kv.h): WUSH, calibrated on eight
// draws, beats Hadamard with int --bits 2 on another draw.
TEST(SpikeCaseTest, WushBeatsHadamardWithInt2) {
  SpikeOptions so;
  absl::StatusOr<WushCalibrator> c = WushCalibrator::Create(1, so.kv_heads, so.q_heads, so.head_dim);
  for (int i = 0; i < 8; ++i) {  // 8192 calibration tokens, as wush-ablation
    so.seed = 1 + 1000 * i;
    const SpikeCase cal = MakeSpikeCase(so);
    ASSERT_TRUE(
        c->AddLayer(0, cal.keys.data(), cal.values.data(), so.tokens, cal.queries.data(), so.query_tokens).ok());
  }
  absl::StatusOr<TransformSet> set = c->Build();
  ASSERT_TRUE(set.ok());
  so.seed = 2;
  const SpikeCase ev = MakeSpikeCase(so);
  AblationInput in;
  in.keys = ev.keys.data();
  in.values = ev.values.data();
  in.tokens = so.tokens;
  in.queries = ev.queries.data();
  in.query_tokens = so.query_tokens;
  in.kv_heads = so.kv_heads;
  in.q_heads = so.q_heads;
  in.head_dim = so.head_dim;
  const std::vector<float> ref = AttentionOutputs(in, in.keys, in.values);
  CodecOptions o;
  o.name = "int";
  o.bits = 2;
  o.kv_heads = so.kv_heads;
  o.head_dim = so.head_dim;
  AblationErrors had, wush;
  absl::StatusOr<std::unique_ptr<KvCodec>> h = MakeTransformedCodec(o, TransformKind::kHadamard, nullptr, 0, false);
  absl::StatusOr<std::unique_ptr<KvCodec>> w = MakeTransformedCodec(o, TransformKind::kWush, &*set, 0, false);
  ASSERT_TRUE(h.ok() && w.ok());
  ASSERT_TRUE(MeasureAblation(**h, in, ref, &had).ok());
  ASSERT_TRUE(MeasureAblation(**w, in, ref, &wush).ok());
  EXPECT_LT(wush.attention(kKeysOnly), had.attention(kKeysOnly));
  EXPECT_LT(wush.attention(kBoth), had.attention(kBoth));
}

}  // namespace
}  // namespace driftkv
