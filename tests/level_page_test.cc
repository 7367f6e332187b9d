// Level pages (the hot tier, codec/level_page.h): layout sizes, every field
// read back by a reader written from the header comment alone (not from
// level_page.cc's mapping), pack/unpack round trips, windows encoded
// straight into level pages equal to promoted ones, cold -> hot -> cold
// byte identity (Gaussian, heavy-tailed, constant, payload-filling and real
// captured KV), corrupt input, the GPU's base-6 decode, and LevelAttention
// bit-identical to CompressedAttention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/level_attention.h"
#include "codec/level_page.h"
#include "codec/rans.h"
#include "codec/stream_codec.h"
#include "gtest/gtest.h"
#include "tests/eval_data.h"
#include "wire/half.h"

namespace driftkv {
namespace {

DQuantCodec MakeCodec(int heads, int dim, bool hadamard = true) {
  DQuantConfig c;
  c.kv_heads = heads;
  c.head_dim = dim;
  c.hadamard = hadamard;
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
  EXPECT_TRUE(codec.ok()) << codec.status();
  return *std::move(codec);
}

LevelPageLayout Layout(const DQuantCodec& codec) {
  absl::StatusOr<LevelPageLayout> l = MakeLevelPageLayout(codec);
  EXPECT_TRUE(l.ok()) << l.status();
  return *l;
}

uint32_t Le32(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// ---------------------------------------------------------------------------
// A reader written from the comment in codec/level_page.h, one value at a
// time, sharing nothing with level_page.cc but the header's group-size
// helpers.

// Word w of lane `lane` in a block: uint4 w / 4 at (j * 32 + lane) * 16.
uint32_t SpecWord(const uint8_t* block, int lane, int w) {
  return Le32(block + ((w / 4) * 32 + lane) * 16 + (w % 4) * 4);
}

// Lane and register holding A[row][col] of an m16n8k16 A fragment, and
// whether it is the upper (odd column) value of its pair.
void SpecFragment(int row, int col, int* lane, int* reg, int* upper) {
  const int g = row % 8, t = (col % 8) / 2;
  *lane = 4 * g + t;
  *reg = (row / 8) + 2 * (col / 8);  // a0 [g][c], a1 [g+8][c], a2 [g][c+8], a3 [g+8][c+8]
  *upper = col % 2;
}

int SpecKeyLevel(const LevelPageLayout& l, const uint8_t* page, int h, int token, int ch) {
  const int d = l.head_dim;
  int lane, r, upper;
  SpecFragment(token % 16, ch % 16, &lane, &r, &upper);
  const int mt = token / 16, ks = ch / 16;
  const int q = ks * 4 + r, group = q / 16, e = q % 16;
  const uint8_t* block = page + l.key_block(h);
  auto word = [&](int k) { return SpecWord(block, lane, (mt * (d / 64) + group) * 3 + k); };
  if (e < 15) return (word(e / 5) >> (3 * (e % 5) + 16 * upper)) & 7;
  int v = 0;
  for (int b = 0; b < 3; ++b) v |= ((word(b) >> (15 + 16 * upper)) & 1) << b;
  return v;
}

int SpecValueLevel(const LevelPageLayout& l, const uint8_t* page, int h, int token, int ch) {
  const int d = l.head_dim, mts = d / 16;
  int lane, r, upper;
  SpecFragment(ch % 16, token % 16, &lane, &r, &upper);  // A = values transposed
  const int mt = ch / 16, ks = token / 16;
  const int p = (ks * mts + mt) * 4 + r;
  const int group = ks < 3 ? 0 : (ks < 6 ? 1 : 2);
  const int group_first_pair = (group == 0 ? 0 : group == 1 ? 3 : 6) * mts * 4;
  int first_word = 0;
  for (int g = 0; g < group; ++g) first_word += LevelValueGroupWords(d, g);
  const int i = p - group_first_pair, j = i / 3, digit = i % 3;
  const uint32_t w = SpecWord(page + l.value_block(h), lane, first_word + j / 2);
  int byte = (w >> (8 * (j % 2) + 16 * upper)) & 0xff;
  for (int k = 0; k < digit; ++k) byte /= 6;
  return byte % 6;
}

// ---------------------------------------------------------------------------

TEST(LevelPageLayout, SizesAndCapacity) {
  struct Want {
    int heads, dim;
    size_t blocks_offset, key_block, value_block, page;
  };
  for (const Want& w : {Want{8, 128, 2064, 6144, 5632, 96320}, Want{4, 64, 1296, 3072, 3072, 25920},
                        Want{2, 64, 1168, 3072, 3072, 13504}, Want{4, 128, 1552, 6144, 5632, 48704}}) {
    SCOPED_TRACE(testing::Message() << w.heads << "x" << w.dim);
    absl::StatusOr<LevelPageLayout> l = MakeLevelPageLayout(w.heads, w.dim);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->n(), w.heads * w.dim);
    EXPECT_EQ(l->blocks_offset, w.blocks_offset);
    EXPECT_EQ(l->key_block_bytes, w.key_block);
    EXPECT_EQ(l->key_block_bytes, 48u * w.dim);  // exactly 3 bits a level
    EXPECT_EQ(l->value_block_bytes, w.value_block);
    EXPECT_EQ(l->page_bytes, w.page);
    EXPECT_EQ(l->page_bytes % 64, 0u);
    EXPECT_GE(l->page_bytes, l->blocks_offset + w.heads * l->head_bytes());
    EXPECT_LT(l->page_bytes, l->blocks_offset + w.heads * l->head_bytes() + 64);
    for (int h = 0; h < w.heads; ++h) {
      EXPECT_EQ(l->key_block(h) % 16, 0u);
      EXPECT_EQ(l->value_block(h) % 16, 0u);
    }
    // The same layout from a default codec of the shape.
    DQuantCodec codec = MakeCodec(w.heads, w.dim);
    EXPECT_EQ(Layout(codec).page_bytes, w.page);
  }
  // Value groups: 96/96/64 pairs per lane at D = 128 (16/16/11 words, the
  // last padded to 12); 48/48/32 at D = 64 (8/8/6, padded to 8).
  EXPECT_EQ(LevelValueGroupWords(128, 0), 16);
  EXPECT_EQ(LevelValueGroupWords(128, 2), 12);
  EXPECT_EQ(LevelValueGroupWords(64, 2), 8);
  EXPECT_EQ(LevelValueGroupFirstVec(128, 2), 8);

  // Capacity at 8 x 128: bf16 is 2 * 2 * n bytes a token.
  const LevelPageLayout l = *MakeLevelPageLayout(8, 128);
  const double bf16 = 2.0 * 2.0 * 1024, hot = l.page_bytes / 128.0;
  EXPECT_GE(bf16 / hot, 5.3) << hot << " bytes a token";
  const DQuantCodec codec = MakeCodec(8, 128);
  const double cold = (128.0 * (codec.key_stride() + codec.value_stride()) + codec.mean_stride()) / 128.0;
  EXPECT_GT(bf16 / cold, bf16 / hot);  // the hot tier costs memory
  EXPECT_NEAR(bf16 / cold, 7.06, 0.01);
}

TEST(LevelPageLayout, RefusesShapesWithoutALevelPage) {
  EXPECT_EQ(MakeLevelPageLayout(8, 96).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLevelPageLayout(8, 256).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeLevelPageLayout(0, 128).status().code(), absl::StatusCode::kInvalidArgument);
  auto refused = [](DQuantConfig c, const char* field) {
    c.kv_heads = 2;
    c.head_dim = 64;
    absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(c);
    ASSERT_TRUE(codec.ok()) << codec.status();
    absl::StatusOr<LevelPageLayout> l = MakeLevelPageLayout(*codec);
    EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(std::string(l.status().message()).find(field), std::string::npos) << l.status();
  };
  DQuantConfig c;
  c.key_levels = 9;
  refused(c, "key_levels");
  c = DQuantConfig();
  c.value_levels = 7;
  refused(c, "value_levels");
  c = DQuantConfig();
  c.mean_window = 64;
  refused(c, "mean_window");
  c = DQuantConfig();
  c.key_levels = 6;  // fewer levels fit the same fields
  c.value_levels = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  EXPECT_TRUE(MakeLevelPageLayout(*DQuantCodec::Create(c)).ok());
}

// Random levels, headers and mean into a page; every field read back by the
// spec reader, then by UnpackLevelPage.
void CheckPackRoundTrip(int heads, int dim, int tokens, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << heads << "x" << dim << ", " << tokens << " tokens");
  const LevelPageLayout l = *MakeLevelPageLayout(heads, dim);
  const int n = l.n();
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> kl(tokens * n), vl(tokens * n), mean(4 + n);
  std::vector<uint32_t> kh(tokens), vh(tokens);
  for (uint8_t& x : kl) x = rng() % 8;
  for (uint8_t& x : vl) x = rng() % 6;
  for (uint8_t& x : mean) x = rng();
  for (uint32_t& x : kh) x = static_cast<uint32_t>(rng());
  for (uint32_t& x : vh) x = static_cast<uint32_t>(rng());
  std::vector<uint8_t> page(l.page_bytes, 0xab), page0(l.page_bytes, 0);
  PackLevelPage(l, tokens, kl.data(), vl.data(), kh.data(), vh.data(), mean.data(), page.data());
  PackLevelPage(l, tokens, kl.data(), vl.data(), kh.data(), vh.data(), mean.data(), page0.data());
  ASSERT_EQ(page, page0) << "a byte of the page was not written";

  for (int t = 0; t < 128; ++t) {
    ASSERT_EQ(Le32(&page[4 * t]), t < tokens ? kh[t] : 0u) << "key header " << t;
    ASSERT_EQ(Le32(&page[512 + 4 * t]), t < tokens ? vh[t] : 0u) << "value header " << t;
  }
  for (int b = 1024; b < 1036; ++b) ASSERT_EQ(page[b], 0) << b;
  ASSERT_EQ(0, std::memcmp(&page[1036], mean.data(), 4 + n));
  ASSERT_EQ(l.blocks_offset, 1040u + n);
  for (size_t b = l.blocks_offset + heads * l.head_bytes(); b < l.page_bytes; ++b) ASSERT_EQ(page[b], 0) << b;
  for (int h = 0; h < heads; ++h) {
    for (int t = 0; t < 128; ++t) {
      for (int c = 0; c < dim; ++c) {
        const size_t i = static_cast<size_t>(t) * n + h * dim + c;
        ASSERT_EQ(SpecKeyLevel(l, page.data(), h, t, c), t < tokens ? kl[i] : 0) << h << " " << t << " " << c;
        ASSERT_EQ(SpecValueLevel(l, page.data(), h, t, c), t < tokens ? vl[i] : 0) << h << " " << t << " " << c;
      }
    }
  }

  std::vector<uint8_t> kl2(128 * n, 0xee), vl2(128 * n, 0xee), mean2(4 + n);
  std::vector<uint32_t> kh2(128, 7), vh2(128, 7);
  UnpackLevelPage(l, page.data(), kl2.data(), vl2.data(), kh2.data(), vh2.data(), mean2.data());
  for (int t = 0; t < 128; ++t) {
    ASSERT_EQ(kh2[t], t < tokens ? kh[t] : 0u);
    ASSERT_EQ(vh2[t], t < tokens ? vh[t] : 0u);
    for (int j = 0; j < n; ++j) {
      const size_t i = static_cast<size_t>(t) * n + j;
      ASSERT_EQ(kl2[i], t < tokens ? kl[i] : 0) << t << " " << j;
      ASSERT_EQ(vl2[i], t < tokens ? vl[i] : 0) << t << " " << j;
    }
  }
  ASSERT_EQ(mean2, mean);
}

TEST(LevelPage, PackUnpackRoundTrip) {
  uint64_t seed = 1;
  for (auto [heads, dim] : {std::pair{8, 128}, std::pair{4, 64}, std::pair{2, 64}, std::pair{1, 128}}) {
    for (int tokens : {128, 1, 37, 127}) CheckPackRoundTrip(heads, dim, tokens, seed++);
  }
}

// A few bytes worked out by hand from the header comment.
TEST(LevelPage, HandPlacedLevels) {
  const LevelPageLayout l = *MakeLevelPageLayout(2, 64);
  const int n = 128;
  std::vector<uint8_t> kl(128 * n, 0), vl(128 * n, 0), mean(4 + n, 0);
  std::vector<uint32_t> hd(128, 0);
  // Key token 0, channel 0 of head 0 = 5: lane 0, a0 lower, pair 0, bits [0, 3) of word 0.
  kl[0] = 5;
  // Key token 9, channel 1 of head 0 = 3: row 9 -> g 1, a1; column 1 -> t 0, upper;
  // lane 4, pair q = 1, bits [16 + 3, +3) of word 0 of lane 4: byte 2 of uint4 0 of lane 4 = 3 << 3.
  kl[9 * n + 1] = 3;
  // Key token 0, channel 63 of head 1 = 6: ks 3, column 15 -> a2, t 3, upper; lane 3,
  // pair q = 3 * 4 + 2 = 14: bits [16 + 12, +3) of word 2: byte 3 of lane 3's word 2 = 6 << 4.
  kl[64 + 63] = 6;
  // Key token 8, channel 62 of head 0 = 5 (binary 101): a3, lane 3, pair 15, lower:
  // bit 15 of word 0 and of word 2 set, of word 1 clear.
  kl[8 * n + 62] = 5;
  // Value token 1, channel 0 of head 0 = 5: A row 0 (channel), column 1 (token) -> lane 0,
  // a0 upper; pair 0 of group 0 -> triple 0 digit 0 -> O_0 = byte 2 of word 0.
  vl[1 * n + 0] = 5;
  // Value token 0, channel 1 of head 0 = 4: A row 1 -> lane 4, a0 lower, pair 0 ->
  // E_0 = byte 0 of word 0 of lane 4. Value token 16 (k-step 1), channel 1 = 2: lane 4,
  // pair (1 * MT + 0) * 4 + 0 = 16 (MT = 4) -> triple 5 digit 1 -> E_5 = 2 * 6 = 12:
  // byte 1 of word 2 of lane 4.
  vl[0 * n + 1] = 4;
  vl[16 * n + 1] = 2;
  std::vector<uint8_t> page(l.page_bytes);
  PackLevelPage(l, 128, kl.data(), vl.data(), hd.data(), hd.data(), mean.data(), page.data());
  const uint8_t* k0 = &page[l.key_block(0)];
  const uint8_t* k1 = &page[l.key_block(1)];
  const uint8_t* v0 = &page[l.value_block(0)];
  EXPECT_EQ(k0[0], 5);
  EXPECT_EQ(k0[4 * 16 + 2], 3 << 3);
  EXPECT_EQ(k1[3 * 16 + 8 + 3], 6 << 4);
  EXPECT_EQ(Le32(k0 + 3 * 16 + 0) & 0xffff8000u, 0x8000u);
  EXPECT_EQ(Le32(k0 + 3 * 16 + 4) & 0xffff8000u, 0u);
  EXPECT_EQ(Le32(k0 + 3 * 16 + 8) & 0xffff8000u, 0x8000u);
  EXPECT_EQ(v0[2], 5);
  EXPECT_EQ(v0[4 * 16 + 0], 4);
  EXPECT_EQ(v0[4 * 16 + 8 + 1], 12);
  size_t nonzero = 0;
  for (size_t b = l.blocks_offset; b < l.page_bytes; ++b) nonzero += page[b] != 0;
  EXPECT_EQ(nonzero, 8u);  // the 6 bytes above and bit 15 of two words of lane 3
}

// Value groups' padding (whole words, and the missing triple of D = 64's
// third group) stays zero even with every level at its maximum.
TEST(LevelPage, ValuePaddingIsZero) {
  for (int dim : {64, 128}) {
    const LevelPageLayout l = *MakeLevelPageLayout(1, dim);
    std::vector<uint8_t> kl(128 * dim, 7), vl(128 * dim, 5), mean(4 + dim, 0);
    std::vector<uint32_t> hd(128, 0);
    std::vector<uint8_t> page(l.page_bytes);
    PackLevelPage(l, 128, kl.data(), vl.data(), hd.data(), hd.data(), mean.data(), page.data());
    for (int lane = 0; lane < 32; ++lane) {
      int first = 0;
      for (int g = 0; g < 3; ++g) {
        const int pairs = (g < 2 ? 3 : 2) * (dim / 16) * 4, triples = (pairs + 2) / 3;
        for (int w = 0; w < LevelValueGroupWords(dim, g); ++w) {
          const uint32_t word = SpecWord(&page[l.value_block(0)], lane, first + w);
          for (int half = 0; half < 2; ++half) {
            const int j = 2 * w + half;
            const uint32_t e = (word >> (8 * half)) & 0xff, o = (word >> (16 + 8 * half)) & 0xff;
            if (j >= triples) {
              EXPECT_EQ(e | o, 0u) << dim << " lane " << lane << " group " << g << " triple " << j;
            } else {
              const int have = std::min(3, pairs - 3 * j);  // digits present
              const uint32_t full = have == 3 ? 215 : (have == 2 ? 35 : 5);
              EXPECT_EQ(e, full);
              EXPECT_EQ(o, full);
            }
          }
        }
        first += LevelValueGroupWords(dim, g);
      }
    }
  }
}

// The base-6 triple decode of the GPU kernel (and of UnpackLevelPage): two
// bytes b, b2 < 216 as 16-bit lanes of one word.
TEST(LevelPage, Base6DecodeIsExactForEveryBytePair) {
  for (uint32_t b = 0; b < 216; ++b) {
    for (uint32_t b2 = 0; b2 < 216; ++b2) {
      const uint32_t v = b | (b2 << 16);
      const uint32_t l2 = ((v * 57) >> 11) & 0x00070007u;
      const uint32_t r = v - 36 * l2;
      const uint32_t l1 = ((r * 43) >> 8) & 0x00070007u;
      const uint32_t l0 = r - 6 * l1;
      const uint32_t want0 = (b % 6) | ((b2 % 6) << 16), want1 = ((b / 6) % 6) | (((b2 / 6) % 6) << 16),
                     want2 = (b / 36) | ((b2 / 36) << 16);
      ASSERT_EQ(l0, want0) << b << " " << b2;
      ASSERT_EQ(l1, want1) << b << " " << b2;
      ASSERT_EQ(l2, want2) << b << " " << b2;
    }
  }
}

// ---------------------------------------------------------------------------
// Cold -> hot -> cold.

struct ColdPage {
  std::vector<uint8_t> keys, values, mean;
  int tokens = 0;
};

ColdPage EncodeCold(const DQuantCodec& dq, const float* k, const float* v, int tokens, StreamStats* ks = nullptr,
                    StreamStats* vs = nullptr) {
  ColdPage c;
  c.tokens = tokens;
  c.keys.resize(tokens * dq.key_stride());
  c.values.resize(tokens * dq.value_stride());
  c.mean.resize(dq.mean_stride());
  CodecScratch scratch;
  StreamStats a, b;
  absl::Status st = dq.EncodeWindow(k, v, tokens, c.keys.data(), c.values.data(), c.mean.data(), &scratch, ks ? ks : &a,
                                    vs ? vs : &b);
  EXPECT_TRUE(st.ok()) << st;
  return c;
}

// Promote, check the page's levels and headers against the records, demote
// into buffers full of junk, and require the records back byte for byte.
void CheckColdHotCold(const DQuantCodec& dq, const ColdPage& c) {
  SCOPED_TRACE(testing::Message() << c.tokens << " tokens");
  const LevelPageLayout l = Layout(dq);
  const int n = dq.n();
  std::vector<uint8_t> page(l.page_bytes, 0x5a);
  absl::Status st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), c.tokens, page.data());
  ASSERT_TRUE(st.ok()) << st;

  std::vector<uint8_t> kl(128 * n), vl(128 * n), mean(4 + n), sym(n);
  std::vector<uint32_t> kh(128), vh(128);
  UnpackLevelPage(l, page.data(), kl.data(), vl.data(), kh.data(), vh.data(), mean.data());
  for (int t = 0; t < c.tokens; ++t) {
    float s, o;
    ASSERT_TRUE(dq.key_codec().DecodeSymbols(&c.keys[t * dq.key_stride()], sym.data(), &s, &o).ok());
    ASSERT_EQ(0, std::memcmp(sym.data(), &kl[t * n], n)) << "key levels of token " << t;
    ASSERT_EQ(kh[t], Le32(&c.keys[t * dq.key_stride()]));
    ASSERT_TRUE(dq.value_codec().DecodeSymbols(&c.values[t * dq.value_stride()], sym.data(), &s, &o).ok());
    ASSERT_EQ(0, std::memcmp(sym.data(), &vl[t * n], n)) << "value levels of token " << t;
    ASSERT_EQ(vh[t], Le32(&c.values[t * dq.value_stride()]));
  }
  ASSERT_EQ(0, std::memcmp(mean.data(), c.mean.data(), 4 + n));

  std::vector<uint8_t> keys(c.keys.size(), 0xc3), values(c.values.size(), 0xc3), m(c.mean.size(), 0xc3);
  st = DemotePage(dq, l, page.data(), c.tokens, keys.data(), values.data(), m.data());
  ASSERT_TRUE(st.ok()) << st;
  for (int t = 0; t < c.tokens; ++t) {
    ASSERT_EQ(0, std::memcmp(&keys[t * dq.key_stride()], &c.keys[t * dq.key_stride()], dq.key_stride()))
        << "key record of token " << t;
    ASSERT_EQ(0, std::memcmp(&values[t * dq.value_stride()], &c.values[t * dq.value_stride()], dq.value_stride()))
        << "value record of token " << t;
  }
  ASSERT_EQ(m, c.mean);
}

// A window encoded straight into a level page (a hot layer's new page):
// the records EncodeWindow writes, and the page PromotePage makes of them,
// byte for byte; then cold -> hot -> cold as for any page.
void CheckStraight(const DQuantCodec& dq, const float* k, const float* v, int tokens) {
  SCOPED_TRACE(testing::Message() << "straight, " << tokens << " tokens");
  const ColdPage c = EncodeCold(dq, k, v, tokens);
  const LevelPageLayout l = Layout(dq);
  std::vector<uint8_t> promoted(l.page_bytes, 0x5a), straight(l.page_bytes, 0xa5);
  absl::Status st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), tokens, promoted.data());
  ASSERT_TRUE(st.ok()) << st;
  std::vector<uint8_t> keys(c.keys.size(), 0xc3), values(c.values.size(), 0xc3), mean(c.mean.size(), 0xc3);
  CodecScratch scratch;
  StreamStats ks, vs;
  st = EncodeLevelPage(dq, l, k, v, tokens, keys.data(), values.data(), mean.data(), straight.data(), &scratch, &ks,
                       &vs);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(keys == c.keys) << "key records";
  ASSERT_TRUE(values == c.values) << "value records";
  ASSERT_TRUE(mean == c.mean) << "mean record";
  EXPECT_EQ(ks.streams, tokens);
  EXPECT_EQ(vs.streams, tokens);
  for (size_t i = 0; i < straight.size(); ++i) ASSERT_EQ(straight[i], promoted[i]) << "level page byte " << i;
  CheckColdHotCold(dq, c);
}

std::vector<float> Gaussian(size_t count, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(count);
  for (float& v : x) v = scale * nd(rng);
  return x;
}

TEST(LevelPage, ColdHotColdGaussian) {
  for (auto [heads, dim] : {std::pair{8, 128}, std::pair{4, 64}, std::pair{2, 64}}) {
    SCOPED_TRACE(testing::Message() << heads << "x" << dim);
    const DQuantCodec dq = MakeCodec(heads, dim);
    const int n = dq.n();
    for (int tokens : {128, 77, 1}) {
      std::vector<float> k = Gaussian(tokens * n, tokens + n), v = Gaussian(tokens * n, 3 * tokens + n);
      for (int t = 0; t < tokens; ++t) k[t * n + 5] += 4.0f;  // a channel with a mean
      CheckStraight(dq, k.data(), v.data(), tokens);
    }
  }
}

TEST(LevelPage, ColdHotColdHeavyTailed) {
  const DQuantCodec dq = MakeCodec(4, 128);
  const int n = dq.n(), tokens = 128;
  std::mt19937_64 rng(11);
  std::student_t_distribution<float> td(1.2f);  // infinite variance: big outliers
  std::vector<float> k(tokens * n), v(tokens * n);
  for (float& x : k) x = std::clamp(td(rng), -3000.0f, 3000.0f);
  for (float& x : v) x = std::clamp(td(rng), -3000.0f, 3000.0f);
  StreamStats ks, vs;
  ColdPage c = EncodeCold(dq, k.data(), v.data(), tokens, &ks, &vs);
  EXPECT_GT(ks.moved + vs.moved, 0);  // drift moved symbols
  CheckStraight(dq, k.data(), v.data(), tokens);
}

TEST(LevelPage, ColdHotColdConstantStreams) {
  for (bool hadamard : {true, false}) {
    const DQuantCodec dq = MakeCodec(2, 64, hadamard);
    const int n = dq.n(), tokens = 100;
    // Keys all zero (mean zero, stream zero); values rotate to one constant
    // per token: c * sqrt(64) at dim 0 of each head under Hadamard.
    std::vector<float> k(tokens * n, 0.0f), v(tokens * n, 0.0f);
    for (int t = 0; t < tokens; ++t) {
      const float c = 0.25f * (t % 7) - 0.5f;
      for (int j = 0; j < n; ++j) v[t * n + j] = hadamard ? (j % 64 == 0 ? c * 8.0f : 0.0f) : c;
    }
    StreamStats ks, vs;
    EncodeCold(dq, k.data(), v.data(), tokens, &ks, &vs);
    EXPECT_EQ(ks.constant, tokens);
    EXPECT_EQ(vs.constant, tokens);
    CheckStraight(dq, k.data(), v.data(), tokens);
  }
}

// Records that fill their payload to the last byte. What the encoder's
// retries and fallbacks write is the same thing: an assignment rANS-coded
// into C bytes (the last resort is the all-cheapest stream at the minimum C).
// No input tried here makes the encoder itself retry (its real length is
// within 2^-15 bits a symbol of the ideal cost plus the 32-bit state, which
// drift already budgets), so these records are built directly.
TEST(LevelPage, ColdHotColdPayloadFillingStreams) {
  DQuantConfig cfg;
  cfg.kv_heads = 2;
  cfg.head_dim = 64;
  const DQuantCodec base = *DQuantCodec::Create(cfg);
  cfg.key_bytes = *StreamCodec::MinPayloadBytes(128, 8, base.key_codec().table().freq);
  cfg.value_bytes = *StreamCodec::MinPayloadBytes(128, 6, base.value_codec().table().freq) + 9;
  const DQuantCodec dq = *DQuantCodec::Create(cfg);
  const int n = dq.n(), tokens = 128;
  std::mt19937_64 rng(5);
  std::vector<float> zeros(tokens * n, 0.0f);
  ColdPage c = EncodeCold(dq, zeros.data(), zeros.data(), tokens);  // for the mean record
  std::vector<uint8_t> sym(n), scratch(n + kStateBytes);
  int full = 0;
  for (int kind = 0; kind < 2; ++kind) {
    const StreamCodec& sc = kind == 0 ? dq.key_codec() : dq.value_codec();
    const int cheapest = kind == 0 ? 3 : 2;
    for (int t = 0; t < tokens; ++t) {
      uint8_t* r = (kind == 0 ? c.keys.data() : c.values.data()) + t * sc.stride();
      if (kind == 0 && t % 2 == 0) {
        std::fill(sym.begin(), sym.end(), cheapest);  // the last-resort stream
      } else {
        // Random symbols, then central ones put back until the stream fits.
        for (uint8_t& m : sym) m = rng() % sc.levels();
        std::vector<uint8_t> big(4 * n + 64);
        while (RansEncode(sym.data(), n, sc.table(), big.data(), big.size(), scratch.data()) >
               static_cast<size_t>(sc.payload_bytes())) {
          sym[rng() % n] = cheapest;
        }
      }
      const size_t used = RansEncode(sym.data(), n, sc.table(), r + 4, sc.payload_bytes(), scratch.data());
      ASSERT_LE(used, static_cast<size_t>(sc.payload_bytes()));
      full += used == static_cast<size_t>(sc.payload_bytes());
      const uint16_t s = FloatToHalf(0.01f * (t + 1)), o = FloatToHalf(-0.3f * t);
      r[0] = s & 0xff;
      r[1] = s >> 8;
      r[2] = o & 0xff;
      r[3] = o >> 8;
    }
  }
  EXPECT_GT(full, tokens);  // most records are filled to the last byte
  CheckColdHotCold(dq, c);
}

// Real keys and values of the shared fixture (a trained model): sequence 0,
// layers 0-3, seven full windows and a partial one each.
TEST(LevelPage, ColdHotColdRealKv) {
  const std::string prefix = eval_data::FixturePrefix();
  std::ifstream kf(prefix + ".k.bin", std::ios::binary), vf(prefix + ".v.bin", std::ios::binary);
  if (!kf || !vf) GTEST_SKIP() << prefix << ".{k,v}.bin not present";
  constexpr int kTokens = 1024, kN = 4 * 128, kUsed = 1000;
  const DQuantCodec dq = MakeCodec(4, 128);
  std::vector<uint16_t> raw(kUsed * kN);
  for (int layer = 0; layer < 4; ++layer) {
    SCOPED_TRACE(testing::Message() << "layer " << layer);
    std::vector<float> k(kUsed * kN), v(kUsed * kN);
    for (auto [f, out] : {std::pair{&kf, &k}, std::pair{&vf, &v}}) {
      f->seekg(static_cast<std::streamoff>(layer) * kTokens * kN * 2);
      f->read(reinterpret_cast<char*>(raw.data()), raw.size() * 2);
      ASSERT_TRUE(*f);
      for (size_t i = 0; i < raw.size(); ++i) (*out)[i] = HalfToFloat(raw[i]);
    }
    ASSERT_GT(*std::max_element(k.begin(), k.end()), 1.0f);  // real data, not zeros
    for (int t0 = 0; t0 < kUsed; t0 += 128) {
      const int tokens = std::min(128, kUsed - t0);
      CheckStraight(dq, &k[t0 * kN], &v[t0 * kN], tokens);
    }
  }
}

// ---------------------------------------------------------------------------
// Corrupt input.

TEST(LevelPage, CorruptColdRecordIsDataLoss) {
  const DQuantCodec dq = MakeCodec(2, 64);
  const int n = dq.n(), tokens = 40;
  std::vector<float> k = Gaussian(tokens * n, 1), v = Gaussian(tokens * n, 2);
  const ColdPage good = EncodeCold(dq, k.data(), v.data(), tokens);
  const LevelPageLayout l = Layout(dq);
  std::vector<uint8_t> page(l.page_bytes, 0x77);
  const std::vector<uint8_t> untouched = page;

  // A rANS initial state below 2^23 in the payload of value record 17.
  ColdPage c = good;
  std::memset(&c.values[17 * dq.value_stride() + 4], 0, 4);
  absl::Status st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), tokens, page.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("value record of token 17"), std::string::npos) << st;
  EXPECT_EQ(page, untouched);  // nothing written on failure

  // A non-finite grid (fp16 +inf scale) in key record 0.
  c = good;
  c.keys[0] = 0x00;
  c.keys[1] = 0x7c;
  st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), tokens, page.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("key record of token 0"), std::string::npos) << st;

  // The last record's payload all 0xff: its state is out of range and the
  // stream would run past the payload (the buffers end exactly there, so
  // AddressSanitizer sees any read beyond).
  c = good;
  std::memset(&c.keys[(tokens - 1) * dq.key_stride() + 4], 0xff, dq.key_codec().payload_bytes());
  st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), tokens, page.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;

  // Single-byte flips anywhere in the payloads: a status, never a crash.
  std::mt19937_64 rng(3);
  int lost = 0;
  for (int trial = 0; trial < 200; ++trial) {
    c = good;
    std::vector<uint8_t>& recs = trial % 2 ? c.keys : c.values;
    const size_t stride = trial % 2 ? dq.key_stride() : dq.value_stride();
    const int payload = trial % 2 ? dq.key_codec().payload_bytes() : dq.value_codec().payload_bytes();
    recs[(rng() % tokens) * stride + 4 + rng() % payload] ^= static_cast<uint8_t>(1 + rng() % 255);
    st = PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), tokens, page.data());
    ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kDataLoss) << st;
    lost += !st.ok();
  }
  EXPECT_GT(lost, 150);  // the final-state check catches almost every flip

  // Shapes and token counts the page cannot hold.
  EXPECT_EQ(PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), 0, page.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), 129, page.data()).code(),
            absl::StatusCode::kInvalidArgument);
  const LevelPageLayout other = *MakeLevelPageLayout(4, 64);
  EXPECT_EQ(PromotePage(dq, other, c.keys.data(), c.values.data(), c.mean.data(), 1, page.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LevelPage, DemoteOfAPageThatDoesNotFitIsDataLoss) {
  const DQuantCodec dq = MakeCodec(2, 64);
  const LevelPageLayout l = Layout(dq);
  const int n = dq.n();
  std::mt19937_64 rng(9);
  std::vector<uint8_t> kl(128 * n), vl(128 * n), mean(4 + n, 0);
  std::vector<uint32_t> hd(128, 0);
  for (uint8_t& x : kl) x = rng() % 8;  // uniform levels: ~3 bits each, far over C
  for (uint8_t& x : vl) x = rng() % 6;
  std::vector<uint8_t> page(l.page_bytes);
  PackLevelPage(l, 128, kl.data(), vl.data(), hd.data(), hd.data(), mean.data(), page.data());
  std::vector<uint8_t> keys(128 * dq.key_stride()), values(128 * dq.value_stride()), m(dq.mean_stride());
  absl::Status st = DemotePage(dq, l, page.data(), 128, keys.data(), values.data(), m.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("key levels of token 0"), std::string::npos) << st;

  // A value byte >= 216 decodes to a digit >= 6: out of range, not coded.
  std::fill(kl.begin(), kl.end(), 3);
  std::fill(vl.begin(), vl.end(), 2);
  PackLevelPage(l, 128, kl.data(), vl.data(), hd.data(), hd.data(), mean.data(), page.data());
  page[l.value_block(1)] = 250;  // lane 0, triple 0, lower values: tokens 0, 1... of head 1
  st = DemotePage(dq, l, page.data(), 128, keys.data(), values.data(), m.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("value level"), std::string::npos) << st;
}

// Found by fuzz_level_page: a header no encoder writes (NaN scale, -inf
// offset, negative scale) used to demote to cold records that do not decode.
TEST(LevelPage, DemoteOfANonFiniteGridIsDataLoss) {
  const DQuantCodec dq = MakeCodec(2, 64);
  const LevelPageLayout l = Layout(dq);
  const int n = dq.n();
  std::vector<uint8_t> kl(128 * n, 3), vl(128 * n, 2), mean(4 + n, 0);
  std::vector<uint8_t> keys(128 * dq.key_stride()), values(128 * dq.value_stride()), m(dq.mean_stride());
  std::vector<uint8_t> page(l.page_bytes);
  const uint32_t one = 0x3c00;  // scale 1.0, offset 0.0
  for (uint32_t bad : {0x7e00u, 0xfc000000u | one, 0xbc00u}) {
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<uint32_t> kh(128, one), vh(128, one);
      (kind == 0 ? kh : vh)[77] = bad;
      PackLevelPage(l, 128, kl.data(), vl.data(), kh.data(), vh.data(), mean.data(), page.data());
      absl::Status st = DemotePage(dq, l, page.data(), 128, keys.data(), values.data(), m.data());
      EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << bad << " " << kind << " " << st;
      EXPECT_NE(std::string(st.message()).find("of token 77 is not finite"), std::string::npos) << st;
    }
  }
  float scale = 0, offset = 0;
  EXPECT_TRUE(LevelHeaderGrid(one, &scale, &offset));
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(offset, 0.0f);
}

// ---------------------------------------------------------------------------
// LevelAttention against CompressedAttention: the same bits.

void CheckAttentionBitIdentical(int heads, int dim, int q_heads, int tokens, int window, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << heads << "x" << dim << " q_heads " << q_heads << ", " << tokens
                                  << " tokens, window " << window);
  const DQuantCodec dq = MakeCodec(heads, dim);
  const LevelPageLayout l = Layout(dq);
  const int n = dq.n();
  std::vector<float> k = Gaussian(tokens * n, seed, 1.0f), v = Gaussian(tokens * n, seed + 1);
  for (int t = 0; t < tokens; ++t) k[t * n + 3] += 2.0f;
  const std::vector<float> q = Gaussian(q_heads * dim, seed + 2, 0.7f);
  std::vector<ColdPage> cold;
  std::vector<std::vector<uint8_t>> hot;
  std::vector<CompressedBlock> blocks;
  std::vector<LevelPageRef> refs;
  for (int t0 = 0; t0 < tokens; t0 += 128) {
    const int count = std::min(128, tokens - t0);
    cold.push_back(EncodeCold(dq, &k[t0 * n], &v[t0 * n], count));
    hot.emplace_back(l.page_bytes);
    ASSERT_TRUE(PromotePage(dq, l, cold.back().keys.data(), cold.back().values.data(), cold.back().mean.data(), count,
                            hot.back().data())
                    .ok());
  }
  for (size_t i = 0; i < cold.size(); ++i) {
    blocks.push_back({cold[i].keys.data(), cold[i].values.data(), cold[i].mean.data(), cold[i].tokens});
    refs.push_back({hot[i].data(), cold[i].tokens});
  }
  std::vector<float> wf = Gaussian(2 * window * n, seed + 3);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = FloatToBf16(wf[i]);
  const Bf16Tokens win{wb.data(), wb.data() + window * n, window};

  std::vector<float> out_cold(q_heads * dim), lse_cold(q_heads), out_hot(q_heads * dim, 1.0f), lse_hot(q_heads);
  AttentionScratch as;
  LevelAttentionScratch ls;
  absl::Status st =
      CompressedAttention(dq, blocks, win, q.data(), q_heads, 0.125f, out_cold.data(), lse_cold.data(), &as);
  ASSERT_TRUE(st.ok()) << st;
  st = LevelAttention(dq, refs, win, q.data(), q_heads, 0.125f, out_hot.data(), lse_hot.data(), &ls);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(0, std::memcmp(out_cold.data(), out_hot.data(), out_cold.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lse_cold.data(), lse_hot.data(), lse_cold.size() * sizeof(float)));
  EXPECT_TRUE(std::isfinite(lse_hot[0]));
  // A second call with the same scratch gives the same bits.
  std::vector<float> out2(out_hot.size()), lse2(lse_hot.size());
  ASSERT_TRUE(LevelAttention(dq, refs, win, q.data(), q_heads, 0.125f, out2.data(), lse2.data(), &ls).ok());
  EXPECT_EQ(out2, out_hot);
}

TEST(LevelAttention, BitIdenticalToCompressedAttention) {
  CheckAttentionBitIdentical(8, 128, 32, 256, 0, 1);   // GQA 4, full pages
  CheckAttentionBitIdentical(8, 128, 32, 300, 21, 2);  // partial last page, window
  CheckAttentionBitIdentical(4, 64, 8, 257, 0, 3);     // GQA 2, a last page of 1 token
  CheckAttentionBitIdentical(4, 64, 8, 200, 64, 4);
  CheckAttentionBitIdentical(2, 64, 2, 90, 5, 5);  // one partial page, no GQA
}

TEST(LevelAttention, RealKvBitIdentical) {
  const std::string prefix = eval_data::FixturePrefix();
  std::ifstream kf(prefix + ".k.bin", std::ios::binary), vf(prefix + ".v.bin", std::ios::binary),
      qf(prefix + ".q.bin", std::ios::binary);
  if (!kf || !vf || !qf) GTEST_SKIP() << prefix << ".*.bin not present";
  constexpr int kTokens = 1024, kN = 512, kUsed = 320, kQHeads = 8, kD = 128, kLayer = 2;
  const DQuantCodec dq = MakeCodec(4, kD);
  const LevelPageLayout l = Layout(dq);
  std::vector<uint16_t> raw(kUsed * kN);
  std::vector<float> k(raw.size()), v(raw.size()), q(kQHeads * kD);
  for (auto [f, out] : {std::pair{&kf, &k}, std::pair{&vf, &v}}) {
    f->seekg(static_cast<std::streamoff>(kLayer) * kTokens * kN * 2);
    f->read(reinterpret_cast<char*>(raw.data()), raw.size() * 2);
    ASSERT_TRUE(*f);
    for (size_t i = 0; i < raw.size(); ++i) (*out)[i] = HalfToFloat(raw[i]);
  }
  qf.seekg(static_cast<std::streamoff>(kLayer) * 128 * kQHeads * kD * 2);
  qf.read(reinterpret_cast<char*>(raw.data()), q.size() * 2);
  ASSERT_TRUE(qf);
  for (size_t i = 0; i < q.size(); ++i) q[i] = HalfToFloat(raw[i]);
  std::vector<ColdPage> cold;
  std::vector<std::vector<uint8_t>> hot;
  std::vector<CompressedBlock> blocks;
  std::vector<LevelPageRef> refs;
  for (int t0 = 0; t0 < kUsed; t0 += 128) {
    const int count = std::min(128, kUsed - t0);
    cold.push_back(EncodeCold(dq, &k[t0 * kN], &v[t0 * kN], count));
    hot.emplace_back(l.page_bytes);
    ASSERT_TRUE(PromotePage(dq, l, cold.back().keys.data(), cold.back().values.data(), cold.back().mean.data(), count,
                            hot.back().data())
                    .ok());
  }
  for (size_t i = 0; i < cold.size(); ++i) {
    blocks.push_back({cold[i].keys.data(), cold[i].values.data(), cold[i].mean.data(), cold[i].tokens});
    refs.push_back({hot[i].data(), cold[i].tokens});
  }
  std::vector<float> oc(kQHeads * kD), lc(kQHeads), oh(kQHeads * kD), lh(kQHeads);
  AttentionScratch as;
  LevelAttentionScratch ls;
  const float scale = 1.0f / std::sqrt(128.0f);
  ASSERT_TRUE(CompressedAttention(dq, blocks, {}, q.data(), kQHeads, scale, oc.data(), lc.data(), &as).ok());
  ASSERT_TRUE(LevelAttention(dq, refs, {}, q.data(), kQHeads, scale, oh.data(), lh.data(), &ls).ok());
  EXPECT_EQ(0, std::memcmp(oc.data(), oh.data(), oc.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(lc.data(), lh.data(), lc.size() * sizeof(float)));
}

TEST(LevelAttention, BadInputIsAStatus) {
  const DQuantCodec dq = MakeCodec(2, 64);
  const LevelPageLayout l = Layout(dq);
  const int n = dq.n();
  std::vector<float> k = Gaussian(128 * n, 1), v = Gaussian(128 * n, 2), q = Gaussian(4 * 64, 3);
  ColdPage c = EncodeCold(dq, k.data(), v.data(), 128);
  std::vector<uint8_t> page(l.page_bytes);
  ASSERT_TRUE(PromotePage(dq, l, c.keys.data(), c.values.data(), c.mean.data(), 128, page.data()).ok());
  std::vector<float> out(4 * 64), lse(4);
  LevelAttentionScratch s;
  LevelPageRef ref{page.data(), 128};
  EXPECT_EQ(LevelAttention(dq, {&ref, 1}, {}, q.data(), 3, 0.1f, out.data(), lse.data(), &s).code(),
            absl::StatusCode::kInvalidArgument);
  LevelPageRef bad{page.data(), 0};
  EXPECT_EQ(LevelAttention(dq, {&bad, 1}, {}, q.data(), 4, 0.1f, out.data(), lse.data(), &s).code(),
            absl::StatusCode::kInvalidArgument);
  // Value header of token 5: fp16 NaN offset.
  page[512 + 4 * 5 + 2] = 0x01;
  page[512 + 4 * 5 + 3] = 0x7e;
  absl::Status st = LevelAttention(dq, {&ref, 1}, {}, q.data(), 4, 0.1f, out.data(), lse.data(), &s);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
  EXPECT_NE(std::string(st.message()).find("value grid"), std::string::npos) << st;
  // No pages and no window: out = 0, lse = -inf, like CompressedAttention.
  ASSERT_TRUE(LevelAttention(dq, {}, {}, q.data(), 4, 0.1f, out.data(), lse.data(), &s).ok());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
}

}  // namespace
}  // namespace driftkv
