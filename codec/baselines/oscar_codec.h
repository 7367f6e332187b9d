// `oscar`: OScaR-style percentile-clipped affine quantization after the
// per-head Hadamard rotation. Each group of `group` values of a token (the
// paper's baselines use 128) takes its grid from the clipped range
// [Q(1 - kappa), Q(kappa)] of its own values (Q: empirical quantile, linear
// interpolation); values outside saturate to the end levels. kappa_K = 0.96
// and kappa_V = 0.92 by default (the values WUSH-KV reuses from OScaR).
// Record: the group_affine.h layout; INT2 / group 128 is 2.25 bits per value.
//
// Not reproduced: OScaR's own transform and its 256-token bf16 residual
// window (the window is the evaluation's --residual, common to all codecs).
#ifndef DRIFTKV_CODEC_BASELINES_OSCAR_CODEC_H_
#define DRIFTKV_CODEC_BASELINES_OSCAR_CODEC_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/kv_codec.h"

namespace driftkv {
namespace baselines {

absl::StatusOr<std::unique_ptr<KvCodec>> MakeOscarCodec(int kv_heads, int head_dim, int bits, int group, double kappa_k,
                                                        double kappa_v);

}  // namespace baselines
}  // namespace driftkv

#endif  // DRIFTKV_CODEC_BASELINES_OSCAR_CODEC_H_
