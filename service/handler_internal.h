// Helpers shared by the handler's files (handler*.cc); not part of the
// service's interface.
#ifndef DRIFTKV_SERVICE_HANDLER_INTERNAL_H_
#define DRIFTKV_SERVICE_HANDLER_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "service/quoted.h"
#include "service/sequence.h"

namespace driftkv {
namespace handler_internal {

// Largest first_token accepted: keeps first_token + token_count far from
// overflow.
constexpr uint64_t kMaxTokenIndex = uint64_t{1} << 48;

using ::driftkv::Quoted;

// The offset of the first NUL or control byte (below 0x20, or 0x7f) of a
// sequence id, or -1. Such bytes are refused: a NUL would let an id take
// the form of a tenant's table key (service/tenant.h), and control bytes
// have no place in an identifier that is logged.
inline int64_t ControlByteOffset(absl::string_view id) {
  for (size_t i = 0; i < id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(id[i]);
    if (c < 0x20 || c == 0x7f) return static_cast<int64_t>(i);
  }
  return -1;
}

// Points `j` at the layer's pages and bf16 window, the window named for
// backends that keep windows on the device (AttendJob::window_id). The
// layer's lock stays held while `j` is used.
inline void SetLayerTokens(const LayerState& layer, int n, int page_tokens, AttendJob* j) {
  j->pages = absl::MakeConstSpan(layer.pages);
  j->window = Bf16Tokens{layer.window_keys.data(), layer.window_values.data(),
                         static_cast<int64_t>(layer.window_keys.size() / n)};
  j->window_id = layer.id;
  j->window_first = static_cast<int64_t>(layer.pages.size()) * page_tokens;
}

}  // namespace handler_internal
}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_HANDLER_INTERNAL_H_
