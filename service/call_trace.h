// Per-call timestamps of the polling door, for finding where an inline
// Attend's time goes outside the Handler: when the request had arrived
// (its completion came out of the queue), when the serving function
// returned, and when the answer's send completed; and how much of the
// serving the call's phases account for (backends/attend_phases.h: the
// request's parse and the Handler's phases, summed). The times are
// MonotonicNs (wire/monotonic.h): a client that records its own start and
// end on that clock (or steady_clock, the same on Linux) splits a round
// trip into the way in, the serving, and the way out
// (bench/device/trace_join.py).
//
// Off unless the process runs with DRIFTKV_ATTEND_TRACE=PATH; then the
// first kMaxCalls calls whose answers went out are kept in memory and
// written to PATH as CSV (arrived_ns,served_ns,finished_ns,phases_ns) when
// the trace is destroyed, in the order their sends completed (which poller
// threads may see out of arrival order).
#ifndef DRIFTKV_SERVICE_CALL_TRACE_H_
#define DRIFTKV_SERVICE_CALL_TRACE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace driftkv {

class CallTrace {
 public:
  static constexpr size_t kMaxCalls = 1 << 20;

  struct Call {
    int64_t arrived_ns = 0;
    int64_t served_ns = 0;
    int64_t finished_ns = 0;
    int64_t phases_ns = 0;  // a duration, not a time
  };

  // nullptr unless DRIFTKV_ATTEND_TRACE names a file.
  static std::unique_ptr<CallTrace> FromEnv();
  explicit CallTrace(std::string path);
  ~CallTrace();  // writes the file
  CallTrace(const CallTrace&) = delete;
  CallTrace& operator=(const CallTrace&) = delete;

  void Record(const Call& call);

 private:
  const std::string path_;
  std::mutex mu_;
  std::vector<Call> calls_;  // guarded by mu_
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CALL_TRACE_H_
