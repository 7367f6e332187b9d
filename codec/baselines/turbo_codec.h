// `turbo`: TurboQuant-MSE-like coding. Every head is multiplied by one
// random orthogonal matrix R (head_dim x head_dim, drawn from `seed`: a
// Gaussian matrix orthonormalised by Gram-Schmidt, so the same seed gives
// the same R everywhere), which makes the coordinates of a rotated unit
// vector close to N(0, 1 / head_dim).
// Keys: per head, the norm r = |R k| is stored in fp16 and every coordinate
// of sqrt(head_dim) * R k / r is rounded to the nearest of the 2^bits
// Lloyd-Max levels of a standard normal (computed by Lloyd's iteration).
// Values: the rotated values are coded by per-token affine groups
// (group_affine.h) of `group` values.
//
// Key record:   [0 : 2H) H head norms fp16, then n codes of `bits` bits
//               packed LSB first (common.h).
// Value record: the group_affine.h layout, in the rotated domain.
// At 2 bits, head_dim 128, group 128: keys 2.125, values 2.25, mean 2.19
// bits per value (the paper's figure for TurboQuant).
//
// Not reproduced: TurboQuant's QJL residual stage (its "prod" variant); the
// paper evaluates the MSE-only configuration, which this is.
#ifndef DRIFTKV_CODEC_BASELINES_TURBO_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_TURBO_CODEC_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/baselines/group_affine.h"
#include "codec/baselines/tokenwise_codec.h"

namespace driftkv {
namespace baselines {

// The `levels` Lloyd-Max reconstruction levels of N(0, 1), ascending.
std::vector<double> GaussianLloydMax(int levels);

// A head_dim x head_dim orthogonal matrix, row-major, from `seed`.
std::vector<float> RandomOrthogonal(int dim, uint64_t seed);

class TurboCodec : public TokenwiseCodec {
 public:
  // bits in [1, 4] (keys and values); group divides kv_heads * head_dim.
  static absl::StatusOr<std::unique_ptr<KvCodec>> Create(int kv_heads, int head_dim, int bits, int group,
                                                         uint64_t seed);

  size_t key_stride() const override;
  size_t value_stride() const override { return GroupRecordBytes(values_); }

 protected:
  void EncodeStream(bool key, const float* x, uint8_t* record, CodecScratch* scratch) const override;
  absl::Status DecodeStream(bool key, const uint8_t* record, float* x, CodecScratch* scratch) const override;

 private:
  TurboCodec(int kv_heads, int head_dim, int bits, const GroupSpec& values, uint64_t seed);
  // y = R x (forward) or y = R^T x, per head, for a whole stream.
  void Rotate(const float* x, float* y, bool forward) const;

  int bits_;
  GroupSpec values_;
  std::vector<float> rotation_;   // R, head_dim x head_dim row-major
  std::vector<float> centroids_;  // 2^bits Lloyd-Max levels, ascending
  std::vector<float> bounds_;     // 2^bits - 1 midpoints between centroids
};

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_TURBO_CODEC_H_
