// A level page's key and value blocks, one lane's group at a time, packed
// from and unpacked to levels held as lv[token][row_bytes] (the FRAGMENT
// ORDER of codec/level_page.h): the one definition that the device's
// promotion packs by (kernels/level_promote.cu) and its demotion unpacks by
// (kernels/level_demote.cu), compiled for the host too so that
// tests/level_fragments_test.cc holds it to the host's PackLevelPage and
// UnpackLevelPage byte for byte.
//
// Offsets are bytes into lv; a pair's upper value is the byte after its
// lower one for keys (two channels of one token) and the next row for
// values (two tokens of one channel). Word offsets count 32-bit words into
// one head's block.
#ifndef DRIFTKV_CODEC_LEVEL_FRAGMENTS_H_
#define DRIFTKV_CODEC_LEVEL_FRAGMENTS_H_

#include <cstdint>
#include <cstring>

#include "codec/host_device.h"
#include "codec/level_page.h"

namespace driftkv {

// Key group gi (D / 64 groups a 16-token m-tile, m-tile by m-tile) of lane
// l: 16 pairs in three words.
template <int D>
struct KeyGroupPos {
  static constexpr int kGroups = (kLevelPageTokens / 16) * (D / 64);  // a lane's
  // The pairs' common origin in lv.
  DRIFTKV_HOST_DEVICE static int Base(int l, int gi, int row_bytes) {
    constexpr unsigned kGroupsPerTile = D / 64;
    const int mt = static_cast<int>(static_cast<unsigned>(gi) / kGroupsPerTile);
    const int grp = static_cast<int>(static_cast<unsigned>(gi) % kGroupsPerTile);
    return (16 * mt + (l >> 2)) * row_bytes + 64 * grp + 2 * (l & 3);
  }
  // Pair e (0..15) from Base: k-step e / 4 of the group, register r = e % 4
  // (token + 8 (r & 1), channel + 8 (r >> 1)).
  DRIFTKV_HOST_DEVICE static int Pair(int e, int row_bytes) {
    const int r = e & 3;
    return 8 * (r & 1) * row_bytes + 16 * (e >> 2) + 8 * (r >> 1);
  }
  // Word k (0..2) of the group.
  DRIFTKV_HOST_DEVICE static int Word(int l, int gi, int k) {
    const unsigned w = static_cast<unsigned>(gi * 3 + k);
    return static_cast<int>(w / 4 * 32 + l) * 4 + static_cast<int>(w % 4);
  }
};

// Value k-step group GR (0, 1, 2) of lane l: kPairs pairs, three to a
// triple, two triples to a word, kWords words (zero words pad the group).
template <int D, int GR>
struct ValueGroupPos {
  static constexpr int kTiles = D / 16;
  static constexpr int kPairs = LevelValueGroupKsteps(GR) * kTiles * 4;
  static constexpr int kFirst = GR * 3 * kTiles * 4;  // the group's first pair in the lane's order
  static constexpr int kWords = LevelValueGroupWords(D, GR);
  static constexpr int kVec0 = GR * (LevelValueGroupWords(D, 0) / 4);
  static_assert(LevelValueGroupWords(D, 0) == LevelValueGroupWords(D, 1), "kVec0: groups 0 and 1 alike");

  DRIFTKV_HOST_DEVICE static int Base(int l, int row_bytes) { return 2 * (l & 3) * row_bytes + (l >> 2); }
  // Pair i (0..kPairs-1) from Base: pair P = kFirst + i of the lane's order
  // is k-step P / (4 kTiles), m-tile (P / 4) % kTiles, register r = P % 4
  // (token + 8 (r >> 1), channel + 8 (r & 1)).
  DRIFTKV_HOST_DEVICE static int Pair(int i, int row_bytes) {
    const int P = kFirst + i, ks = P / (4 * kTiles), mt = (P / 4) % kTiles, r = P & 3;
    return (16 * ks + 8 * (r >> 1)) * row_bytes + 16 * mt + 8 * (r & 1);
  }
  DRIFTKV_HOST_DEVICE static int Word(int l, int w) { return ((kVec0 + w / 4) * 32 + l) * 4 + w % 4; }
};

// A key pair's two levels as one 16-bit word (lower level in the low byte);
// the lower channel is even, so one aligned 16-bit access on the device.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t LoadKeyPair(const uint8_t* at) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(at);
#else
  uint16_t v;
  std::memcpy(&v, at, 2);  // little-endian, as the device
  return v;
#endif
}
// The pair's lower level in bits 0-7, its upper one in bits 16-23.
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE uint32_t SpreadKeyPair(uint32_t two) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(two, 0u, 0x4140u);
#else
  return (two & 0xffu) | ((two & 0xff00u) << 8);
#endif
}
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE void StoreKeyPair(uint8_t* at, uint32_t lo, uint32_t hi) {
  const uint16_t v = static_cast<uint16_t>(lo | (hi << 8));
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint16_t*>(at) = v;
#else
  std::memcpy(at, &v, 2);
#endif
}

// Packs key group gi of lane l from levels lv (< 8) into a head's key
// block `out`.
template <int D>
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE void PackKeyGroup(const uint8_t* lv, int row_bytes, int l, int gi, uint32_t* out) {
  using Pos = KeyGroupPos<D>;
  const uint8_t* base = lv + Pos::Base(l, gi, row_bytes);
  uint32_t w[3] = {0, 0, 0};
  DRIFTKV_UNROLL
  for (int e = 0; e < 16; ++e) {
    const uint32_t two = LoadKeyPair(base + Pos::Pair(e, row_bytes));
    if (e < 15) {
      w[e / 5] |= SpreadKeyPair(two) << (3 * (e % 5));  // lo at 3 (e % 5), hi 16 above
    } else {
      const uint32_t lo = two & 255u, hi = two >> 8;
      DRIFTKV_UNROLL
      for (int b = 0; b < 3; ++b) w[b] |= (((lo >> b) & 1u) << 15) | (((hi >> b) & 1u) << 31);
    }
  }
  DRIFTKV_UNROLL
  for (int k = 0; k < 3; ++k) out[Pos::Word(l, gi, k)] = w[k];
}

// The inverse: key group gi of lane l of the block `in` into lv.
template <int D>
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE void UnpackKeyGroup(const uint32_t* in, int l, int gi, uint8_t* lv, int row_bytes) {
  using Pos = KeyGroupPos<D>;
  uint8_t* base = lv + Pos::Base(l, gi, row_bytes);
  uint32_t w[3];
  DRIFTKV_UNROLL
  for (int k = 0; k < 3; ++k) w[k] = in[Pos::Word(l, gi, k)];
  DRIFTKV_UNROLL
  for (int e = 0; e < 16; ++e) {
    uint32_t lo, hi;
    if (e < 15) {
      lo = (w[e / 5] >> (3 * (e % 5))) & 7u;
      hi = (w[e / 5] >> (16 + 3 * (e % 5))) & 7u;
    } else {
      lo = ((w[0] >> 15) & 1u) | ((w[1] >> 14) & 2u) | ((w[2] >> 13) & 4u);
      hi = ((w[0] >> 31) & 1u) | ((w[1] >> 30) & 2u) | ((w[2] >> 29) & 4u);
    }
    StoreKeyPair(base + Pos::Pair(e, row_bytes), lo, hi);
  }
}

// Packs value group GR of lane l from levels lv (< 6) into a head's value
// block `out`: each triple's base-6 byte for the lower token (E) and the
// upper one (O).
template <int D, int GR>
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE void PackValueGroup(const uint8_t* lv, int row_bytes, int l, uint32_t* out) {
  using Pos = ValueGroupPos<D, GR>;
  const uint8_t* base = lv + Pos::Base(l, row_bytes);
  DRIFTKV_UNROLL
  for (int w = 0; w < Pos::kWords; ++w) {
    uint32_t word = 0;
    DRIFTKV_UNROLL
    for (int half = 0; half < 2; ++half) {
      uint32_t e = 0, od = 0;
      DRIFTKV_UNROLL
      for (int d = 0; d < 3; ++d) {
        const int i = 3 * (2 * w + half) + d;
        if (i < Pos::kPairs) {
          const uint8_t* at = base + Pos::Pair(i, row_bytes);
          const uint32_t pw = d == 0 ? 1u : (d == 1 ? 6u : 36u);
          e += at[0] * pw;
          od += at[row_bytes] * pw;
        }
      }
      word |= (e << (8 * half)) | (od << (16 + 8 * half));
    }
    out[Pos::Word(l, w)] = word;
  }
}

// The inverse: value group GR of lane l of the block `in` into lv. A
// corrupt byte (>= 216) unpacks to digits up to 7 (LevelBase6Digits), for
// the caller's range check to refuse.
template <int D, int GR>
DRIFTKV_HOST_DEVICE DRIFTKV_INLINE void UnpackValueGroup(const uint32_t* in, int l, uint8_t* lv, int row_bytes) {
  using Pos = ValueGroupPos<D, GR>;
  uint8_t* base = lv + Pos::Base(l, row_bytes);
  DRIFTKV_UNROLL
  for (int w = 0; w < Pos::kWords; ++w) {
    const uint32_t word = in[Pos::Word(l, w)];
    DRIFTKV_UNROLL
    for (int half = 0; half < 2; ++half) {
      uint32_t dg[3];  // lower token's digit in bits 0-7, upper token's in 16-23
      LevelBase6Digits((word >> (8 * half)) & 0x00ff00ffu, dg);
      DRIFTKV_UNROLL
      for (int d = 0; d < 3; ++d) {
        const int i = 3 * (2 * w + half) + d;
        if (i < Pos::kPairs) {
          uint8_t* at = base + Pos::Pair(i, row_bytes);
          at[0] = static_cast<uint8_t>(dg[d]);
          at[row_bytes] = static_cast<uint8_t>(dg[d] >> 16);
        }
      }
    }
  }
}

}  // namespace driftkv

#endif  // DRIFTKV_CODEC_LEVEL_FRAGMENTS_H_
