// One end of a 2-rank non-blocking NCCL communicator
// (ncclCommInitRankConfig with blocking = 0) on its own CUDA stream: the
// client library's sender and the server's receiver (nccl_transport.cc).
// No call waits for the peer: joining, sends and receives are polled, so a
// peer that never comes or dies cannot hang the caller, who aborts the
// communicator (ncclCommAbort) at its deadline.
//
// Both processes must load the same libnccl: Version() is ncclGetVersion of
// the library loaded at run time (not the header's), exchanged when a
// channel opens (docs/nccl.md).
#ifndef DRIFTKV_TRANSPORT_NCCL_COMM_H_
#define DRIFTKV_TRANSPORT_NCCL_COMM_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "transport/transport.h"

namespace driftkv {

class NcclComm {
 public:
  // ncclGetVersion of the loaded library (e.g. 22809 for 2.28.9).
  static int Version();
  // A new ncclUniqueId (ncclGetUniqueId), as its 128 bytes.
  static absl::StatusOr<std::string> NewUniqueId();
  // Starts joining as `rank` (0 or 1) of 2 on CUDA device `device`.
  static absl::StatusOr<std::unique_ptr<NcclComm>> Join(absl::string_view unique_id, int rank, int device);
  ~NcclComm();  // aborts

  // True once joined; an error when joining failed.
  absl::StatusOr<bool> Ready();
  // Starts sending (send) or receiving `parts` to/from the other rank, in
  // order, as one NCCL group. REQUIRES: Ready() true, nothing in flight.
  absl::Status Start(bool send, absl::Span<const TransportBuffer> parts);
  // True once the transfer is complete; an error when the communicator failed.
  absl::StatusOr<bool> Done();
  // ncclCommAbort; idempotent. Safe from another thread while one of the
  // calls above polls (they then fail with ABORTED).
  void Abort();

 private:
  NcclComm() = default;
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace driftkv

#endif  // DRIFTKV_TRANSPORT_NCCL_COMM_H_
