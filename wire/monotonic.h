// The host's monotonic clock in nanoseconds: CLOCK_MONOTONIC, which every
// process of one host shares (std::chrono::steady_clock reads the same
// clock on Linux). Doorbell deadlines cross processes in it
// (wire/doorbell.h), and the call trace's times are compared with a
// client's in it (service/call_trace.h).
#ifndef DRIFTKV_WIRE_MONOTONIC_H_
#define DRIFTKV_WIRE_MONOTONIC_H_

#include <time.h>

#include <cstdint>

namespace driftkv {

inline int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_MONOTONIC_H_
