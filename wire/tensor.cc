#include "wire/tensor.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/half.h"

namespace driftkv {

size_t DTypeBytes(int dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16:
    case v1::DTYPE_FP16:
      return 2;
    case v1::DTYPE_F32:
      return 4;
    default:
      return 0;
  }
}

std::string DTypeName(int dtype) {
  switch (dtype) {
    case v1::DTYPE_BF16: return "bf16";
    case v1::DTYPE_FP16: return "fp16";
    case v1::DTYPE_F32: return "f32";
    case v1::DTYPE_UNSPECIFIED: return "DTYPE_UNSPECIFIED";
    default: return absl::StrCat("dtype ", dtype);
  }
}

absl::Status CheckTensorBytes(absl::string_view field, int dtype, size_t bytes, size_t elements,
                              absl::string_view shape) {
  const size_t width = DTypeBytes(dtype);
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", dtype == v1::DTYPE_UNSPECIFIED ? "DTYPE_UNSPECIFIED" : absl::StrCat("dtype ", dtype),
        " is not one of BF16, FP16, F32"));
  }
  if (bytes != elements * width) {
    return absl::InvalidArgumentError(absl::StrCat(field, " has ", bytes, " bytes; ", shape,
                                                   " in ", DTypeName(dtype), " needs ",
                                                   elements * width));
  }
  return absl::OkStatus();
}

void TensorToFloat(absl::string_view bytes, int dtype, size_t elements, float* out) {
  const char* p = bytes.data();
  if (dtype == v1::DTYPE_F32) {
    std::memcpy(out, p, elements * 4);
    return;
  }
  for (size_t i = 0; i < elements; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    out[i] = dtype == v1::DTYPE_BF16 ? Bf16ToFloat(h) : HalfToFloat(h);
  }
}

void FloatToTensor(const float* x, size_t elements, int dtype, std::string* out) {
  const size_t start = out->size();
  out->resize(start + elements * DTypeBytes(dtype));
  char* p = out->data() + start;
  if (dtype == v1::DTYPE_F32) {
    std::memcpy(p, x, elements * 4);
    return;
  }
  for (size_t i = 0; i < elements; ++i) {
    const uint16_t h = dtype == v1::DTYPE_BF16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

absl::Status CheckValues(absl::string_view field, const float* x, size_t elements, float limit) {
  for (size_t i = 0; i < elements; ++i) {
    if (!std::isfinite(x[i]) || std::fabs(x[i]) > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " element ", i, " is ", x[i],
          std::isfinite(x[i]) ? absl::StrCat("; |x| must be <= ", limit) : "; must be finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace driftkv
