#include "backends/cuda/launch_graph.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cuda/device_memory.h"

namespace driftkv {
namespace cuda_backend {

LaunchGraph::LaunchGraph() {
  const char* env = std::getenv("DRIFTKV_CUDA_GRAPHS");
  enabled_ = env == nullptr || std::string(env) != "0";
}

LaunchGraph::~LaunchGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

bool LaunchGraph::Capture(cudaStream_t stream, const std::function<absl::Status()>& issue) {
  // Thread-local mode: other threads' calls (their own streams, host
  // allocations) neither break this capture nor are refused by it.
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const absl::Status st = issue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  const bool ok =
      st.ok() && end == cudaSuccess && graph != nullptr && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves its error behind
  if (!ok) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    return false;
  }
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = exec;
  return true;
}

absl::Status LaunchGraph::Run(const Signature& signature, cudaStream_t stream,
                              const std::function<absl::Status()>& issue) {
  if (!enabled_) return issue();
  if (exec_ != nullptr && signature == graph_) {
    ++replays_;
    return Cuda(cudaGraphLaunch(exec_, stream), "attention graph launch");
  }
  const bool again = signature == last_;
  last_ = signature;
  if (!again || std::find(failed_.begin(), failed_.end(), signature) != failed_.end()) return issue();
  if (!Capture(stream, issue)) {
    if (failed_.size() < 8) failed_.push_back(signature);
    if (failed_.size() == 1) {
      std::fprintf(stderr,
                   "driftkv-server: cuda: an attention launch could not be captured as a graph; "
                   "its calls are issued one by one\n");
    }
    return issue();
  }
  graph_ = signature;
  if (++captures_ == 1) {
    std::fprintf(stderr, "driftkv-server: cuda: repeated attention launches replay as one CUDA graph\n");
  }
  ++replays_;
  return Cuda(cudaGraphLaunch(exec_, stream), "attention graph launch");
}

}  // namespace cuda_backend
}  // namespace driftkv
