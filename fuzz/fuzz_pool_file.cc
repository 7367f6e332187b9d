// libFuzzer: the pool file reader (codec/pool_file.h) and its codec-options
// line: any bytes give a Pool or an error, never a crash; a pool that
// parses serialises back to bytes that parse again.
#include <string>

#include "codec/pool_file.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)ParseCodecOptions(bytes);
  absl::StatusOr<Pool> pool = ParsePool(bytes);
  if (!pool.ok()) return 0;
  absl::StatusOr<std::string> again = SerializePool(*pool);
  if (again.ok() && !ParsePool(*again).ok()) __builtin_trap();
  return 0;
}
