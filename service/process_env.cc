#include "service/process_env.h"

#include <cstdlib>

#include "absl/synchronization/mutex.h"

namespace driftkv {

void PrepareServerProcess() {
  setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace driftkv
