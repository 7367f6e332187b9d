#include "codec/level_page.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__SSSE3__)
#include <tmmintrin.h>
#endif

#include "absl/strings/str_cat.h"
#include "codec/dquant_codec.h"
#include "codec/page_layout.h"
#include "codec/rans.h"
#include "codec/stream_codec.h"
#include "wire/half.h"

namespace driftkv {
namespace {

// The mma.m16n8k16 A-fragment geometry the layout follows (level_page.h).
constexpr int kLanes = 32;                                            // one warp
constexpr int kVecBytes = 16;                                         // one uint4 per lane and load
constexpr int kVecWords = kVecBytes / 4;                              // 4 words in a uint4
constexpr int kTile = 16;                                             // m16 rows, k16 columns
constexpr int kPageTiles = kLevelPageTokens / kTile;                  // 8 token tiles in a page
constexpr int kRegs = 4;                                              // a0..a3, one pair each
constexpr int kHeaderBytes = 4;                                       // fp16 scale + fp16 offset
constexpr int kValueHeadersOffset = kLevelPageTokens * kHeaderBytes;  // 512
static_assert(2 * kValueHeadersOffset == kLevelHeadersBytes, "key then value headers");
static_assert(kLevelMeanLevelsOffset == kLevelMeanOffset + kMeanHeaderBytes, "fp32 scale, then int8");

// Keys: 3 bits a level; a group of 16 pairs fills 3 words: 5 pairs a word at
// bits [3e, 3e + 3) (lower value) and [16 + 3e, ...) (upper value), and the
// 16th pair's bit b at bits 15 and 31 of word b.
constexpr int kKeyBits = 3;
constexpr uint32_t kKeyMask2 = 0x00070007u;  // one level in each 16-bit half
constexpr int kKeyGroupPairs = 16;
constexpr int kKeyGroupWords = 3;
constexpr int kKeyWordPairs = 5;
static_assert(kKeyWordPairs * kKeyBits == 15, "pairs 0..14 leave bit 15 of each half free");
static_assert(kKeyGroupWords * kKeyWordPairs + 1 == kKeyGroupPairs, "the 16th pair uses the free bits");
static_assert(1 << kKeyBits == kLevelKeyMaxLevels, "3-bit key fields");

// Values: base 6, three pairs' lower values in one byte (6^3 = 216 <= 256),
// their upper values in another.
constexpr int kValueBase = kLevelValueMaxLevels;
constexpr int kTriplePairs = 3;
constexpr int kValueGroups = 3;  // k-steps 0-2, 3-5, 6-7
static_assert(kValueBase * kValueBase * kValueBase <= 256, "a triple fits a byte");

uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

void StoreLe32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

// Byte offset, in a key or value block, of word w of lane `lane`: uint4 w / 4
// of the lane at (j * 32 + lane) * 16, component w % 4.
size_t WordOffset(int lane, int w) {
  return (static_cast<size_t>(w / kVecWords) * kLanes + lane) * kVecBytes + (w % kVecWords) * 4;
}

// THE MAPPING (one definition for pack and unpack). The pairs of lane `lane`
// of one KV head in the order the page stores them, as the offset of each
// pair's lower value in a level array where token t, channel c (of the head)
// is at t * token_stride + c * channel_stride. The upper value is the next
// channel for keys, the next token for values. 2 * head_dim pairs.
//   A fragment: register r of lane 4g + t holds row g + 8 (r & 1), columns
//   c, c + 1 with c = 2t + 8 (r >> 1).
//   Keys:   index mt * (D / 4) + ks * 4 + r = token 16 mt + row, channel 16 ks + c.
//   Values: index (ks * MT + mt) * 4 + r = channel 16 mt + row, token 16 ks + c.
// The lanes of a quad (4g + t, t = 0..3) differ only in t: their i-th pairs
// are 2t columns apart, so the quad's i-th pairs are 8 consecutive levels
// along the fragment's columns (keys: channels, values: tokens). The fast
// unpack below relies on this.
void LanePairs(bool keys, int lane, int token_stride, int channel_stride, int head_dim, int32_t* lower) {
  const int g = lane / 4, t = lane % 4;
  const int row_stride = keys ? token_stride : channel_stride;  // A's rows: key tokens, value channels
  const int col_stride = keys ? channel_stride : token_stride;
  int32_t frag[kRegs];  // row and column of each register, as a level offset
  for (int r = 0; r < kRegs; ++r) {
    frag[r] = (g + 8 * (r & 1)) * row_stride + (2 * t + 8 * (r >> 1)) * col_stride;
  }
  // Either way the outer loop runs over the page's 8 token tiles (key m-tiles,
  // value k-steps) and the inner one over the head's channel tiles.
  int i = 0;
  for (int a = 0; a < kPageTiles; ++a) {
    for (int b = 0; b < head_dim / kTile; ++b) {
      const int32_t base = kTile * (a * token_stride + b * channel_stride);
      for (int r = 0; r < kRegs; ++r) lower[i++] = base + frag[r];
    }
  }
}

int ValueGroupPairs(int head_dim, int group) {
  return LevelValueGroupKsteps(group) * (head_dim / kTile) * kRegs;
}

void PackKeys(const LevelPageLayout& layout, int tokens, const uint8_t* levels, uint8_t* page) {
  const int n = layout.n(), d = layout.head_dim, pairs = 2 * d;
  std::vector<int32_t> lower(pairs);
  for (int lane = 0; lane < kLanes; ++lane) {
    LanePairs(true, lane, n, 1, d, lower.data());
    for (int h = 0; h < layout.kv_heads; ++h) {
      uint8_t* block = page + layout.key_block(h);
      const uint8_t* lv = levels + static_cast<size_t>(h) * d;
      // Offsets at or past `limit` are tokens the page does not hold.
      const int64_t limit = static_cast<int64_t>(tokens) * n - static_cast<int64_t>(h) * d;
      for (int grp = 0; grp < pairs / kKeyGroupPairs; ++grp) {
        uint32_t w[kKeyGroupWords] = {0, 0, 0};
        for (int e = 0; e < kKeyGroupPairs; ++e) {
          const int32_t o = lower[grp * kKeyGroupPairs + e];
          const uint32_t lo = o < limit ? lv[o] & 7u : 0u, hi = o < limit ? lv[o + 1] & 7u : 0u;
          if (e < kKeyGroupWords * kKeyWordPairs) {
            const int shift = kKeyBits * (e % kKeyWordPairs);
            w[e / kKeyWordPairs] |= (lo << shift) | (hi << (16 + shift));
          } else {
            for (int b = 0; b < kKeyBits; ++b) w[b] |= (((lo >> b) & 1u) << 15) | (((hi >> b) & 1u) << 31);
          }
        }
        for (int k = 0; k < kKeyGroupWords; ++k) StoreLe32(block + WordOffset(lane, grp * kKeyGroupWords + k), w[k]);
      }
    }
  }
}

void PackValues(const LevelPageLayout& layout, int tokens, const uint8_t* levels, uint8_t* page) {
  const int n = layout.n(), d = layout.head_dim;
  std::vector<int32_t> lower(2 * d);
  for (int lane = 0; lane < kLanes; ++lane) {
    LanePairs(false, lane, n, 1, d, lower.data());
    for (int h = 0; h < layout.kv_heads; ++h) {
      uint8_t* block = page + layout.value_block(h);
      const uint8_t* lv = levels + static_cast<size_t>(h) * d;
      const int64_t limit = static_cast<int64_t>(tokens) * n - static_cast<int64_t>(h) * d;
      const int32_t* o = lower.data();
      for (int grp = 0; grp < kValueGroups; ++grp) {
        const int count = ValueGroupPairs(d, grp);
        const int first_word = LevelValueGroupFirstVec(d, grp) * kVecWords;
        const int triples = (count + kTriplePairs - 1) / kTriplePairs;
        for (int w = 0; w < LevelValueGroupWords(d, grp); ++w) {
          uint32_t word = 0;
          for (int half = 0; half < 2; ++half) {  // triples 2w (bytes 0, 2) and 2w + 1 (bytes 1, 3)
            const int j = 2 * w + half;
            uint32_t even = 0, odd = 0;  // E_j, O_j
            for (int dg = kTriplePairs - 1; dg >= 0 && j < triples; --dg) {
              const int i = kTriplePairs * j + dg;
              const bool have = i < count && o[i] < limit;
              even = even * kValueBase + (have ? lv[o[i]] : 0u);
              odd = odd * kValueBase + (i < count && o[i] + n < limit ? lv[o[i] + n] : 0u);
            }
            word |= (even << (8 * half)) | (odd << (16 + 8 * half));
          }
          StoreLe32(block + WordOffset(lane, first_word + w), word);
        }
        o += count;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Unpacking, the hot path: one quad (lanes 4g + t, t = 0..3) at a time. The
// quad's words are transposed so that one 4-wide operation decodes the same
// pair of its four lanes: 8 levels, consecutive along the fragment columns,
// written with one 8-byte store (see LanePairs). Keys go straight to
// [token][n]; values, consecutive along tokens, go to a [channel][token]
// tile of the head that is then transposed. The primitives have an SSSE3
// and a portable version; everything else is shared.

#if defined(__SSSE3__)

// One 32-bit word of each lane of a quad, lane 4g + t in element t.
using Quad = __m128i;

inline Quad QuadShr(Quad x, int s) {
  return _mm_srli_epi32(x, s);
}
inline Quad QuadAnd(Quad x, uint32_t m) {
  return _mm_and_si128(x, _mm_set1_epi32(static_cast<int>(m)));
}
inline Quad QuadOr(Quad a, Quad b) {
  return _mm_or_si128(a, b);
}

// Words 4j .. 4j + 3 of the quad's lanes (uint4 j of each, 64 contiguous
// bytes) into q[0..4), transposed: q[c] element t = lane 4g + t's word 4j + c.
inline void LoadQuadVec(const uint8_t* block, int g, int j, Quad* q) {
  const uint8_t* p = block + (static_cast<size_t>(j) * kLanes + 4 * g) * kVecBytes;
  const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
  const __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
  const __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 48));
  const __m128i t0 = _mm_unpacklo_epi32(a0, a1), t1 = _mm_unpacklo_epi32(a2, a3);
  const __m128i t2 = _mm_unpackhi_epi32(a0, a1), t3 = _mm_unpackhi_epi32(a2, a3);
  q[0] = _mm_unpacklo_epi64(t0, t1);
  q[1] = _mm_unpackhi_epi64(t0, t1);
  q[2] = _mm_unpacklo_epi64(t2, t3);
  q[3] = _mm_unpackhi_epi64(t2, t3);
}

// Byte 0 (lower level) and byte 2 (upper level) of element t to p[2t] and
// p[2t + 1]: one 8-byte store.
inline void StoreQuadPairs(Quad x, uint8_t* p) {
  const __m128i pick = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_shuffle_epi8(x, pick));
}

// LevelBase6Digits on each element, in 16-bit lanes (no mask needed there).
inline void QuadBase6(Quad x, Quad digit[3]) {
  const __m128i l2 = _mm_srli_epi16(_mm_mullo_epi16(x, _mm_set1_epi16(57)), 11);
  const __m128i r = _mm_sub_epi16(x, _mm_mullo_epi16(l2, _mm_set1_epi16(36)));
  const __m128i l1 = _mm_srli_epi16(_mm_mullo_epi16(r, _mm_set1_epi16(43)), 8);
  digit[0] = _mm_sub_epi16(r, _mm_mullo_epi16(l1, _mm_set1_epi16(6)));
  digit[1] = l1;
  digit[2] = l2;
}

// dst[t * dst_stride + c] = src[c * src_stride + t] for a 16 x 16 block:
// four rounds of byte interleaving, each rotating the 8-bit (register,
// byte) address left by one bit, so four swap its halves.
inline void Transpose16(const uint8_t* src, size_t src_stride, uint8_t* dst, size_t dst_stride) {
  __m128i a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
  auto round = [](const __m128i* in, __m128i* out) {
    for (int i = 0; i < 8; ++i) {
      out[2 * i] = _mm_unpacklo_epi8(in[i], in[i + 8]);
      out[2 * i + 1] = _mm_unpackhi_epi8(in[i], in[i + 8]);
    }
  };
  round(a, b);
  round(b, a);
  round(a, b);
  round(b, a);
  for (int i = 0; i < 16; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * dst_stride), a[i]);
}

#else  // portable primitives, same results

struct Quad {
  uint32_t v[4];
};

inline Quad QuadShr(Quad x, int s) {
  for (uint32_t& e : x.v) e >>= s;
  return x;
}
inline Quad QuadAnd(Quad x, uint32_t m) {
  for (uint32_t& e : x.v) e &= m;
  return x;
}
inline Quad QuadOr(Quad a, Quad b) {
  for (int t = 0; t < 4; ++t) a.v[t] |= b.v[t];
  return a;
}
inline void LoadQuadVec(const uint8_t* block, int g, int j, Quad* q) {
  for (int t = 0; t < 4; ++t) {
    for (int c = 0; c < kVecWords; ++c) q[c].v[t] = LoadLe32(block + WordOffset(4 * g + t, kVecWords * j + c));
  }
}
inline void StoreQuadPairs(Quad x, uint8_t* p) {
  for (int t = 0; t < 4; ++t) {
    p[2 * t] = static_cast<uint8_t>(x.v[t]);
    p[2 * t + 1] = static_cast<uint8_t>(x.v[t] >> 16);
  }
}
inline void QuadBase6(Quad x, Quad digit[3]) {
  for (int t = 0; t < 4; ++t) {
    uint32_t d[3];
    LevelBase6Digits(x.v[t], d);
    for (int k = 0; k < 3; ++k) digit[k].v[t] = d[k];
  }
}
inline void Transpose16(const uint8_t* src, size_t src_stride, uint8_t* dst, size_t dst_stride) {
  for (int t = 0; t < 16; ++t) {
    for (int c = 0; c < 16; ++c) dst[t * dst_stride + c] = src[c * src_stride + t];
  }
}

#endif

constexpr int kQuads = kLanes / 4;
constexpr int kMaxHeadDim = 128;
constexpr int kMaxLanePairs = 2 * kMaxHeadDim;
constexpr int kMaxLaneWords = kMaxLanePairs / kKeyGroupPairs * kKeyGroupWords;  // keys: 48 >= values' 44

void UnpackKeys(const LevelPageLayout& layout, const uint8_t* page, uint8_t* levels) {
  const int n = layout.n(), d = layout.head_dim, pairs = 2 * d;
  const int vecs = pairs / kKeyGroupPairs * kKeyGroupWords / kVecWords;
  int32_t lower[kQuads][kMaxLanePairs];  // of lane 4g; lane 4g + t is 2t channels further
  for (int g = 0; g < kQuads; ++g) LanePairs(true, 4 * g, n, 1, d, lower[g]);
  Quad words[kMaxLaneWords];
  for (int h = 0; h < layout.kv_heads; ++h) {
    const uint8_t* block = page + layout.key_block(h);
    uint8_t* out = levels + static_cast<size_t>(h) * d;
    for (int g = 0; g < kQuads; ++g) {
      for (int j = 0; j < vecs; ++j) LoadQuadVec(block, g, j, words + kVecWords * j);
      for (int grp = 0; grp < pairs / kKeyGroupPairs; ++grp) {
        const Quad* w = words + grp * kKeyGroupWords;
        const int32_t* o = lower[g] + grp * kKeyGroupPairs;
        for (int k = 0; k < kKeyGroupWords; ++k) {
          for (int f = 0; f < kKeyWordPairs; ++f) {
            StoreQuadPairs(QuadAnd(QuadShr(w[k], kKeyBits * f), kKeyMask2), out + o[k * kKeyWordPairs + f]);
          }
        }
        // Pair 15: bit b in bits 15 (lower) and 31 (upper) of word b.
        const Quad x = QuadOr(QuadOr(QuadAnd(QuadShr(w[0], 15), 0x00010001u), QuadAnd(QuadShr(w[1], 14), 0x00020002u)),
                              QuadAnd(QuadShr(w[2], 13), 0x00040004u));
        StoreQuadPairs(x, out + o[kKeyGroupPairs - 1]);
      }
    }
  }
}

void UnpackValues(const LevelPageLayout& layout, const uint8_t* page, uint8_t* levels) {
  const int n = layout.n(), d = layout.head_dim;
  const int vecs = LevelValueGroupFirstVec(d, kValueGroups);
  int32_t lower[kQuads][kMaxLanePairs];  // in the tile; lane 4g + t is 2t tokens further
  for (int g = 0; g < kQuads; ++g) LanePairs(false, 4 * g, 1, kLevelPageTokens, d, lower[g]);
  uint8_t tile[kMaxHeadDim * kLevelPageTokens];  // [channel][token] of one head
  Quad words[kMaxLaneWords];
  for (int h = 0; h < layout.kv_heads; ++h) {
    const uint8_t* block = page + layout.value_block(h);
    for (int g = 0; g < kQuads; ++g) {
      for (int j = 0; j < vecs; ++j) LoadQuadVec(block, g, j, words + kVecWords * j);
      const int32_t* o = lower[g];
      for (int grp = 0; grp < kValueGroups; ++grp) {
        const int count = ValueGroupPairs(d, grp);
        const Quad* w = words + LevelValueGroupFirstVec(d, grp) * kVecWords;
        // Triple j: bytes 0 and 2 (j even) or 1 and 3 (j odd) of word j / 2.
        for (int j = 0; kTriplePairs * j < count; ++j) {
          Quad digit[kTriplePairs];  // lower level in byte 0, upper in byte 2
          QuadBase6(QuadAnd(QuadShr(w[j / 2], 8 * (j & 1)), 0x00ff00ffu), digit);
          for (int dg = 0; dg < kTriplePairs && kTriplePairs * j + dg < count; ++dg) {
            StoreQuadPairs(digit[dg], tile + o[kTriplePairs * j + dg]);
          }
        }
        o += count;
      }
    }
    uint8_t* out = levels + static_cast<size_t>(h) * d;
    for (int c = 0; c < d; c += 16) {
      for (int t = 0; t < kLevelPageTokens; t += 16) {
        Transpose16(tile + c * kLevelPageTokens + t, kLevelPageTokens, out + static_cast<size_t>(t) * n + c, n);
      }
    }
  }
}

absl::Status CheckShape(const DQuantCodec& codec, const LevelPageLayout& layout, int tokens) {
  if (layout.kv_heads != codec.config().kv_heads || layout.head_dim != codec.config().head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("level page layout ", layout.kv_heads, "x", layout.head_dim,
                                                   " does not match the codec's ", codec.config().kv_heads, "x",
                                                   codec.config().head_dim));
  }
  absl::StatusOr<LevelPageLayout> own = MakeLevelPageLayout(codec);
  if (!own.ok()) return own.status();
  if (layout.blocks_offset != own->blocks_offset || layout.key_block_bytes != own->key_block_bytes ||
      layout.value_block_bytes != own->value_block_bytes || layout.page_bytes != own->page_bytes) {
    return absl::InvalidArgumentError("level page layout is not MakeLevelPageLayout(codec)");
  }
  if (tokens < 1 || tokens > kLevelPageTokens) {
    return absl::InvalidArgumentError(absl::StrCat("tokens ", tokens, " out of range [1, ", kLevelPageTokens, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LevelPageLayout> MakeLevelPageLayout(int kv_heads, int head_dim) {
  if (head_dim != 64 && head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", head_dim, " has no level page (64 or 128)"));
  }
  if (kv_heads < 1 || kv_heads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("kv_heads ", kv_heads, " out of range [1, 1024]"));
  }
  LevelPageLayout l;
  l.kv_heads = kv_heads;
  l.head_dim = head_dim;
  l.blocks_offset = kLevelMeanLevelsOffset + static_cast<size_t>(l.n());
  l.key_block_bytes = static_cast<size_t>(kLevelPageTokens) * head_dim * kKeyBits / 8;  // 48 * head_dim
  l.value_block_bytes = static_cast<size_t>(LevelValueGroupFirstVec(head_dim, kValueGroups)) * kLanes * kVecBytes;
  const size_t end = l.blocks_offset + static_cast<size_t>(kv_heads) * l.head_bytes();
  l.page_bytes = (end + kPageAlign - 1) / kPageAlign * kPageAlign;
  return l;
}

absl::StatusOr<LevelPageLayout> MakeLevelPageLayout(const DQuantCodec& codec) {
  const DQuantConfig& c = codec.config();
  if (c.key_levels > kLevelKeyMaxLevels) {
    return absl::InvalidArgumentError(absl::StrCat("key_levels ", c.key_levels, " has no level page (at most ",
                                                   kLevelKeyMaxLevels, ": 3-bit fields)"));
  }
  if (c.value_levels > kLevelValueMaxLevels) {
    return absl::InvalidArgumentError(absl::StrCat("value_levels ", c.value_levels, " has no level page (at most ",
                                                   kLevelValueMaxLevels, ": base-6 digits)"));
  }
  if (c.mean_window != kLevelPageTokens) {
    return absl::InvalidArgumentError(absl::StrCat("mean_window ", c.mean_window, " has no level page (a page is ",
                                                   kLevelPageTokens, " tokens, one mean window)"));
  }
  return MakeLevelPageLayout(c.kv_heads, c.head_dim);
}

void PackLevelPage(const LevelPageLayout& layout, int tokens, const uint8_t* key_levels, const uint8_t* value_levels,
                   const uint32_t* key_headers, const uint32_t* value_headers, const uint8_t* mean_record,
                   uint8_t* page) {
  std::memset(page, 0, layout.page_bytes);
  for (int t = 0; t < tokens; ++t) {
    StoreLe32(page + kHeaderBytes * t, key_headers[t]);
    StoreLe32(page + kValueHeadersOffset + kHeaderBytes * t, value_headers[t]);
  }
  std::memcpy(page + kLevelMeanOffset, mean_record, kMeanHeaderBytes + static_cast<size_t>(layout.n()));
  PackKeys(layout, tokens, key_levels, page);
  PackValues(layout, tokens, value_levels, page);
}

void UnpackLevelPage(const LevelPageLayout& layout, const uint8_t* page, uint8_t* key_levels, uint8_t* value_levels,
                     uint32_t* key_headers, uint32_t* value_headers, uint8_t* mean_record) {
  for (int t = 0; t < kLevelPageTokens; ++t) {
    key_headers[t] = LoadLe32(page + kHeaderBytes * t);
    value_headers[t] = LoadLe32(page + kValueHeadersOffset + kHeaderBytes * t);
  }
  std::memcpy(mean_record, page + kLevelMeanOffset, kMeanHeaderBytes + static_cast<size_t>(layout.n()));
  UnpackKeys(layout, page, key_levels);
  UnpackValues(layout, page, value_levels);
}

absl::Status PromotePage(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* key_records,
                         const uint8_t* value_records, const uint8_t* mean_record, int tokens, uint8_t* page) {
  absl::Status st = CheckShape(codec, layout, tokens);
  if (!st.ok()) return st;
  const size_t n = codec.n();
  std::vector<uint8_t> levels(2 * tokens * n);  // keys, then values
  std::vector<uint32_t> headers(2 * tokens);
  for (int kind = 0; kind < 2; ++kind) {
    const StreamCodec& sc = kind == 0 ? codec.key_codec() : codec.value_codec();
    const uint8_t* records = kind == 0 ? key_records : value_records;
    uint8_t* out = levels.data() + kind * tokens * n;
    for (int t0 = 0; t0 < tokens; t0 += 2) {  // two at a time: the rANS chains interleave
      const int count = std::min(2, tokens - t0);
      float scale[2], offset[2];
      if (!sc.DecodeSymbolsUpTo2(records + t0 * sc.stride(), count, out + t0 * n, scale, offset).ok()) {
        for (int t = t0; t < t0 + count; ++t) {  // name the record
          st = sc.DecodeSymbols(records + t * sc.stride(), out + t * n, scale, offset);
          if (!st.ok()) {
            return absl::DataLossError(
                absl::StrCat(kind == 0 ? "key" : "value", " record of token ", t, ": ", st.message()));
          }
        }
      }
      for (int t = t0; t < t0 + count; ++t) headers[kind * tokens + t] = LoadLe32(records + t * sc.stride());
    }
  }
  PackLevelPage(layout, tokens, levels.data(), levels.data() + tokens * n, headers.data(), headers.data() + tokens,
                mean_record, page);
  return absl::OkStatus();
}

absl::Status EncodeLevelPage(const DQuantCodec& codec, const LevelPageLayout& layout, const float* keys,
                             const float* values, int tokens, uint8_t* key_records, uint8_t* value_records,
                             uint8_t* mean_record, uint8_t* page, CodecScratch* scratch, StreamStats* key_stats,
                             StreamStats* value_stats, StreamStats* key_each, StreamStats* value_each) {
  absl::Status st = CheckShape(codec, layout, tokens);
  if (!st.ok()) return st;
  const size_t n = codec.n();
  thread_local std::vector<uint8_t> levels;  // keys, then values
  thread_local std::vector<uint32_t> headers;
  levels.resize(2 * tokens * n);
  headers.resize(2 * tokens);
  st = codec.EncodeWindow(keys, values, tokens, key_records, value_records, mean_record, scratch, key_stats,
                          value_stats, key_each, value_each, levels.data(), levels.data() + tokens * n);
  if (!st.ok()) return st;
  for (int t = 0; t < tokens; ++t) {
    headers[t] = LoadLe32(key_records + t * codec.key_stride());
    headers[tokens + t] = LoadLe32(value_records + t * codec.value_stride());
  }
  PackLevelPage(layout, tokens, levels.data(), levels.data() + tokens * n, headers.data(), headers.data() + tokens,
                mean_record, page);
  return absl::OkStatus();
}

bool LevelHeaderGrid(uint32_t header, float* scale, float* offset) {
  *scale = HalfToFloat(static_cast<uint16_t>(header));
  *offset = HalfToFloat(static_cast<uint16_t>(header >> 16));
  return std::isfinite(*scale) && std::isfinite(*offset) && *scale >= 0.0f;
}

absl::Status DemotePage(const DQuantCodec& codec, const LevelPageLayout& layout, const uint8_t* page, int tokens,
                        uint8_t* key_records, uint8_t* value_records, uint8_t* mean_record) {
  absl::Status st = CheckShape(codec, layout, tokens);
  if (!st.ok()) return st;
  const size_t n = codec.n();
  std::vector<uint8_t> levels(2 * kLevelPageTokens * n);  // keys, then values
  std::vector<uint32_t> headers(2 * kLevelPageTokens);
  std::vector<uint8_t> mean(kMeanHeaderBytes + n), scratch(n + kStateBytes);
  UnpackLevelPage(layout, page, levels.data(), levels.data() + kLevelPageTokens * n, headers.data(),
                  headers.data() + kLevelPageTokens, mean.data());
  for (int kind = 0; kind < 2; ++kind) {
    const StreamCodec& sc = kind == 0 ? codec.key_codec() : codec.value_codec();
    uint8_t* records = kind == 0 ? key_records : value_records;
    const char* what = kind == 0 ? "key" : "value";
    for (int t = 0; t < tokens; ++t) {
      const uint8_t* m = levels.data() + (kind * kLevelPageTokens + t) * n;
      uint8_t* record = records + t * sc.stride();
      uint8_t top = 0;
      for (size_t j = 0; j < n; ++j) top = std::max(top, m[j]);
      if (top >= sc.levels()) {
        return absl::DataLossError(absl::StrCat("level page: ", what, " level ", top, " of token ", t,
                                                " out of range [0, ", sc.levels(), ")"));
      }
      float scale, offset;
      if (!LevelHeaderGrid(headers[kind * kLevelPageTokens + t], &scale, &offset)) {
        return absl::DataLossError(
            absl::StrCat("level page: ", what, " grid (scale/offset) of token ", t, " is not finite"));
      }
      StoreLe32(record, headers[kind * kLevelPageTokens + t]);
      const size_t used = RansEncode(m, static_cast<int>(n), sc.table(), record + kRecordHeaderBytes,
                                     sc.payload_bytes(), scratch.data());
      if (used > static_cast<size_t>(sc.payload_bytes())) {
        return absl::DataLossError(absl::StrCat("level page: ", what, " levels of token ", t, " need ", used,
                                                " rANS bytes, the record holds ", sc.payload_bytes()));
      }
      const size_t end = kRecordHeaderBytes + sc.payload_bytes();
      std::memset(record + end, 0, sc.stride() - end);
    }
  }
  std::memcpy(mean_record, mean.data(), mean.size());
  std::memset(mean_record + mean.size(), 0, codec.mean_stride() - mean.size());
  return absl::OkStatus();
}

}  // namespace driftkv
