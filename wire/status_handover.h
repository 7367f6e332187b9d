// A Status handed to another thread, which then owns it alone.
//
// A copied absl::Status shares its message with the original through a
// reference count, and Debian's Abseil (linked into the ThreadSanitizer
// tests too) counts in code TSan does not see: a copy released on one
// thread after another thread read it, or by two receivers of one error,
// reads to TSan as a free racing the read. A Status made afresh from the
// code and message shares nothing.
#ifndef DRIFTKV_WIRE_STATUS_HANDOVER_H_
#define DRIFTKV_WIRE_STATUS_HANDOVER_H_

#include "absl/status/status.h"

namespace driftkv {

inline absl::Status UnsharedStatus(const absl::Status& st) {
  return st.ok() ? absl::OkStatus() : absl::Status(st.code(), st.message());
}

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_STATUS_HANDOVER_H_
