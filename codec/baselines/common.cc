#include "codec/baselines/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/half.h"

namespace driftkv {
namespace baselines {

absl::Status CheckInput(const float* x, int count, int n, bool fp16_range, const char* what) {
  const int64_t total = static_cast<int64_t>(count) * n;
  for (int64_t i = 0; i < total; ++i) {
    const bool finite = std::isfinite(x[i]);
    if (!finite || (fp16_range && std::fabs(x[i]) > kHalfMax)) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " of token ", i / n, " channel ", i % n, " is ", x[i],
          finite ? ", outside the fp16 range of the metadata (|x| <= 65504)" : "; only finite values can be coded"));
    }
  }
  return absl::OkStatus();
}

void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

void StoreF32(uint8_t* p, float v) {
  const uint32_t u = FloatBits(v);
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(u >> (8 * i));
}

float LoadF32(const uint8_t* p) {
  return BitsToFloat(p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24));
}

void PackBits(const uint8_t* codes, int count, int bits, uint8_t* out) {
  std::memset(out, 0, PackedBytes(count, bits));
  size_t bit = 0;
  for (int i = 0; i < count; ++i, bit += bits) {
    // A code of <= 8 bits spans at most two bytes.
    const uint32_t v = static_cast<uint32_t>(codes[i]) << (bit & 7);
    out[bit >> 3] |= static_cast<uint8_t>(v);
    if ((bit & 7) + bits > 8) out[(bit >> 3) + 1] |= static_cast<uint8_t>(v >> 8);
  }
}

void UnpackBits(const uint8_t* in, int count, int bits, uint8_t* codes) {
  const uint32_t mask = (1u << bits) - 1;
  size_t bit = 0;
  for (int i = 0; i < count; ++i, bit += bits) {
    uint32_t v = in[bit >> 3];
    if ((bit & 7) + bits > 8) v |= static_cast<uint32_t>(in[(bit >> 3) + 1]) << 8;
    codes[i] = static_cast<uint8_t>((v >> (bit & 7)) & mask);
  }
}

HalfGrid HalfGrid::FromRange(float lo, float hi, int levels) {
  HalfGrid g;
  g.levels = levels;
  g.zero = RoundToHalf(lo);
  const double s = (static_cast<double>(hi) - lo) / (levels - 1);
  g.scale = s > 0.0 ? RoundToHalf(static_cast<float>(std::min<double>(s, kHalfMax))) : 0.0f;
  return g;
}

uint8_t HalfGrid::Quantize(float x) const {
  if (!(scale > 0.0f)) return 0;
  const float m = std::nearbyint((x - zero) / scale);
  return static_cast<uint8_t>(std::clamp(m, 0.0f, static_cast<float>(levels - 1)));
}

void HalfGrid::Store(uint8_t* p) const {
  StoreU16(p, FloatToHalf(scale));
  StoreU16(p + 2, FloatToHalf(zero));
}

absl::Status HalfGrid::Load(const uint8_t* p, int levels, HalfGrid* grid) {
  grid->levels = levels;
  grid->scale = HalfToFloat(LoadU16(p));
  grid->zero = HalfToFloat(LoadU16(p + 2));
  if (!std::isfinite(grid->scale) || !std::isfinite(grid->zero) || grid->scale < 0.0f) {
    grid->scale = 0.0f;
    grid->zero = 0.0f;
    return absl::DataLossError("record grid (fp16 scale/zero) is not finite or negative");
  }
  return absl::OkStatus();
}

}  // namespace baselines
}  // namespace driftkv
