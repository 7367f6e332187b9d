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
#include "kernels/attention_batch.h"
#include "kernels/region_io.h"

namespace driftkv {
namespace cuda_backend {

// One launch's client tensors, as ClientIo::Plan lists them: the
// gather's items, which jobs' queries are checked, and where each job's
// answer goes. A value, so that a launch plan the device keeps
// (launch_plans.h) keeps its own.
struct ClientLaunch {
  std::vector<gpu::RegionIoItem> gather;
  // checked[k]: the job whose query gathered item k is, when checked (-1:
  // not checked); empty when no query is checked.
  std::vector<int> checked;
  // Per job, its output in client memory (a null `out`: the launch's
  // rows); empty when no job has one.
  std::vector<gpu::OutputTarget> targets;
  int stride = 0;
  size_t targets_at = 0;  // byte offset of the targets in the lists
  // Bytes the lists take in the launch's staging upload (0: none).
  size_t bytes() const;
};

class ClientIo {
 public:
  // Whether any job reads its query from, or writes its output to, client
  // memory.
  static bool AnyQuery(absl::Span<const AttendJob> jobs);
  static bool AllQueries(absl::Span<const AttendJob> jobs);
  static bool AnyOutput(absl::Span<const AttendJob> jobs);
  static bool AllOutputs(absl::Span<const AttendJob> jobs);

  // An Attend launch's client tensors, in steps that add one launch, the
  // gather:
  //  1. Plan lists them (the gather's items, which queries are checked,
  //     the answers' targets) into `launch`, and sizes the check flags;
  //  2. Stage writes the lists at `host` in the staging buffer, so that
  //     the launch's one upload carries them;
  //  3. GatherQueries queues the copy of every client query into row i of
  //     query_dev (f32, rows of `stride` floats), checking those of jobs
  //     with check_query on the way: the gather stores its flags straight
  //     into pinned host memory, and after the stream synchronised
  //     FinishQueryChecks sets their query_bad. Targets tells the
  //     attention launch where the targets lie: its merge writes the
  //     answers there. `dev` is the device address of what Stage wrote (or
  //     of the same bytes uploaded by an earlier launch). The jobs'
  //     pointers must stay valid until the stream has run them.
  absl::Status Plan(absl::Span<const AttendJob> jobs, int stride, ClientLaunch* launch);
  // Sizes the check flags for launches of up to `items` client tensors
  // each way, all checked, and returns what such a launch takes in the
  // staging upload.
  absl::StatusOr<size_t> Warm(int items);
  static void Stage(const ClientLaunch& launch, uint8_t* host);
  absl::Status GatherQueries(const ClientLaunch& launch, const uint8_t* dev, float* query_dev, cudaStream_t stream);
  void FinishQueryChecks(const ClientLaunch& launch, absl::Span<AttendJob> jobs) const;
  static const gpu::OutputTarget* Targets(const ClientLaunch& launch, const uint8_t* dev) {
    return launch.targets.empty() ? nullptr : reinterpret_cast<const gpu::OutputTarget*>(dev + launch.targets_at);
  }
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
  Scratch rows_dev_;
  // The gathers' check flags ([items][kGatherBlocks]), pinned: the device
  // stores them here.
  PinnedScratch host_query_bad_, host_bad_;
  PinnedScratch host_rows_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_CLIENT_IO_H_
