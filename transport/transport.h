// The bulk data plane of the service's channels (service/channels.h,
// docs/nccl.md): a point-to-point link from one client, over which the
// server receives a chunk's keys and values straight into staging memory.
// gRPC carries the control messages; a Transport only moves bytes.
//
// The NCCL implementation (nccl_transport.cc over nccl_comm.h) is a 2-rank non-blocking
// communicator; tests use a fake (fake_transport.h). Every call returns
// at once: the channel's state machine polls, and owns the deadlines.
#ifndef DRIFTKV_TRANSPORT_TRANSPORT_H_
#define DRIFTKV_TRANSPORT_TRANSPORT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace driftkv {

struct TransportBuffer {
  void* data = nullptr;  // staging memory (device memory of the link's device for NCCL)
  size_t bytes = 0;
};

// The server's end of one link.
class Transport {
 public:
  virtual ~Transport() = default;
  // True once the link is up; an error when joining failed.
  virtual absl::StatusOr<bool> Connected() = 0;
  // Starts receiving `parts` from the peer, in order. REQUIRES: Connected()
  // returned true and no receive is in flight.
  virtual absl::Status StartRecv(absl::Span<const TransportBuffer> parts) = 0;
  // True once the receive has completed; an error when the link failed.
  virtual absl::StatusOr<bool> RecvDone() = 0;
  // Tears the link down at once (ncclCommAbort): a receive in flight ends
  // and its buffers may be reused; every later call fails. Idempotent.
  virtual void Abort() = 0;
};

class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  // The library version both ends must load the same of (ncclGetVersion).
  virtual int version() const = 0;
  // Whether receive buffers must be device memory (NCCL); the service then
  // refuses channels on a backend without it.
  virtual bool needs_device_memory() const { return true; }
  // Starts joining the link whose id the peer made (the peer is rank 0,
  // this end rank 1), on CUDA device `device`. InvalidArgument for a
  // malformed id.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Connect(absl::string_view peer_id, int device) = 0;
};

// The factory a server binary links (driftkv-server-cuda links the NCCL
// one, //transport:nccl_registration); null when none is linked.
TransportFactory* DefaultTransportFactory();
// For static initializers; returns true.
bool RegisterDefaultTransportFactory(TransportFactory* factory);

}  // namespace driftkv

#endif  // DRIFTKV_TRANSPORT_TRANSPORT_H_
