// libFuzzer: the transforms-file reader (codec/transform/transforms_file.h):
// any bytes give a TransformSet or an error; a set that parses serialises
// to bytes that parse to the same checksum.
#include <string>

#include "codec/transform/transforms_file.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<TransformSet> set = ParseTransforms(std::string(reinterpret_cast<const char*>(data), size));
  if (!set.ok()) return 0;
  absl::StatusOr<TransformSet> again = ParseTransforms(SerializeTransforms(*set));
  if (!again.ok() || TransformsChecksum(*again) != TransformsChecksum(*set)) __builtin_trap();
  return 0;
}
