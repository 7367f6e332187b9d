// The host's entry to the level decoders' self-test (kernels/level_decode.cu;
// the decoders themselves are device code in kernels/level_decode.cuh).
#ifndef DRIFTKV_KERNELS_LEVEL_DECODE_H_
#define DRIFTKV_KERNELS_LEVEL_DECODE_H_

#include "absl/status/statusor.h"

namespace driftkv {
namespace gpu {

// Runs the attention kernel's decoders on every base-6 byte pair and every
// key field position; returns how many levels came out wrong (tests: 0).
absl::StatusOr<int> LevelDecodeSelfTest();

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_DECODE_H_
