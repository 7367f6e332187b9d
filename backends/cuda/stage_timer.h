// Device time of an Attend launch by stage (backends/attend_phases.h,
// DeviceStage), from CUDA events recorded on the backend's stream between
// its device calls. Off unless the process runs with DRIFTKV_DEVICE_TIMING=1:
// each event costs the host a call and the device a record, which a decode
// loop's microseconds would notice.
#ifndef DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_
#define DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_

#include <array>

#include <cuda_runtime.h>

namespace driftkv {
namespace cuda_backend {

class StageTimer {
 public:
  // The points a launch passes, in stream order.
  enum Point { kStart = 0, kInputsDone, kAttentionDone, kOutputsDone, kPoints };

  StageTimer();
  ~StageTimer();
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

  bool enabled() const { return enabled_; }
  // Records `point` on `stream` (nothing when disabled). REQUIRES: the
  // stream's device current.
  void Mark(Point point, cudaStream_t stream);
  // After the stream synchronised: adds the stages between the points
  // marked since the last Collect to this thread's AttendPhaseClock.
  void Collect();

 private:
  bool enabled_ = false;
  bool created_ = false;  // events_ made (on the first Mark)
  std::array<cudaEvent_t, kPoints> events_{};
  std::array<bool, kPoints> marked_{};
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_STAGE_TIMER_H_
