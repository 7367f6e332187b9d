#include "transport/nccl_comm.h"

#include <cstring>

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace driftkv {
namespace {

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

// Every method takes mu: Abort may come from another thread (a channel
// closed or aborted while its chunk is being polled).
struct NcclComm::State {
  absl::Mutex mu;
  int device = 0;
  int rank = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
  bool ready = false;
  bool enqueued = false;  // the group of the transfer in flight is on the stream
  bool in_flight = false;
  bool aborted = false;

  // ncclCommGetAsyncError: Ok(true) success, Ok(false) in progress.
  absl::StatusOr<bool> Poll(absl::string_view what) {
    if (aborted) return absl::AbortedError("NCCL communicator aborted");
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return NcclError(r, "ncclCommGetAsyncError");
    if (state == ncclInProgress) return false;
    if (state != ncclSuccess) return NcclError(state, what);
    return true;
  }
};

int NcclComm::Version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 0;
  return v;
}

absl::StatusOr<std::string> NcclComm::NewUniqueId() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError(r, "ncclGetUniqueId");
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclComm>> NcclComm::Join(absl::string_view unique_id, int rank, int device) {
  ncclUniqueId id;
  if (unique_id.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl_unique_id of ", unique_id.size(), " bytes must have ",
                                                   sizeof(id.internal), " (an ncclUniqueId)"));
  }
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->s_ = std::make_unique<State>();
  State& s = *c->s_;
  s.device = device;
  s.rank = rank;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return CudaError(e, absl::StrCat("cudaSetDevice(", device, ")"));
  e = cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming);
  if (e != cudaSuccess) return CudaError(e, "stream");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&s.comm, 2, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    s.comm = nullptr;
    return NcclError(r, "ncclCommInitRankConfig");
  }
  return c;
}

NcclComm::~NcclComm() {
  if (s_ == nullptr) return;
  Abort();
  absl::MutexLock lock(&s_->mu);
  cudaSetDevice(s_->device);
  if (s_->in_flight) cudaStreamSynchronize(s_->stream);  // the aborted kernels have ended
  if (s_->done != nullptr) cudaEventDestroy(s_->done);
  if (s_->stream != nullptr) cudaStreamDestroy(s_->stream);
}

absl::StatusOr<bool> NcclComm::Ready() {
  absl::MutexLock lock(&s_->mu);
  if (s_->ready) return true;
  absl::StatusOr<bool> st = s_->Poll("join");
  if (st.ok() && *st) s_->ready = true;
  return st;
}

absl::Status NcclComm::Start(bool send, absl::Span<const TransportBuffer> parts) {
  State& s = *s_;
  absl::MutexLock lock(&s.mu);
  if (s.aborted) return absl::AbortedError("NCCL communicator aborted");
  if (!s.ready || s.in_flight) return absl::FailedPreconditionError("NCCL communicator not ready or busy");
  cudaSetDevice(s.device);
  const int peer = 1 - s.rank;
  ncclResult_t r = ncclGroupStart();
  for (const TransportBuffer& b : parts) {
    if (r != ncclSuccess) break;
    r = send ? ncclSend(b.data, b.bytes, ncclUint8, peer, s.comm, s.stream)
             : ncclRecv(b.data, b.bytes, ncclUint8, peer, s.comm, s.stream);
  }
  ncclResult_t g = ncclGroupEnd();
  if (r == ncclSuccess) r = g;
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(r, send ? "send" : "recv");
  s.in_flight = true;
  s.enqueued = false;
  return absl::OkStatus();
}

absl::StatusOr<bool> NcclComm::Done() {
  State& s = *s_;
  absl::MutexLock lock(&s.mu);
  if (!s.in_flight) return absl::FailedPreconditionError("no NCCL transfer in flight");
  absl::StatusOr<bool> st = s.Poll("transfer");
  if (!st.ok() || !*st) return st;
  if (!s.enqueued) {
    cudaSetDevice(s.device);
    cudaError_t e = cudaEventRecord(s.done, s.stream);
    if (e != cudaSuccess) return CudaError(e, "cudaEventRecord");
    s.enqueued = true;
  }
  cudaError_t e = cudaEventQuery(s.done);
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) return CudaError(e, "transfer");
  s.in_flight = false;
  return true;
}

void NcclComm::Abort() {
  State& s = *s_;
  absl::MutexLock lock(&s.mu);
  if (s.aborted || s.comm == nullptr) {
    s.aborted = true;
    return;
  }
  s.aborted = true;
  cudaSetDevice(s.device);
  ncclCommAbort(s.comm);
  s.comm = nullptr;
}

}  // namespace driftkv
