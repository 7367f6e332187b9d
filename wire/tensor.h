// Tensors on the wire: little-endian bf16, fp16 or f32 elements in C order
// (proto/driftkv.proto). Conversions to and from float for the server and
// the client library. This build assumes a little-endian host (x86-64, arm64).
#ifndef DRIFTKV_WIRE_TENSOR_H_
#define DRIFTKV_WIRE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/driftkv.pb.h"

namespace driftkv {

// Bytes per element; 0 for DTYPE_UNSPECIFIED and unknown values.
size_t DTypeBytes(int dtype);
// "bf16", "fp16", "f32" or "dtype 7".
std::string DTypeName(int dtype);

// Checks dtype and length: InvalidArgument naming `field` ("items[2].query").
absl::Status CheckTensorBytes(absl::string_view field, int dtype, size_t bytes, size_t elements,
                              absl::string_view shape);

// Converts `elements` values; REQUIRES: CheckTensorBytes passed.
void TensorToFloat(absl::string_view bytes, int dtype, size_t elements, float* out);
// Appends `elements` values in `dtype` (round to nearest even) to `out`.
void FloatToTensor(const float* x, size_t elements, int dtype, std::string* out);

// Checks every value is finite and |x| <= limit; InvalidArgument naming the
// field, the element index and the value.
absl::Status CheckValues(absl::string_view field, const float* x, size_t elements, float limit);

// CheckValues of `elements` bf16 values (bit patterns), without converting
// them unless one fails: the same verdict and message as CheckValues of
// their floats.
absl::Status CheckBf16Values(absl::string_view field, const uint16_t* x, size_t elements, float limit);

// The index of the first non-finite value of `elements` values of `dtype`
// (bf16, fp16 or f32) at `data`, or -1: a check of tensors in their wire
// form, without converting them.
int64_t FirstNonFinite(const void* data, int dtype, size_t elements);

// The largest |x| of a query element the service accepts (2^96, ~7.9e28).
// The GPU kernels split the rotated (and transformed) query into fp16
// halves after scaling it by a power of two that they keep within
// [2^-100, 2^100] (kernels/query_scale.h); a rotated element of 2^110 or
// more would overflow that split. A query element of at most 2^96 stays
// below 2^110 after the Hadamard rotation (a gain of at most sqrt(d) = 16
// for d <= 256) and any query transform of gain below 2^10; every backend
// refuses the same queries, so CPU and GPU answer alike.
constexpr float kQueryLimit = 0x1p96f;

// FirstNonFinite, also catching finite values of |x| > limit (>= 0): the
// index of the first value that is not finite or exceeds `limit`, or -1.
// FirstNonFinite is this with float's largest value as the limit.
int64_t FirstOutOfRange(const void* data, int dtype, size_t elements, float limit);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_TENSOR_H_
