#include "backends/cuda/stage_timer.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backends/attend_phases.h"

namespace driftkv {
namespace cuda_backend {

StageTimer::StageTimer() {
  const char* v = std::getenv("DRIFTKV_DEVICE_TIMING");
  enabled_ = v != nullptr && std::strcmp(v, "1") == 0;
}

StageTimer::~StageTimer() {
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

void StageTimer::Mark(Point point, cudaStream_t stream) {
  if (!enabled_) return;
  if (!created_) {
    // On the stream's device, which the caller made current.
    for (cudaEvent_t& e : events_) {
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        enabled_ = false;  // the destructor frees what was made
        return;
      }
    }
    created_ = true;
  }
  marked_[point] = cudaEventRecord(events_[point], stream) == cudaSuccess;
}

void StageTimer::Collect() {
  if (!enabled_) return;
  auto between = [this](Point a, Point b, DeviceStage stage) {
    float ms = 0.0f;
    if (marked_[a] && marked_[b] && cudaEventElapsedTime(&ms, events_[a], events_[b]) == cudaSuccess) {
      AttendPhaseClock::AddDevice(stage, static_cast<int64_t>(static_cast<double>(ms) * 1e6));
    }
  };
  between(kStart, kInputsDone, DeviceStage::kInputs);
  between(kInputsDone, kAttentionDone, DeviceStage::kAttention);
  between(kAttentionDone, kOutputsDone, DeviceStage::kOutputs);
  between(kStart, kOutputsDone, DeviceStage::kSpan);
  cudaGetLastError();  // an unmarked pair's error is not the launch's
  marked_.fill(false);
}

}  // namespace cuda_backend
}  // namespace driftkv
