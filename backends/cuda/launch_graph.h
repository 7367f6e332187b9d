// The device calls of one attention launch (the staging upload, the
// gather, the attention and merge kernels, the scatter, the copies back)
// replayed as one CUDA graph when a call has the shape of the call before
// it: a decode loop's no-step Attends (every layer the same batch) then
// pay one cudaGraphLaunch instead of six host calls, and the device runs
// them back to back.
//
// A call's shape is its Signature: every value its device calls take by
// value (counts, sizes, buffer addresses, the softmax scale). Everything
// else they read from device memory the upload refreshes, so replaying
// the graph of an equal signature does exactly what issuing the calls
// would. A signature is captured the second time in a row it is seen (a
// shape seen once, or shapes that alternate, never pay a capture); a
// capture that fails (an unsupported call in the sequence) falls back to
// issuing the calls, and that signature is not tried again.
//
// DRIFTKV_CUDA_GRAPHS=0 in the server's environment turns replay off (the
// calls are then always issued one by one), to measure the two side by
// side.
#ifndef DRIFTKV_BACKENDS_CUDA_LAUNCH_GRAPH_H_
#define DRIFTKV_BACKENDS_CUDA_LAUNCH_GRAPH_H_

#include <cstdint>
#include <functional>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace cuda_backend {

class LaunchGraph {
 public:
  using Signature = std::vector<int64_t>;

  LaunchGraph();
  ~LaunchGraph();
  LaunchGraph(const LaunchGraph&) = delete;
  LaunchGraph& operator=(const LaunchGraph&) = delete;

  // Issues a call's device work on `stream`: replays the graph of an equal
  // signature, or captures `issue` (which queues the calls on `stream` and
  // nothing else) and replays that, or runs `issue`. Not thread-safe: the
  // backend calls it under its lock.
  absl::Status Run(const Signature& signature, cudaStream_t stream, const std::function<absl::Status()>& issue);

  // Calls issued each way so far (for tests and logs).
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }

 private:
  // Captures `issue` into exec_; false when the capture failed (nothing
  // was queued: the caller issues the calls itself).
  bool Capture(cudaStream_t stream, const std::function<absl::Status()>& issue);

  Signature last_;   // the previous call's
  Signature graph_;  // exec_'s
  cudaGraphExec_t exec_ = nullptr;
  std::vector<Signature> failed_;  // captures that failed (a few at most)
  int64_t replays_ = 0, captures_ = 0;
  bool enabled_ = true;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_LAUNCH_GRAPH_H_
