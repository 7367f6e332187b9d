#include "codec/baselines/group_affine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "codec/baselines/common.h"

namespace driftkv {
namespace baselines {

absl::Status ValidateGroupSpec(const GroupSpec& s, const char* what) {
  if (s.bits < 1 || s.bits > 8) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bits ", s.bits, " out of range [1, 8]"));
  }
  if (s.group < 1 || s.n % s.group != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": group ", s.group, " must be >= 1 and divide the stream length ", s.n));
  }
  if (!(s.kappa == 1.0 || (s.kappa > 0.5 && s.kappa < 1.0))) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": kappa ", s.kappa, " out of range (0.5, 1) (or 1: no clipping)"));
  }
  return absl::OkStatus();
}

size_t GroupRecordBytes(const GroupSpec& s) {
  return static_cast<size_t>(s.n / s.group) * 4 + PackedBytes(s.n, s.bits);
}

float Quantile(float* v, int count, double q) {
  const double pos = q * (count - 1);
  const int i = static_cast<int>(std::floor(pos));
  const double frac = pos - i;
  std::nth_element(v, v + i, v + count);
  const float a = v[i];
  if (frac == 0.0 || i + 1 >= count) return a;
  const float b = *std::min_element(v + i + 1, v + count);
  return static_cast<float>(a + frac * (b - a));
}

void EncodeGroups(const GroupSpec& s, const float* x, uint8_t* record, uint8_t* codes, std::vector<float>* sorted) {
  const int levels = 1 << s.bits;
  sorted->resize(s.group);
  for (int g = 0; g * s.group < s.n; ++g) {
    const float* xg = x + g * s.group;
    float lo, hi;
    if (s.kappa < 1.0) {
      std::copy(xg, xg + s.group, sorted->begin());
      lo = Quantile(sorted->data(), s.group, 1.0 - s.kappa);
      hi = Quantile(sorted->data(), s.group, s.kappa);
    } else {
      const auto mm = std::minmax_element(xg, xg + s.group);
      lo = *mm.first;
      hi = *mm.second;
    }
    const HalfGrid grid = HalfGrid::FromRange(lo, hi, levels);
    grid.Store(record + 4 * g);
    for (int i = 0; i < s.group; ++i) codes[g * s.group + i] = grid.Quantize(xg[i]);
  }
  PackBits(codes, s.n, s.bits, record + 4 * (s.n / s.group));
}

absl::Status DecodeGroups(const GroupSpec& s, const uint8_t* record, float* x, uint8_t* codes) {
  const int levels = 1 << s.bits;
  absl::Status status;
  UnpackBits(record + 4 * (s.n / s.group), s.n, s.bits, codes);
  for (int g = 0; g * s.group < s.n; ++g) {
    HalfGrid grid;
    status.Update(HalfGrid::Load(record + 4 * g, levels, &grid));
    for (int i = 0; i < s.group; ++i) x[g * s.group + i] = grid.Dequantize(codes[g * s.group + i]);
  }
  return status;
}

}  // namespace baselines
}  // namespace driftkv
