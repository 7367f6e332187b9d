#include "backends/cuda/stage_timer.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backends/attend_phases.h"

namespace driftkv {
namespace cuda_backend {

StageTimer::StageTimer() {
  const char* v = std::getenv("DRIFTKV_DEVICE_TIMING");
  isolated_ = v != nullptr && std::strcmp(v, "isolated") == 0;
  enabled_ = isolated_ || (v != nullptr && std::strcmp(v, "1") == 0);
}

StageTimer::~StageTimer() {
  for (cudaEvent_t e : events_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

cudaEvent_t StageTimer::Event(Point point) {
  if (!Create()) return nullptr;
  marked_[point] = true;
  return events_[point];
}

bool StageTimer::Create() {
  if (!enabled_) return false;
  if (!created_) {
    // On the stream's device, which the caller made current.
    for (cudaEvent_t& e : events_) {
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        enabled_ = false;  // the destructor frees what was made
        return false;
      }
    }
    created_ = true;
  }
  return true;
}

void StageTimer::Mark(Point point, cudaStream_t stream) {
  if (!Create()) return;
  // A launch that failed after some marks (Event's among them) never
  // reached Collect: a new launch starts from none, so no stage of it is
  // timed from the failed one's events.
  if (point == kStart) marked_.fill(false);
  marked_[point] = cudaEventRecord(events_[point], stream) == cudaSuccess;
  if (point != kInputsDone) return;
  if (isolated_ && marked_[point]) cudaStreamSynchronize(stream);
  marked_[kAttentionStart] = cudaEventRecord(events_[kAttentionStart], stream) == cudaSuccess;
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
  between(kStart, kUploaded, DeviceStage::kUpload);
  between(kAttentionStart, kAttentionDone, DeviceStage::kAttention);
  between(kSplitDone, kAttentionDone, DeviceStage::kMerge);
  between(kAttentionDone, kOutputsDone, DeviceStage::kOutputs);
  between(kStart, kOutputsDone, DeviceStage::kSpan);
  cudaGetLastError();  // an unmarked pair's error is not the launch's
  marked_.fill(false);
}

}  // namespace cuda_backend
}  // namespace driftkv
