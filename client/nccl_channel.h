// driftkv::NcclChannel: the client end of an NCCL ingest channel
// (docs/nccl.md). Keys and values go from this process's GPU straight into
// the server's, over a 2-rank non-blocking NCCL communicator; the chunk's
// header and its answer go over gRPC (PushChunk), with Append's semantics.
//
//   auto ch = NcclChannel::Open(&client, /*device=*/0);
//   auto r = (*ch)->Push(header, keys_dev, values_dev);   // header.tensor_bytes each
//
// Open makes the ncclUniqueId (this end is rank 0), sends it with this
// process's ncclGetVersion (the server refuses another version) and waits,
// up to ClientOptions::timeout, for the communicator. Push sends one chunk
// and waits for the server's answer; when that answer is an error before
// the data has left (a framing error, the server aborted the channel), the
// send is aborted too and the channel is dead: open a new one and resend
// (the chunk is idempotent). Not thread-safe: one chunk at a time, as the
// protocol requires; open several channels for concurrency.
#ifndef DRIFTKV_CLIENT_NCCL_CHANNEL_H_
#define DRIFTKV_CLIENT_NCCL_CHANNEL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/driftkv.pb.h"

namespace driftkv {

class NcclComm;

class NcclChannel {
 public:
  // `client` must outlive the channel.
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Open(Client* client, int device);
  ~NcclChannel();  // closes (best effort)

  // header.channel_id is filled in; keys_dev and values_dev hold
  // header.tensor_bytes each on the channel's device.
  absl::StatusOr<v1::AppendResponse> Push(v1::PushChunkRequest header, const void* keys_dev, const void* values_dev);
  // CloseChannel, then the communicator is torn down. Idempotent.
  absl::Status Close();

  uint64_t id() const { return id_; }
  int server_device() const { return server_device_; }
  bool dead() const { return dead_; }

 private:
  NcclChannel() = default;
  Client* client_ = nullptr;
  std::unique_ptr<NcclComm> comm_;
  uint64_t id_ = 0;
  int server_device_ = -1;
  bool dead_ = false;
  bool closed_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_NCCL_CHANNEL_H_
