// Helpers shared by the handler's files (handler*.cc); not part of the
// service's interface.
#ifndef DRIFTKV_SERVICE_HANDLER_INTERNAL_H_
#define DRIFTKV_SERVICE_HANDLER_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "service/quoted.h"
#include "wire/half.h"

namespace driftkv {
namespace handler_internal {

// Largest first_token accepted: keeps first_token + token_count far from
// overflow.
constexpr uint64_t kMaxTokenIndex = uint64_t{1} << 48;

using ::driftkv::Quoted;

// Rounds float tokens to bf16 bits.
inline void ToBf16(const float* x, size_t count, uint16_t* out) {
  FloatsToBf16(x, count, out);
}

}  // namespace handler_internal
}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HANDLER_INTERNAL_H_
