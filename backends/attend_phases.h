// Where the wall time of one Attend goes, phase by phase, measured on the
// thread that runs it. The handler starts the clock when a call begins and
// marks the end of each of its phases; a backend that runs the call on the
// same thread marks its own (host work until its launches are queued, then
// waiting for the device). A mark charges the time since the previous mark
// to its phase, so the phases add up to the call. The handler publishes the
// totals (driftkv_attend_phase_seconds, docs/metrics.md).
//
// A backend that runs calls on other threads (backends/attend_batcher.h)
// marks nothing the handler reads: its whole time is then charged to
// kBackendHost by the handler's mark after Backend::Attend returns.
#ifndef DRIFTKV_BACKENDS_ATTEND_PHASES_H_
#define DRIFTKV_BACKENDS_ATTEND_PHASES_H_

#include <array>
#include <cstdint>

#include "wire/monotonic.h"

namespace driftkv {

enum class AttendPhase : int {
  kRequest = 0,  // the request parsed by its channel (doorbell, unary gRPC)
  kValidate,     // items checked, tensors inline decoded, references resolved
  kClientRead,   // tensors in client memory read and checked by the device
  kLookup,       // sequences found (one table lookup per distinct sequence)
  kHotTier,      // the items' layers brought to (or queued for) the hot tier
  kState,        // locks taken, decode steps planned and applied, jobs built
  kBackendPlan,  // the backend's host work before its first device call
  kBackendHost,  // the backend's device calls: copies and launches queued
  kDeviceWait,   // the backend waiting for the device
  kFinish,       // outputs converted or copied, counters
  kCount
};

// Device time of one Attend by stage, from events the backend records on
// its stream around its device calls when asked to (the CUDA backend with
// DRIFTKV_DEVICE_TIMING=1; docs/metrics.md). Stages are device time, not
// wall time: they do not add up to the call, and the gaps between them
// (the device idle, waiting for the host to queue the next call) are the
// difference between their sum and the device's span.
enum class DeviceStage : int {
  kInputs = 0,  // uploads of the launch's tables and windows, queries gathered
  kAttention,   // the attention kernels (and their merge)
  kOutputs,     // outputs downloaded to the host (client memory: written by the merge)
  kSpan,        // from the first device call's start to the last one's end
  kUpload,      // of kInputs: the upload of the launch's tables alone
  kMerge,       // of kAttention: the merge of the splits and the bf16 window
  kCount
};

inline const char* DeviceStageName(DeviceStage s) {
  static const char* const kNames[] = {"inputs", "attention", "outputs", "span", "upload", "merge"};
  return kNames[static_cast<int>(s)];
}

inline const char* AttendPhaseName(AttendPhase p) {
  static const char* const kNames[] = {"request", "validate",     "client_read",  "lookup",      "hot_tier",
                                       "state",   "backend_plan", "backend_host", "device_wait", "finish"};
  return kNames[static_cast<int>(p)];
}

class AttendPhaseClock {
 public:
  using Totals = std::array<int64_t, static_cast<int>(AttendPhase::kCount)>;        // nanoseconds
  using DeviceTotals = std::array<int64_t, static_cast<int>(DeviceStage::kCount)>;  // nanoseconds

  // Begins a call on this thread: every total back to zero. A channel
  // that parses the request itself begins the call there (Begin) and the
  // handler's Start then keeps what the channel charged.
  static void Begin() {
    State& s = state();
    s.totals.fill(0);
    s.device.fill(0);
    s.device_timed = false;
    s.last = MonotonicNs();
    s.begun = true;
  }
  // A call the channel began but will not pass to the handler.
  static void Abandon() { state().begun = false; }
  static void Start() {
    State& s = state();
    if (s.begun) {
      s.begun = false;
      return;
    }
    s.totals.fill(0);
    s.device.fill(0);
    s.device_timed = false;
    s.last = MonotonicNs();
  }
  // Charges the time since the last mark (or Start) to `phase`.
  static void Mark(AttendPhase phase) {
    State& s = state();
    const int64_t now = MonotonicNs();
    s.totals[static_cast<int>(phase)] += now - s.last;
    s.last = now;
  }
  static const Totals& totals() { return state().totals; }
  // Adds device time measured by the backend to `stage`.
  static void AddDevice(DeviceStage stage, int64_t ns) {
    State& s = state();
    s.device[static_cast<int>(stage)] += ns;
    s.device_timed = true;
  }
  // Whether this call's backend measured its device stages (AddDevice).
  static bool device_timed() { return state().device_timed; }
  static const DeviceTotals& device_totals() { return state().device; }

 private:
  struct State {
    Totals totals{};
    DeviceTotals device{};
    int64_t last = 0;
    bool begun = false;
    bool device_timed = false;
  };
  static State& state() {
    thread_local State s;
    return s;
  }
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_ATTEND_PHASES_H_
