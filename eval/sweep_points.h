// The budgets `driftkv-codec sweep` visits for each codec.
//
//   dquant: its defaults (tag "default", about 2.26 bits per value), and
//     containers for mean targets b in {1.5, 1.75, 1.96, 2.5, 2.75, 3, 3.5, 4}
//     bits per value (tag "b1.96" for 1.96), split between keys and values in
//     the defaults' proportion (keys 1.19 b, values 0.81 b, mean record
//     included in the keys' share), with level counts that grow with the
//     budget the way the defaults relate to theirs (keys 2^(bits + 0.31),
//     values 2^(bits + 0.74), in [3, 16]);
//   fixed: for every dquant point, the largest level counts whose storage
//     does not exceed that point's, per tensor (tag "matched-<dquant tag>"),
//     plus a grid of (M_k, M_v) from (3, 2) to (16, 12);
//   int: INT2 with groups 512, 256, 128, 64, 32; INT3, INT4 with group 128;
//   kivi, oscar: INT2, INT3, INT4, group 128 (oscar also INT2 group 512);
//   turbo: 1 to 4 bits, group 128;
//   fp8, bf16: their one configuration.
// The INT2 / group 128 points of int, kivi, oscar and turbo's 2-bit point
// carry tag "default".
#ifndef DRIFTKV_EVAL_SWEEP_POINTS_H_
#define DRIFTKV_EVAL_SWEEP_POINTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "codec/registry.h"

namespace driftkv {

struct SweepPoint {
  CodecOptions options;
  std::string config;  // human-readable, no commas
  std::string tag;     // "default", "b1.96", "matched-default", ... or ""
};

// InvalidArgument for an unknown codec name.
absl::StatusOr<std::vector<SweepPoint>> SweepPoints(const std::vector<std::string>& codecs, int kv_heads, int head_dim);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_SWEEP_POINTS_H_
