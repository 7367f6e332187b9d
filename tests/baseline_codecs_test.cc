// Round-trip error bounds that follow from each baseline quantizer's math,
// true bits per value, and bad input, for the codecs of codec/baselines/
// constructed through the registry.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "codec/baselines/group_affine.h"
#include "codec/baselines/turbo_codec.h"
#include "codec/dquant_codec.h"
#include "codec/encoded_layer.h"
#include "codec/hadamard.h"
#include "codec/registry.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

constexpr int kHeads = 4, kDim = 128, kN = kHeads * kDim;
constexpr double kHalfEps = 1.0 / 2048;  // fp16 unit roundoff

struct Kv {
  std::vector<float> k, v;
};

// Keys with a channel mean and an outlier channel, values near N(0, 1).
Kv MakeKv(int tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  Kv kv;
  kv.k.resize(static_cast<size_t>(tokens) * kN);
  kv.v.resize(kv.k.size());
  for (int t = 0; t < tokens; ++t) {
    for (int j = 0; j < kN; ++j) {
      const float mean = (j % 7 == 0) ? 2.0f : 0.0f;
      const float spread = (j == 5) ? 8.0f : 1.0f;
      kv.k[static_cast<size_t>(t) * kN + j] = mean + spread * g(rng);
      kv.v[static_cast<size_t>(t) * kN + j] = g(rng);
    }
  }
  return kv;
}

std::unique_ptr<KvCodec> Make(const std::string& name, int bits = 2, int group = 128, int key_levels = 6,
                              int value_levels = 3) {
  CodecOptions o;
  o.name = name;
  o.kv_heads = kHeads;
  o.head_dim = kDim;
  o.bits = bits;
  o.group = group;
  o.key_levels = key_levels;
  o.value_levels = value_levels;
  absl::StatusOr<std::unique_ptr<KvCodec>> c = MakeKvCodec(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Encodes and decodes all tokens (no bf16 window).
Kv RoundTrip(const KvCodec& codec, const Kv& in, int tokens) {
  EncodedLayer enc;
  CodecStats stats;
  absl::Status st = EncodeLayer(codec, in.k.data(), in.v.data(), tokens, 0, 1, &enc, &stats);
  EXPECT_TRUE(st.ok()) << st;
  Kv out;
  out.k.resize(in.k.size());
  out.v.resize(in.v.size());
  st = DecodeLayer(codec, enc, out.k.data(), out.v.data());
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

std::vector<float> Rotated(const float* x) {
  std::vector<float> r(x, x + kN);
  HadamardHeads(r.data(), kHeads, kDim);
  return r;
}

double Nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    s += double(a[i]) * a[i];
  }
  return e / s;
}

// Min-max affine with `levels` levels over [lo, hi] and fp16 metadata:
// |x - xhat| <= s/2 + fp16 rounding of the origin and of the step, plus the
// distance to the range for clipped values.
double AffineBound(float x, float lo, float hi, int levels) {
  const double s = (double(hi) - lo) / (levels - 1);
  const double outside = std::max({0.0, double(x) - hi, double(lo) - x});
  return outside + 0.5 * s + std::fabs(lo) * kHalfEps + (levels - 1) * s * kHalfEps + 1e-6;
}

// Rotated-domain (int, oscar) bound of every element of every token; the
// inverse Hadamard is orthonormal, so the squared error is the same in the
// model's domain.
void ExpectGroupBound(const std::string& name, const std::vector<float>& x, const std::vector<float>& xhat, int tokens,
                      int bits, double kappa) {
  const int group = 128, levels = 1 << bits;
  for (int t = 0; t < tokens; ++t) {
    const std::vector<float> r = Rotated(&x[static_cast<size_t>(t) * kN]);
    const std::vector<float> rh = Rotated(&xhat[static_cast<size_t>(t) * kN]);
    for (int g = 0; g < kN / group; ++g) {
      std::vector<float> sorted(r.begin() + g * group, r.begin() + (g + 1) * group);
      float lo, hi;
      if (kappa < 1.0) {
        std::vector<float> s2 = sorted;
        lo = baselines::Quantile(sorted.data(), group, 1.0 - kappa);
        hi = baselines::Quantile(s2.data(), group, kappa);
      } else {
        lo = *std::min_element(sorted.begin(), sorted.end());
        hi = *std::max_element(sorted.begin(), sorted.end());
      }
      for (int i = g * group; i < (g + 1) * group; ++i) {
        // The rotations of x and xhat each add float rounding.
        ASSERT_LE(std::fabs(r[i] - rh[i]), AffineBound(r[i], lo, hi, levels) + 1e-5 * std::fabs(r[i]))
            << name << " token " << t << " channel " << i;
      }
    }
  }
}

TEST(IntCodec, ErrorWithinHalfAStepOfEachGroupGrid) {
  const int tokens = 97;
  const Kv in = MakeKv(tokens, 1);
  for (int bits : {2, 3, 4}) {
    auto codec = Make("int", bits);
    const Kv out = RoundTrip(*codec, in, tokens);
    ExpectGroupBound("int keys", in.k, out.k, tokens, bits, 1.0);
    ExpectGroupBound("int values", in.v, out.v, tokens, bits, 1.0);
  }
}

TEST(OscarCodec, ErrorWithinHalfAStepOfTheClippedGridPlusTheClippedDistance) {
  const int tokens = 33;
  const Kv in = MakeKv(tokens, 2);
  auto codec = Make("oscar");
  const Kv out = RoundTrip(*codec, in, tokens);
  ExpectGroupBound("oscar keys", in.k, out.k, tokens, 2, 0.96);
  ExpectGroupBound("oscar values", in.v, out.v, tokens, 2, 0.92);
  // Clipping trades the tails for a finer grid: on Gaussian-like values it
  // must beat plain min-max at the same bits.
  auto plain = Make("int");
  EXPECT_LT(Nmse(in.v, out.v), Nmse(in.v, RoundTrip(*plain, in, tokens).v));
}

TEST(KiviCodec, KeysPerChannelOverTheBlockValuesPerTokenGroup) {
  const int tokens = 300;  // two full blocks of 128 and a tail of 44
  const Kv in = MakeKv(tokens, 3);
  auto codec = Make("kivi");
  ASSERT_EQ(codec->block_tokens(), 128);
  const Kv out = RoundTrip(*codec, in, tokens);
  for (int b0 = 0; b0 < tokens; b0 += 128) {
    const int b1 = std::min(tokens, b0 + 128);
    for (int j = 0; j < kN; ++j) {
      float lo = INFINITY, hi = -INFINITY;
      for (int t = b0; t < b1; ++t) {
        lo = std::min(lo, in.k[size_t(t) * kN + j]);
        hi = std::max(hi, in.k[size_t(t) * kN + j]);
      }
      for (int t = b0; t < b1; ++t) {
        const size_t i = size_t(t) * kN + j;
        ASSERT_LE(std::fabs(in.k[i] - out.k[i]), AffineBound(in.k[i], lo, hi, 4)) << t << " " << j;
      }
    }
  }
  for (int t = 0; t < tokens; ++t) {
    for (int g = 0; g < kN / 128; ++g) {
      const float* x = &in.v[size_t(t) * kN + g * 128];
      const float lo = *std::min_element(x, x + 128), hi = *std::max_element(x, x + 128);
      for (int i = 0; i < 128; ++i) {
        ASSERT_LE(std::fabs(x[i] - out.v[size_t(t) * kN + g * 128 + i]), AffineBound(x[i], lo, hi, 4));
      }
    }
  }
}

TEST(TurboCodec, KeysReachTheGaussianLloydMaxDistortion) {
  // On i.i.d. Gaussian keys, rotated unit-norm coordinates are ~N(0, 1/d):
  // the key NMSE is the Lloyd-Max distortion of N(0, 1) at 2 bits, 0.1175,
  // up to the finite-d norm spread.
  const int tokens = 64;
  std::mt19937 rng(4);
  std::normal_distribution<float> g;
  Kv in;
  in.k.resize(size_t(tokens) * kN);
  in.v.resize(in.k.size());
  for (auto& x : in.k) x = g(rng);
  for (auto& x : in.v) x = g(rng);
  auto codec = Make("turbo");
  const Kv out = RoundTrip(*codec, in, tokens);
  EXPECT_NEAR(Nmse(in.k, out.k), 0.1175, 0.01);
  // Values: min-max INT2 over 128 Gaussians spans about +-2.6 sigma, so the
  // step is about 1.73 sigma and the uniform rounding error s^2 / 12 ~ 0.25.
  EXPECT_NEAR(Nmse(in.v, out.v), 0.25, 0.03);
}

TEST(FixedCodec, SquaredErrorAtMostNearestRoundingOnTheMinMaxGrid) {
  const int tokens = 130;  // a full mean window and a tail of 2
  const Kv in = MakeKv(tokens, 5);
  auto codec = Make("fixed", 2, 128, /*key_levels=*/6, /*value_levels=*/3);
  EncodedLayer enc;
  ASSERT_TRUE(EncodeLayer(*codec, in.k.data(), in.v.data(), tokens, 0, 1, &enc, nullptr).ok());
  Kv out;
  out.k.resize(in.k.size());
  out.v.resize(in.v.size());
  ASSERT_TRUE(DecodeLayer(*codec, enc, out.k.data(), out.v.data()).ok());
  std::vector<float> mu(kN);
  for (int t = 0; t < tokens; ++t) {
    DQuantCodec::LoadMean(enc.side.data() + (t / 128) * codec->side_stride(), kN, mu.data());
    for (int key = 0; key < 2; ++key) {
      const std::vector<float>& x = key ? in.k : in.v;
      const std::vector<float>& xh = key ? out.k : out.v;
      std::vector<float> r = Rotated(&x[size_t(t) * kN]);
      const std::vector<float> rh = Rotated(&xh[size_t(t) * kN]);
      if (key)
        for (int j = 0; j < kN; ++j) r[j] -= mu[j];
      const int m = key ? 6 : 3;
      const float lo = *std::min_element(r.begin(), r.end());
      const float hi = *std::max_element(r.begin(), r.end());
      const double s0 = (double(hi) - lo) / (m - 1);
      double sse = 0, nearest = 0;
      for (int j = 0; j < kN; ++j) {
        const double e = double(r[j]) + (key ? mu[j] : 0.0) - rh[j];
        sse += e * e;
        const double q = lo + s0 * std::clamp(std::nearbyint((r[j] - lo) / s0), 0.0, m - 1.0);
        nearest += (r[j] - q) * (r[j] - q);
      }
      // Refit then re-rounding never increases the error, except for the
      // fp16 rounding of (s, o).
      ASSERT_LE(sse, nearest * 1.01 + 1e-6) << "token " << t << (key ? " key" : " value");
      ASSERT_LE(sse, kN * 0.25 * s0 * s0 * 1.01) << "token " << t;
    }
  }
}

TEST(Fp8Codec, RelativeErrorOfThreeMantissaBits) {
  const int tokens = 17;
  const Kv in = MakeKv(tokens, 6);
  auto codec = Make("fp8");
  const Kv out = RoundTrip(*codec, in, tokens);
  for (int key = 0; key < 2; ++key) {
    const std::vector<float>& x = key ? in.k : in.v;
    const std::vector<float>& xh = key ? out.k : out.v;
    for (int t = 0; t < tokens; ++t) {
      float amax = 0;
      for (int j = 0; j < kN; ++j) amax = std::max(amax, std::fabs(x[size_t(t) * kN + j]));
      const double scale = amax / 448.0;
      for (int j = 0; j < kN; ++j) {
        const size_t i = size_t(t) * kN + j;
        ASSERT_LE(std::fabs(x[i] - xh[i]), std::fabs(x[i]) / 16.0 + scale * std::ldexp(1.0, -10) + 1e-7);
      }
    }
  }
}

TEST(Bf16Codec, RelativeErrorOfEightSignificantBits) {
  const int tokens = 5;
  const Kv in = MakeKv(tokens, 7);
  auto codec = Make("bf16");
  const Kv out = RoundTrip(*codec, in, tokens);
  for (size_t i = 0; i < in.k.size(); ++i) {
    ASSERT_LE(std::fabs(in.k[i] - out.k[i]), std::fabs(in.k[i]) / 256.0);
    ASSERT_LE(std::fabs(in.v[i] - out.v[i]), std::fabs(in.v[i]) / 256.0);
  }
}

TEST(Baselines, TrueBitsPerValue) {
  EXPECT_DOUBLE_EQ(Make("int", 2)->key_bits_per_value(), 2.25);
  EXPECT_DOUBLE_EQ(Make("int", 3)->value_bits_per_value(), 3.25);
  EXPECT_DOUBLE_EQ(Make("int", 4)->key_bits_per_value(), 4.25);
  EXPECT_DOUBLE_EQ(Make("int", 2, 64)->key_bits_per_value(), 2.5);
  EXPECT_DOUBLE_EQ(Make("kivi", 2)->key_bits_per_value(), 2.25);
  EXPECT_DOUBLE_EQ(Make("kivi", 2)->value_bits_per_value(), 2.25);
  EXPECT_DOUBLE_EQ(Make("oscar", 2)->key_bits_per_value(), 2.25);
  EXPECT_DOUBLE_EQ(Make("turbo", 2)->key_bits_per_value(), 2.125);
  EXPECT_DOUBLE_EQ(Make("turbo", 2)->value_bits_per_value(), 2.25);
  EXPECT_DOUBLE_EQ(Make("fp8")->key_bits_per_value(), 8.0 + 32.0 / kN);
  EXPECT_DOUBLE_EQ(Make("bf16")->value_bits_per_value(), 16.0);
  // fixed: fp16 (s, o) + ceil(n log2 M / 8) bytes, keys + one mean record
  // (4 + n bytes) per 128 tokens.
  auto fixed = Make("fixed", 2, 128, 6, 3);
  EXPECT_DOUBLE_EQ(fixed->key_bits_per_value(), 8.0 * (4 + 166 + (4.0 + kN) / 128) / kN);
  EXPECT_DOUBLE_EQ(fixed->value_bits_per_value(), 8.0 * (4 + 102) / kN);
}

TEST(Baselines, EncodeWritesExactlyTheStride) {
  const Kv in = MakeKv(1, 8);
  for (const std::string& name : KvCodecNames()) {
    if (name == "dquant") continue;
    auto codec = Make(name);
    std::vector<uint8_t> k(codec->key_stride() + 16, 0xab), v(codec->value_stride() + 16, 0xab);
    std::vector<uint8_t> side(codec->side_stride() + 16, 0xab);
    CodecScratch scratch;
    CodecStats stats;
    ASSERT_TRUE(codec->EncodeBlock(in.k.data(), in.v.data(), 1, k.data(), v.data(), side.data(), &scratch, &stats).ok())
        << name;
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(k[codec->key_stride() + i], 0xab) << name;
      EXPECT_EQ(v[codec->value_stride() + i], 0xab) << name;
      EXPECT_EQ(side[codec->side_stride() + i], 0xab) << name;
    }
  }
}

TEST(Baselines, RejectNonFiniteAndOutOfRangeInput) {
  for (const std::string& name : KvCodecNames()) {
    if (name == "dquant") continue;
    auto codec = Make(name);
    std::vector<uint8_t> k(codec->key_stride()), v(codec->value_stride()), side(codec->side_stride() + 1);
    CodecScratch scratch;
    CodecStats stats;
    for (float bad : {NAN, INFINITY, 1e6f}) {
      Kv in = MakeKv(1, 9);
      in.v[17] = bad;
      const absl::Status st =
          codec->EncodeBlock(in.k.data(), in.v.data(), 1, k.data(), v.data(), side.data(), &scratch, &stats);
      const bool fp16_ok = (name == "fp8" || name == "bf16") && std::isfinite(bad);
      if (fp16_ok) {
        EXPECT_TRUE(st.ok()) << name << " " << bad;
      } else {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << name << " " << bad;
        EXPECT_NE(st.message().find("channel 17"), absl::string_view::npos) << st.message();
      }
    }
    Kv in = MakeKv(1, 9);
    EXPECT_FALSE(
        codec->EncodeBlock(in.k.data(), in.v.data(), 0, k.data(), v.data(), side.data(), &scratch, &stats).ok())
        << name;
  }
}

TEST(Baselines, RejectBadOptions) {
  CodecOptions o;
  o.kv_heads = kHeads;
  o.head_dim = kDim;
  auto bad = [&](const std::string& name, auto edit) {
    CodecOptions c = o;
    c.name = name;
    edit(&c);
    const absl::StatusOr<std::unique_ptr<KvCodec>> r = MakeKvCodec(c);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << name;
  };
  bad("int", [](CodecOptions* c) { c->bits = 0; });
  bad("int", [](CodecOptions* c) { c->bits = 9; });
  bad("int", [](CodecOptions* c) { c->group = 100; });    // does not divide 512
  bad("int", [](CodecOptions* c) { c->head_dim = 96; });  // Hadamard needs 2^k
  bad("kivi", [](CodecOptions* c) { c->group = 0; });
  bad("oscar", [](CodecOptions* c) { c->kappa_k = 0.4; });
  bad("oscar", [](CodecOptions* c) { c->kappa_v = 1.5; });
  bad("turbo", [](CodecOptions* c) { c->bits = 5; });
  bad("fixed", [](CodecOptions* c) { c->key_levels = 1; });
  bad("fixed", [](CodecOptions* c) { c->value_levels = 257; });
  bad("fixed", [](CodecOptions* c) { c->mean_window = 0; });
  bad("fp8", [](CodecOptions* c) { c->kv_heads = 0; });
  bad("no-such-codec", [](CodecOptions*) {});
}

TEST(Baselines, CorruptRecordsAreDataLossAndStayFinite) {
  struct Case {
    std::string name;
    size_t offset;  // byte of the value record to overwrite
    std::vector<uint8_t> bytes;
  };
  const std::vector<Case> cases = {
      {"int", 0, {0x00, 0x7e}},                       // fp16 NaN scale
      {"oscar", 2, {0x00, 0x7c}},                     // fp16 +inf zero point
      {"turbo", 0, {0x00, 0xfc}},                     // value grid scale -inf
      {"fixed", 4, std::vector<uint8_t>(102, 0xff)},  // base-3 integer >= 3^512
      {"fp8", 10, {0x7f}},                            // E4M3 NaN
      {"bf16", 6, {0x80, 0x7f}},                      // bf16 +inf
  };
  const Kv in = MakeKv(1, 10);
  for (const Case& c : cases) {
    auto codec = Make(c.name, 2, 128, 6, 3);
    std::vector<uint8_t> k(codec->key_stride()), v(codec->value_stride()), side(codec->side_stride());
    CodecScratch scratch;
    ASSERT_TRUE(
        codec->EncodeBlock(in.k.data(), in.v.data(), 1, k.data(), v.data(), side.data(), &scratch, nullptr).ok());
    std::memcpy(v.data() + c.offset, c.bytes.data(), c.bytes.size());
    std::vector<float> kh(kN), vh(kN);
    const absl::Status st = codec->DecodeBlock(k.data(), v.data(), side.data(), 1, kh.data(), vh.data(), &scratch);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << c.name << ": " << st;
    for (float x : vh) ASSERT_TRUE(std::isfinite(x)) << c.name;
    for (int j = 0; j < kN; ++j) EXPECT_NEAR(kh[j], in.k[j], 4.0) << c.name;  // keys intact
  }
}

}  // namespace
}  // namespace driftkv
