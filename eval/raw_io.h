// Raw tensor files: little-endian, row-major, no header; dtype f32, f16 or
// bf16. Sizes are checked against the expected element count so that a
// wrong --shape or --dtype is caught before any coding starts.
#ifndef DRIFTKV_EVAL_RAW_IO_H_
#define DRIFTKV_EVAL_RAW_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace driftkv {

enum class Dtype { kF32, kF16, kBf16 };

absl::StatusOr<Dtype> ParseDtype(const std::string& name);
int DtypeBytes(Dtype d);

// Reads exactly `elements` values; InvalidArgument if the file size differs
// (the message gives both sizes), NotFound if it cannot be opened.
absl::StatusOr<std::vector<float>> ReadRawTensor(const std::string& path, Dtype dtype, int64_t elements);

absl::Status WriteRawTensor(const std::string& path, Dtype dtype, const float* data, int64_t elements);

// Parses "T,H,D" or "L,T,H,D" (positive integers) into dims.
absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_RAW_IO_H_
