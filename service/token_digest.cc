#include "service/token_digest.h"

#include <cstring>

namespace driftkv {
namespace {

constexpr uint64_t kMul1 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio
constexpr uint64_t kMul2 = 0xC2B2AE3D27D4EB4Full;  // xxHash64's prime 2

inline uint64_t Rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

// Folds n uint16 values, four per 64-bit word (little-endian), into h:
// four independent lanes over consecutive words (the multiplications
// overlap), merged at the end.
uint64_t Fold(uint64_t h, const uint16_t* v, size_t n) {
  uint64_t lane[4] = {h, h ^ kMul2, Rotl(h, 17), Rotl(h, 41) ^ kMul1};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      uint64_t w;
      std::memcpy(&w, v + i + 4 * j, 8);
      lane[j] = Rotl(lane[j] ^ (w * kMul2), 31) * kMul1;
    }
  }
  for (; i + 4 <= n; i += 4) {
    uint64_t w;
    std::memcpy(&w, v + i, 8);
    lane[0] = Rotl(lane[0] ^ (w * kMul2), 31) * kMul1;
  }
  uint64_t tail = 0;
  for (int s = 0; i < n; ++i, s += 16) tail |= static_cast<uint64_t>(v[i]) << s;
  h = Rotl(lane[0] ^ (tail * kMul2), 31) * kMul1;
  for (int j = 1; j < 4; ++j) h = Rotl(h ^ lane[j], 27) * kMul1 + kMul2;
  return h;
}

// MurmurHash3's 64-bit finaliser: every input bit affects every output bit.
uint64_t Mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t TokenDigest(const uint16_t* keys, const uint16_t* values, size_t n) {
  uint64_t h = kMul1 ^ n;
  h = Fold(h, keys, n);
  h = Fold(h, values, n);
  return Mix(h);
}

}  // namespace driftkv
