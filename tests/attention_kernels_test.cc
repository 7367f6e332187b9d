// The attention loops of codec/attention_kernels.h: the AVX2 and portable
// implementations give the same bits (the fallback is what a CPU without
// AVX2 runs), both stay within the float32 summation bound of a float64
// reference, a run of tokens split into calls sums to the same bits, and
// CompressedAttention with a multi-block bf16 window matches float64
// attention over the same tokens whichever implementation it runs.
#include "codec/attention_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/dquant_kv_codec.h"
#include "codec/encoded_layer.h"
#include "codec/registry.h"
#include "gtest/gtest.h"
#include "wire/half.h"

namespace driftkv {
namespace {

constexpr double kEps = 1.0 / (1 << 24);  // unit roundoff of float32

struct Shape {
  int kv_heads, group, head_dim, count;
};

// Odd sizes on purpose: head_dim not a multiple of 8 or 16 exercises the
// tails, group 3 and 5 the head runs that do not divide by 4.
const Shape kShapes[] = {{1, 1, 1, 1},     {1, 1, 7, 3},   {2, 2, 8, 5},    {1, 3, 12, 17}, {3, 5, 20, 9},
                         {4, 2, 128, 128}, {2, 4, 64, 97}, {2, 8, 100, 33}, {1, 1, 24, 0},  {8, 4, 128, 16}};

struct Data {
  AttentionShape s;
  int count = 0;
  std::vector<float> q, c, acc0;  // [q_heads][d], [count][q_heads], [q_heads][d]
  std::vector<uint8_t> levels;    // [count][n]
  std::vector<uint16_t> bf16;     // [count][n]
};

Data MakeData(const Shape& sh, uint64_t seed) {
  Data x;
  x.s.q_heads = sh.kv_heads * sh.group;
  x.s.group = sh.group;
  x.s.head_dim = sh.head_dim;
  x.count = sh.count;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> level(0, 7);
  const size_t qd = static_cast<size_t>(x.s.q_heads) * sh.head_dim, xn = static_cast<size_t>(sh.count) * x.s.n();
  for (size_t i = 0; i < qd; ++i) x.q.push_back(nd(rng));
  for (size_t i = 0; i < qd; ++i) x.acc0.push_back(nd(rng));
  for (size_t i = 0; i < static_cast<size_t>(sh.count) * x.s.q_heads; ++i) x.c.push_back(std::fabs(nd(rng)));
  for (size_t i = 0; i < xn; ++i) x.levels.push_back(static_cast<uint8_t>(level(rng)));
  for (size_t i = 0; i < xn; ++i) x.bf16.push_back(FloatToBf16(nd(rng)));
  return x;
}

// Bit for bit (memcmp is not called on the empty arrays of 0 tokens).
bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

float Elem(const Data& x, bool bf16, size_t i) {
  return bf16 ? Bf16ToFloat(x.bf16[i]) : x.levels[i];
}

std::vector<float> Dots(const AttentionKernels& k, const Data& x, bool bf16) {
  std::vector<float> dots(static_cast<size_t>(x.count) * x.s.q_heads, NAN);
  if (bf16) {
    k.dots_bf16(x.s, x.q.data(), x.bf16.data(), x.count, dots.data());
  } else {
    k.dots_levels(x.s, x.q.data(), x.levels.data(), x.count, dots.data());
  }
  return dots;
}

// The tokens in calls of `split` (0: one call).
std::vector<float> Sums(const AttentionKernels& k, const Data& x, bool bf16, int split = 0) {
  std::vector<float> acc = x.acc0;
  const int step = split > 0 ? split : std::max(1, x.count);
  const size_t n = x.s.n();
  for (int t = 0; t < x.count; t += step) {
    const int m = std::min(step, x.count - t);
    const float* c = x.c.data() + static_cast<size_t>(t) * x.s.q_heads;
    if (bf16) {
      k.accumulate_bf16(x.s, c, x.bf16.data() + t * n, m, acc.data());
    } else {
      k.accumulate_levels(x.s, c, x.levels.data() + t * n, m, acc.data());
    }
  }
  return acc;
}

TEST(AttentionKernels, Avx2GivesThePortableBits) {
  const AttentionKernels* avx2 = Avx2AttentionKernels();
  if (avx2 == nullptr) {
    std::printf("skipped: no AVX2 on this CPU (the portable kernels ran everywhere else)\n");
    return;
  }
  const AttentionKernels& portable = PortableAttentionKernels();
  for (const Shape& sh : kShapes) {
    const Data x = MakeData(sh, sh.head_dim * 131 + sh.count);
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(testing::Message() << sh.kv_heads << "x" << sh.head_dim << " group " << sh.group << ", " << sh.count
                                      << " tokens, " << (bf16 ? "bf16" : "levels"));
      const std::vector<float> a = Dots(*avx2, x, bf16), b = Dots(portable, x, bf16);
      ASSERT_TRUE(SameBits(a, b)) << "dots";
      const std::vector<float> sa = Sums(*avx2, x, bf16), sb = Sums(portable, x, bf16);
      ASSERT_TRUE(SameBits(sa, sb)) << "sums";
    }
  }
}

// Eight partial sums of at most ceil(d / 8) products each, then three
// levels of adds: |error| <= (ceil(d / 8) + 4) u sum |q x| to first order
// (one rounding per product and per add on the longest path). A sum of
// `count` terms onto acc0 in order: (count + 1) u (|acc0| + sum |c x|).
TEST(AttentionKernels, WithinTheFloat32BoundOfFloat64) {
  for (const AttentionKernels* k : {&PortableAttentionKernels(), Avx2AttentionKernels()}) {
    if (k == nullptr) continue;
    for (const Shape& sh : kShapes) {
      const Data x = MakeData(sh, sh.head_dim * 7 + sh.group);
      const int d = sh.head_dim, qh = x.s.q_heads;
      const size_t n = x.s.n();
      for (bool bf16 : {false, true}) {
        SCOPED_TRACE(testing::Message() << k->name << " " << sh.kv_heads << "x" << d << " group " << sh.group << ", "
                                        << sh.count << " tokens, " << (bf16 ? "bf16" : "levels"));
        const std::vector<float> dots = Dots(*k, x, bf16), sums = Sums(*k, x, bf16);
        for (int t = 0; t < x.count; ++t) {
          for (int h = 0; h < qh; ++h) {
            double exact = 0, mag = 0;
            for (int i = 0; i < d; ++i) {
              const double p = static_cast<double>(x.q[h * d + i]) * Elem(x, bf16, t * n + (h / sh.group) * d + i);
              exact += p;
              mag += std::fabs(p);
            }
            const double bound = ((d + 7) / 8 + 4) * kEps * mag * 1.01;
            ASSERT_LE(std::fabs(dots[t * qh + h] - exact), bound) << "token " << t << " head " << h;
          }
        }
        for (int h = 0; h < qh; ++h) {
          for (int i = 0; i < d; ++i) {
            double exact = x.acc0[h * d + i], mag = std::fabs(exact);
            for (int t = 0; t < x.count; ++t) {
              const double p = static_cast<double>(x.c[t * qh + h]) * Elem(x, bf16, t * n + (h / sh.group) * d + i);
              exact += p;
              mag += std::fabs(p);
            }
            const double bound = (x.count + 1) * kEps * mag * 1.01;
            ASSERT_LE(std::fabs(sums[h * d + i] - exact), bound) << "head " << h << " channel " << i;
          }
        }
      }
    }
  }
}

// AttentionCore hands ValueTokens any split of a block (the cold path two
// tokens at a time, the hot path a page at once): the same bits.
TEST(AttentionKernels, SumsDoNotDependOnTheSplit) {
  for (const AttentionKernels* k : {&PortableAttentionKernels(), Avx2AttentionKernels()}) {
    if (k == nullptr) continue;
    const Data x = MakeData({4, 2, 128, 128}, 5);
    for (bool bf16 : {false, true}) {
      const std::vector<float> whole = Sums(*k, x, bf16);
      for (int split : {1, 2, 3, 64}) {
        const std::vector<float> parts = Sums(*k, x, bf16, split);
        EXPECT_TRUE(SameBits(whole, parts)) << k->name << (bf16 ? " bf16" : " levels") << ", calls of " << split;
      }
    }
  }
}

// Compressed tokens plus a bf16 window of up to three window blocks
// (kWindowBlockTokens each, the last partial) against float64 attention
// over the decoded cache and the window's bf16 values; the portable and the
// fastest kernels give the same bits. Bound as in dquant_codec_test: float32
// sums of <= 700 positive weights stay near 1e-5 relative; a wrong token or
// a lost rescale moves the output by >1e-2.
TEST(AttentionKernels, LongWindowMatchesFloat64Attention) {
  CodecOptions o;
  o.kv_heads = 4;
  o.head_dim = 64;
  o.mean_window = 64;
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(o);
  ASSERT_TRUE(codec.ok()) << codec.status();
  const auto& dq = static_cast<const DQuantKvCodec&>(**codec).codec();
  const int n = 256, d = 64;
  for (int window : {1, kWindowBlockTokens - 1, kWindowBlockTokens, kWindowBlockTokens + 1, 300}) {
    for (int compressed : {0, 150}) {
      for (int q_heads : {4, 12}) {
        SCOPED_TRACE(testing::Message() << compressed << " compressed tokens, window " << window << ", " << q_heads
                                        << " query heads");
        const int64_t T = compressed + window;
        std::mt19937_64 rng(T * 31 + q_heads);
        std::normal_distribution<float> nd;
        std::vector<float> k(T * n), v(T * n), q(q_heads * d);
        for (float& x : k) x = 0.5f + nd(rng);
        for (float& x : v) x = nd(rng);
        for (float& x : q) x = 0.3f * nd(rng);
        EncodedLayer enc;
        ASSERT_TRUE(EncodeLayer(**codec, k.data(), v.data(), T, window, 1, &enc, nullptr).ok());
        ASSERT_EQ(enc.window, window);
        std::vector<float> kh(T * n), vh(T * n);
        ASSERT_TRUE(DecodeLayer(**codec, enc, kh.data(), vh.data()).ok());
        const std::vector<CompressedBlock> blocks = LayerBlocks(**codec, enc, enc.compressed);
        const Bf16Tokens win{enc.window_keys.data(), enc.window_values.data(), enc.window};
        std::vector<double> ref(q_heads * d), ref_lse(q_heads);
        ReferenceAttention(kh.data(), vh.data(), T, 4, d, q.data(), q_heads, 0.125, ref.data(), ref_lse.data());
        std::vector<std::vector<float>> outs;
        for (const AttentionKernels* kern : {&PortableAttentionKernels(), &BestAttentionKernels()}) {
          std::vector<float> out(q_heads * d, NAN), lse(q_heads, NAN);
          AttentionScratch scratch;
          scratch.kernels = kern;
          ASSERT_TRUE(
              CompressedAttention(dq, blocks, win, q.data(), q_heads, 0.125f, out.data(), lse.data(), &scratch).ok());
          double err = 0, norm = 0;
          for (size_t j = 0; j < ref.size(); ++j) {
            err += (out[j] - ref[j]) * (out[j] - ref[j]);
            norm += ref[j] * ref[j];
          }
          EXPECT_LE(std::sqrt(err / norm), 2e-4) << kern->name;
          for (int h = 0; h < q_heads; ++h) EXPECT_NEAR(lse[h], ref_lse[h], 1e-4 * (1 + std::fabs(ref_lse[h])));
          out.insert(out.end(), lse.begin(), lse.end());
          outs.push_back(out);
        }
        EXPECT_TRUE(SameBits(outs[0], outs[1])) << "portable and " << BestAttentionKernels().name << " differ";
      }
    }
  }
}

}  // namespace
}  // namespace driftkv
