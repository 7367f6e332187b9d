// Per-token group quantization: the n values of one token's stream are split
// into n / group consecutive groups, each with its own asymmetric min-max
// grid of 2^bits levels (fp16 scale and zero point). Optionally the grid
// range is clipped to the [1 - kappa, kappa] quantiles of the group (OScaR);
// values outside the clipped range saturate to the end levels.
//
// Record layout (GroupRecordBytes bytes):
//   [0 : 4G)          G grids, 4 bytes each: scale fp16, zero fp16
//   [4G : 4G + P)     n codes of `bits` bits, packed LSB first (common.h)
// with G = n / group and P = ceil(n * bits / 8). INT2 with group 128 thus
// costs 2 + 32 / 128 = 2.25 bits per value.
#ifndef DRIFTKV_CODEC_BASELINES_GROUP_AFFINE_H_
#define DRIFTKV_CODEC_BASELINES_GROUP_AFFINE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace driftkv {
namespace baselines {

struct GroupSpec {
  int n = 0;
  int group = 128;     // divides n
  int bits = 2;        // 1..8
  double kappa = 1.0;  // 1: plain min-max; else clip quantile in (0.5, 1)
};

absl::Status ValidateGroupSpec(const GroupSpec& spec, const char* what);

size_t GroupRecordBytes(const GroupSpec& spec);

// x[0..n) -> record. `codes` is scratch of >= n bytes, `sorted` of >= group.
void EncodeGroups(const GroupSpec& spec, const float* x, uint8_t* record, uint8_t* codes, std::vector<float>* sorted);

// record -> x[0..n). DataLoss if a grid is corrupt (its group decodes to 0).
absl::Status DecodeGroups(const GroupSpec& spec, const uint8_t* record, float* x, uint8_t* codes);

// The q-quantile (0 <= q <= 1) of v[0..count), linear interpolation between
// order statistics. Reorders v.
float Quantile(float* v, int count, double q);

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_GROUP_AFFINE_H_
