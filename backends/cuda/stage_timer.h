// Device time of an Attend launch by stage (backends/attend_phases.h,
// DeviceStage), from CUDA events recorded on the backend's stream between
// its device calls. Off unless the process runs with DRIFTKV_DEVICE_TIMING=1:
// each event costs the host a call and the device a record, which a decode
// loop's microseconds would notice. DRIFTKV_DEVICE_TIMING=isolated also
// waits for the inputs before the attention is launched, so that the
// attention stage starts on an idle device, as the kernel alone is timed
// (bench/service_hot_bench): a probe of why the two differ, never a
// setting to serve with.
#ifndef DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_
#define DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_

#include <array>

#include <cuda_runtime.h>

namespace driftkv {
namespace cuda_backend {

class StageTimer {
 public:
  // The points a launch passes, in stream order.
  // kAttentionStart is kInputsDone, or in isolated mode the point after
  // the wait for the inputs.
  enum Point { kStart = 0, kUploaded, kInputsDone, kAttentionStart, kSplitDone, kAttentionDone, kOutputsDone, kPoints };

  StageTimer();
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  bool enabled() const { return enabled_; }
  // Records `point` on `stream` (nothing when disabled). REQUIRES: the
  // stream's device current.
  void Mark(Point point, cudaStream_t stream);
  // The event of `point` for a launcher to record itself (null when
  // disabled). REQUIRES: the stream's device current.
  cudaEvent_t Event(Point point);
  // After the stream synchronised: adds the stages between the points
  // marked since the last Collect to this thread's AttendPhaseClock.
  void Collect();

 private:
  // Makes the events on first use; false when disabled.
  bool Create();

  bool enabled_ = false;
  bool isolated_ = false;
  bool created_ = false;  // events_ made (on the first Mark)
  std::array<cudaEvent_t, kPoints> events_{};
  std::array<bool, kPoints> marked_{};
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_
