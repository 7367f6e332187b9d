// CLIENT MEMORY of the CUDA backend (backends/backend.h): moves the queries
// and outputs of jobs whose tensors live in client memory the device
// addresses between those buffers and the contiguous rows the attention
// kernels read and write (kernels/region_io.h), and reads client tensors
// for the handler (Backend::ReadClientTensors). Owned by one backend and
// used under its lock, on its stream.
#ifndef DRIFTKV_BACKENDS_CUDA_CLIENT_IO_H_
#define DRIFTKV_BACKENDS_CUDA_CLIENT_IO_H_

#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/device_memory.h"
#include "kernels/region_io.h"

namespace driftkv {
namespace cuda_backend {

class ClientIo {
 public:
  // Whether any job reads its query from, or writes its output to, client
  // memory.
  static bool AnyQuery(absl::Span<const AttendJob> jobs);
  static bool AllQueries(absl::Span<const AttendJob> jobs);
  static bool AnyOutput(absl::Span<const AttendJob> jobs);
  static bool AllOutputs(absl::Span<const AttendJob> jobs);

  // Queues the copy of every client query into row i of query_dev (f32,
  // rows of `stride` floats). The jobs' pointers must stay valid until the
  // stream has run it.
  // Jobs with check_query are checked on the way (their flags come back
  // on the stream): after it synchronised, FinishQueryChecks sets their
  // query_bad.
  absl::Status GatherQueries(absl::Span<const AttendJob> jobs, int stride, float* query_dev, cudaStream_t stream);
  void FinishQueryChecks(absl::Span<AttendJob> jobs);
  // Queues the copy of row i of out_dev / lse_dev to every job with a
  // client output.
  absl::Status ScatterOutputs(absl::Span<const AttendJob> jobs, int stride, int q_heads, const float* out_dev,
                              const float* lse_dev, cudaStream_t stream);
  // Backend::ReadClientTensors: the tensors wanted on the host gathered
  // into packed rows and copied back in one copy, the others only checked;
  // one synchronisation of `stream`.
  absl::Status Read(absl::Span<ClientRead> reads, cudaStream_t stream);

 private:
  // Uploads `items` (through pinned memory) and returns their device copy.
  absl::StatusOr<const gpu::RegionIoItem*> Upload(const std::vector<gpu::RegionIoItem>& items, bool second,
                                                  cudaStream_t stream);
  // Two item lists may be in flight on the stream at once (gather and
  // scatter of one launch), so each has its own buffers.
  PinnedScratch host_items_[2];
  Scratch items_dev_[2];
  Scratch rows_dev_, bad_dev_;
  // The query checks of the launch in flight: checked_[k] is the job
  // behind gathered item k (-1: not checked).
  std::vector<int> checked_;
  Scratch query_bad_dev_;
  PinnedScratch host_query_bad_;
  PinnedScratch host_rows_, host_bad_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_CLIENT_IO_H_
