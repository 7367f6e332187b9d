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

  // An Attend launch's client tensors, in steps that add no device call
  // of their own but the two launches and one copy of the check flags:
  //  1. Plan lists them (the gather's and the scatter's items, and the
  //     query check flags) and returns the bytes they take in the launch's
  //     staging upload (0: none), its host buffers sized;
  //  2. Stage writes them at `host` in the staging buffer, the flags set
  //     to kNoBadElement, so that the launch's one upload carries them;
  //  3. GatherQueries queues the copy of every client query into row i of
  //     query_dev (f32, rows of `stride` floats), checking those of jobs
  //     with check_query on the way (their flags come back on the stream:
  //     after it synchronised, FinishQueryChecks sets their query_bad);
  //     ScatterOutputs queues the copy of row i of out_dev / lse_dev to
  //     every job with a client output. `dev` is the device address of
  //     what Stage wrote. The jobs' pointers must stay valid until the
  //     stream has run them.
  absl::StatusOr<size_t> Plan(absl::Span<const AttendJob> jobs, int stride);
  // Sizes Plan's host buffers for launches of up to `items` client tensors
  // each way, all checked, and returns what such a launch takes in the
  // staging upload.
  absl::StatusOr<size_t> Warm(int items);
  void Stage(uint8_t* host) const;
  absl::Status GatherQueries(uint8_t* dev, float* query_dev, cudaStream_t stream);
  void FinishQueryChecks(absl::Span<AttendJob> jobs);
  absl::Status ScatterOutputs(const uint8_t* dev, int q_heads, const float* out_dev, const float* lse_dev,
                              cudaStream_t stream);
  // Backend::ReadClientTensors: the tensors wanted on the host gathered
  // into packed rows and copied back in one copy, the others only checked;
  // one synchronisation of `stream`.
  absl::Status Read(absl::Span<ClientRead> reads, cudaStream_t stream);

 private:
  // Uploads `items` (through pinned memory) and returns their device copy
  // (Read's list).
  absl::StatusOr<const gpu::RegionIoItem*> Upload(const std::vector<gpu::RegionIoItem>& items, cudaStream_t stream);
  PinnedScratch host_items_;
  Scratch items_dev_;
  Scratch rows_dev_, bad_dev_;
  // The launch in flight (Plan): its items, where Stage puts them, and
  // the query checks: checked_[k] is the job behind gathered item k (-1:
  // not checked).
  std::vector<gpu::RegionIoItem> gather_, scatter_;
  int stride_ = 0;
  size_t scatter_at_ = 0, bad_at_ = 0;
  bool check_ = false;
  std::vector<int> checked_;
  PinnedScratch host_query_bad_;
  PinnedScratch host_rows_, host_bad_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_CLIENT_IO_H_
