#include "eval/raw_io.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "wire/half.h"

namespace driftkv {
namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

}  // namespace

absl::StatusOr<Dtype> ParseDtype(const std::string& name) {
  if (name == "f32" || name == "float32") return Dtype::kF32;
  if (name == "f16" || name == "float16" || name == "fp16") return Dtype::kF16;
  if (name == "bf16" || name == "bfloat16") return Dtype::kBf16;
  return absl::InvalidArgumentError(absl::StrCat("dtype \"", name, "\" unknown; use f32, f16 or bf16"));
}

int DtypeBytes(Dtype d) {
  return d == Dtype::kF32 ? 4 : 2;
}

absl::StatusOr<std::vector<float>> ReadRawTensor(const std::string& path, Dtype dtype, int64_t elements) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  std::fseek(f.get(), 0, SEEK_END);
  const int64_t size = std::ftell(f.get());
  std::fseek(f.get(), 0, SEEK_SET);
  const int64_t want = elements * DtypeBytes(dtype);
  if (size != want) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", size, " bytes but the shape and dtype need ", want,
                                                   " (", elements, " values of ", DtypeBytes(dtype), " bytes)"));
  }
  std::vector<uint8_t> bytes(want);
  if (want > 0 && std::fread(bytes.data(), 1, want, f.get()) != static_cast<size_t>(want)) {
    return absl::DataLossError(absl::StrCat("short read from ", path));
  }
  std::vector<float> out(elements);
  for (int64_t i = 0; i < elements; ++i) {
    if (dtype == Dtype::kF32) {
      uint32_t u;
      std::memcpy(&u, &bytes[4 * i], 4);
      out[i] = BitsToFloat(u);
    } else {
      const uint16_t h = static_cast<uint16_t>(bytes[2 * i] | (bytes[2 * i + 1] << 8));
      out[i] = dtype == Dtype::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  return out;
}

absl::Status WriteRawTensor(const std::string& path, Dtype dtype, const float* data, int64_t elements) {
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) return absl::NotFoundError(absl::StrCat("cannot create ", path, ": ", std::strerror(errno)));
  std::vector<uint8_t> bytes(elements * DtypeBytes(dtype));
  for (int64_t i = 0; i < elements; ++i) {
    if (dtype == Dtype::kF32) {
      std::memcpy(&bytes[4 * i], &data[i], 4);
    } else {
      const uint16_t h = dtype == Dtype::kF16 ? FloatToHalf(data[i]) : FloatToBf16(data[i]);
      bytes[2 * i] = static_cast<uint8_t>(h);
      bytes[2 * i + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
    return absl::DataLossError(absl::StrCat("short write to ", path));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseShape(const std::string& text) {
  std::vector<int64_t> dims;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape \"", text, "\": \"", part, "\" is not a positive integer"));
    }
    dims.push_back(v);
  }
  if (dims.size() != 3 && dims.size() != 4) {
    return absl::InvalidArgumentError(absl::StrCat("shape \"", text, "\" must be T,H,D or L,T,H,D"));
  }
  return dims;
}

}  // namespace driftkv
