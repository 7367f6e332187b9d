// Layer-level D-Quant: the quality bars of docs/quality.md on i.i.d. normal data,
// compressed-domain attention against attention over the decoded cache,
// configuration errors, and the pool file.
#include <cmath>
#include <random>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/dquant_kv_codec.h"
#include "codec/encoded_layer.h"
#include "codec/hadamard.h"
#include "codec/pool_file.h"
#include "codec/registry.h"
#include "gtest/gtest.h"
#include "wire/half.h"

namespace driftkv {
namespace {

std::unique_ptr<KvCodec> Make(int heads, int dim, int window = 128, Refit value_refit = kDefaultValueRefit) {
  CodecOptions o;
  o.value_refit = value_refit;
  o.kv_heads = heads;
  o.head_dim = dim;
  o.mean_window = window;
  absl::StatusOr<std::unique_ptr<KvCodec>> c = MakeKvCodec(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

std::vector<float> Normal(int64_t count, uint64_t seed, float mean = 0.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(count);
  for (float& v : x) v = mean + nd(rng);
  return x;
}

TEST(Hadamard, IsOrthonormalAndSelfInverse) {
  std::vector<float> x = Normal(128, 1), y = x;
  HadamardInPlace(y.data(), 128);
  double nx = 0, ny = 0;
  for (int i = 0; i < 128; ++i) {
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  EXPECT_NEAR(nx, ny, 1e-4 * nx);
  HadamardInPlace(y.data(), 128);
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(x[i], y[i], 1e-5);
}

// The quality bars (docs/quality.md, first table): i.i.d. standard normal
// keys and values, T = 512, H = 8, D = 128, default settings. nmse_v <= 0.140
// is the bar of the paper's Algorithm 1 (least-squares value grid); the
// default unbiased grid gives up some NMSE (0.151 here) for reconstructions
// that are not contracted, which the model prefers (docs/quality.md), and
// is held to 0.160.
void CheckIidNormalBars(Refit value_refit, double nmse_v_bar) {
  auto codec = Make(8, 128, 128, value_refit);
  const int64_t T = 512, n = 1024;
  std::vector<float> k = Normal(T * n, 10), v = Normal(T * n, 20);
  EncodedLayer enc;
  CodecStats stats;
  ASSERT_TRUE(EncodeLayer(*codec, k.data(), v.data(), T, 0, 2, &enc, &stats).ok());
  std::vector<float> kh(T * n), vh(T * n);
  ASSERT_TRUE(DecodeLayer(*codec, enc, kh.data(), vh.data()).ok());
  double ek = 0, sk = 0, ev = 0, sv = 0;
  for (int64_t i = 0; i < T * n; ++i) {
    ek += (k[i] - kh[i]) * (k[i] - kh[i]);
    sk += k[i] * k[i];
    ev += (v[i] - vh[i]) * (v[i] - vh[i]);
    sv += v[i] * v[i];
  }
  const double bits = 8.0 * (enc.key_bytes() + enc.value_bytes()) / (2.0 * T * n);
  EXPECT_LE(ek / sk, 0.066);
  EXPECT_LE(ev / sv, nmse_v_bar);
  EXPECT_EQ(stats.keys.retries + stats.values.retries, 0);
  EXPECT_LE(static_cast<double>(stats.keys.moved) / stats.keys.symbols, 0.07);
  EXPECT_LE(static_cast<double>(stats.values.moved) / stats.values.symbols, 0.10);
  EXPECT_LE(std::max(stats.keys.max_move, stats.values.max_move), 1);
  EXPECT_NEAR(bits, 2.26, 0.02);
}

TEST(DQuant, IidNormalMeetsTheQualityBars) {
  CheckIidNormalBars(kDefaultValueRefit, 0.160);
}

TEST(DQuant, IidNormalMeetsThePapersBarsWithLeastSquares) {
  CheckIidNormalBars(Refit::kLeastSquares, 0.140);
}

// Attention through eq. (8)/(9) must equal attention over the decoded cache.
// Both use the same stored data, so the only difference is float rounding:
// the float32 path accumulates ~D products per score and ~T per output, so
// relative differences stay near 1e-5; 2e-4 leaves room without hiding a
// real error (a single wrong level moves outputs by >1e-2).
TEST(DQuant, CompressedAttentionEqualsAttentionOverDecodedCache) {
  for (int q_heads : {4, 16}) {
    for (int64_t T : {1, 97, 300}) {
      for (int64_t window : {0, 5}) {
        if (window > T) continue;
        auto codec = Make(4, 64, 32);
        const int64_t n = 256;
        std::vector<float> k = Normal(T * n, T, 0.7f), v = Normal(T * n, T + 1);
        EncodedLayer enc;
        ASSERT_TRUE(EncodeLayer(*codec, k.data(), v.data(), T, window, 1, &enc, nullptr).ok());
        std::vector<float> kh(T * n), vh(T * n);
        ASSERT_TRUE(DecodeLayer(*codec, enc, kh.data(), vh.data()).ok());
        std::vector<float> q = Normal(q_heads * 64, 99);
        for (float& x : q) x *= 0.3f;
        const std::vector<CompressedBlock> blocks = LayerBlocks(*codec, enc, enc.compressed);
        Bf16Tokens win{enc.window_keys.data(), enc.window_values.data(), enc.window};
        std::vector<float> out(q_heads * 64, NAN), lse(q_heads, NAN);
        AttentionScratch scratch;
        const auto& dq = static_cast<const DQuantKvCodec&>(*codec).codec();
        ASSERT_TRUE(
            CompressedAttention(dq, blocks, win, q.data(), q_heads, 0.125f, out.data(), lse.data(), &scratch).ok());
        std::vector<double> ref(q_heads * 64), ref_lse(q_heads);
        ReferenceAttention(kh.data(), vh.data(), T, 4, 64, q.data(), q_heads, 0.125, ref.data(), ref_lse.data());
        double err = 0, norm = 0;
        for (size_t j = 0; j < ref.size(); ++j) {
          err += (out[j] - ref[j]) * (out[j] - ref[j]);
          norm += ref[j] * ref[j];
        }
        EXPECT_LE(std::sqrt(err / norm), 2e-4) << "q_heads " << q_heads << " T " << T;
        for (int h = 0; h < q_heads; ++h) EXPECT_NEAR(lse[h], ref_lse[h], 1e-4 * (1 + std::fabs(ref_lse[h])));
      }
    }
  }
}

// Without the rotation the codec quantises the model's coordinates directly
// (for callers that apply their own transform); head_dim then need not be a
// power of two, and the compressed path still equals the decoded one.
TEST(DQuant, IdentityRotation) {
  CodecOptions o;
  o.kv_heads = 2;
  o.head_dim = 48;
  o.rotation = "identity";
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(o);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const int64_t T = 60, n = 96;
  std::vector<float> k = Normal(T * n, 3), v = Normal(T * n, 4);
  EncodedLayer enc;
  ASSERT_TRUE(EncodeLayer(**codec, k.data(), v.data(), T, 0, 1, &enc, nullptr).ok());
  std::vector<float> kh(T * n), vh(T * n);
  ASSERT_TRUE(DecodeLayer(**codec, enc, kh.data(), vh.data()).ok());
  double err = 0, sum = 0;
  for (int64_t i = 0; i < T * n; ++i) {
    err += (k[i] - kh[i]) * (k[i] - kh[i]);
    sum += k[i] * k[i];
  }
  // n = 96: the default containers code the reference's bits per value
  // (docs/api.md "Default containers"), so the error is about the n = 1024
  // figure (0.062; 0.041 here); a broken path gives O(1).
  EXPECT_LT(err / sum, 0.15);
  const auto& dq = static_cast<const DQuantKvCodec&>(**codec).codec();
  const std::vector<CompressedBlock> blocks = LayerBlocks(**codec, enc, enc.compressed);
  std::vector<float> q = Normal(4 * 48, 5), out(4 * 48), lse(4);
  AttentionScratch s;
  ASSERT_TRUE(CompressedAttention(dq, blocks, Bf16Tokens{}, q.data(), 4, 0.14f, out.data(), lse.data(), &s).ok());
  std::vector<double> ref(4 * 48), ref_lse(4);
  ReferenceAttention(kh.data(), vh.data(), T, 2, 48, q.data(), 4, 0.14, ref.data(), ref_lse.data());
  for (int j = 0; j < 4 * 48; ++j) EXPECT_NEAR(out[j], ref[j], 2e-4 * (1 + std::fabs(ref[j])));
  o.rotation = "hadamard";
  EXPECT_FALSE(MakeKvCodec(o).ok());  // 48 is not a power of two
  o.rotation = "spin";
  EXPECT_FALSE(MakeKvCodec(o).ok());
}

TEST(DQuant, EmptyHistoryGivesZeroAndMinusInfinity) {
  auto codec = Make(2, 32);
  const auto& dq = static_cast<const DQuantKvCodec&>(*codec).codec();
  std::vector<float> q(4 * 32, 1.0f), out(4 * 32, NAN), lse(4, 0.0f);
  AttentionScratch s;
  ASSERT_TRUE(CompressedAttention(dq, {}, Bf16Tokens{}, q.data(), 4, 0.1f, out.data(), lse.data(), &s).ok());
  for (float x : out) EXPECT_EQ(x, 0.0f);
  for (float x : lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  EXPECT_EQ(CompressedAttention(dq, {}, Bf16Tokens{}, q.data(), 3, 0.1f, out.data(), lse.data(), &s).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DQuant, ConfigErrorsNameTheField) {
  CodecOptions o;
  o.kv_heads = 4;
  o.head_dim = 96;
  absl::StatusOr<std::unique_ptr<KvCodec>> c = MakeKvCodec(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("head_dim 96"), std::string::npos) << c.status();
  o.head_dim = 128;
  o.key_levels = 17;
  c = MakeKvCodec(o);
  EXPECT_NE(c.status().message().find("key_levels 17"), std::string::npos) << c.status();
  o.key_levels = 8;
  o.value_bytes = 10;
  c = MakeKvCodec(o);
  EXPECT_NE(c.status().message().find("too small"), std::string::npos) << c.status();
  o.value_bytes = 0;
  o.name = "zip";
  EXPECT_FALSE(MakeKvCodec(o).ok());
}

TEST(DQuant, NonFiniteInputNamesTheToken) {
  auto codec = Make(2, 32);
  std::vector<float> k = Normal(10 * 64, 1), v = Normal(10 * 64, 2);
  v[7 * 64 + 3] = INFINITY;
  EncodedLayer enc;
  absl::Status st = EncodeLayer(*codec, k.data(), v.data(), 10, 0, 1, &enc, nullptr);
  ASSERT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("value of token 7"), std::string::npos) << st;
}

TEST(DQuant, DefaultContainerKeepsBitsPerValue) {
  // From n = 512 up the default keeps the reference's stored bits.
  for (int n_heads : {4, 8, 16}) {
    auto codec = Make(n_heads, 128);
    const double bits = 0.5 * (codec->key_bits_per_value() + codec->value_bits_per_value());
    EXPECT_NEAR(bits, 2.26, 0.03) << n_heads;
  }
  // Below, it keeps the reference's coded bits instead, and stores more:
  // n = 256 records of 92 and 68 bytes, n = 128 of 52 and 40.
  EXPECT_NEAR(0.5 * (Make(2, 128)->key_bits_per_value() + Make(2, 128)->value_bits_per_value()), 2.53, 0.01);
  EXPECT_NEAR(0.5 * (Make(1, 128)->key_bits_per_value() + Make(1, 128)->value_bits_per_value()), 2.91, 0.01);
}

TEST(PoolFile, RoundTripsAndRejectsDamage) {
  auto codec = Make(2, 64, 16);
  Pool pool;
  pool.options.kv_heads = 2;
  pool.options.head_dim = 64;
  pool.options.mean_window = 16;
  pool.tokens = 40;
  for (int l = 0; l < 3; ++l) {
    std::vector<float> k = Normal(40 * 128, l), v = Normal(40 * 128, 10 + l);
    EncodedLayer e;
    ASSERT_TRUE(EncodeLayer(*codec, k.data(), v.data(), 40, 7, 1, &e, nullptr).ok());
    pool.layers.push_back(std::move(e));
  }
  pool.codec = std::move(codec);
  absl::StatusOr<std::string> bytes = SerializePool(pool);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<Pool> back = ParsePool(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->layers.size(), 3u);
  EXPECT_EQ(back->layers[2].key_records, pool.layers[2].key_records);
  EXPECT_EQ(back->layers[1].window_values, pool.layers[1].window_values);
  EXPECT_EQ(back->layers[0].side, pool.layers[0].side);

  std::string bad = *bytes;
  bad[0] = 'X';
  EXPECT_NE(ParsePool(bad).status().message().find("magic"), std::string::npos);
  bad = *bytes;
  bad[8] = 3;
  EXPECT_NE(ParsePool(bad).status().message().find("version 3"), std::string::npos);
  EXPECT_FALSE(ParsePool(bytes->substr(0, bytes->size() - 1)).ok());
  EXPECT_FALSE(ParsePool(bytes->substr(0, 50)).ok());
  bad = *bytes;
  bad[40] ^= 4;  // key_stride
  EXPECT_NE(ParsePool(bad).status().message().find("key_stride"), std::string::npos);
}

}  // namespace
}  // namespace driftkv
