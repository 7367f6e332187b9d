// NCCL ingest channels (docs/nccl.md): the state machine between the gRPC
// control messages (OpenChannel, PushChunk, CloseChannel) and a Transport
// (transport/transport.h) that moves the keys and values into staging
// memory of the backend (DEVICE INGEST in backends/backend.h).
//
// A channel: opened by OpenChannel (the transport starts joining the
// client's communicator and does not wait for it), then one chunk at a
// time: PushChunk checks the header's framing, waits for the link, receives
// keys then values into the channel's staging buffer and hands the chunk to
// Handler::AppendStaged (Append's semantics). Nothing waits without a
// deadline: a chunk not received by min(the RPC's deadline,
// nccl_chunk_timeout_seconds) or a failing link aborts the channel
// (ncclCommAbort), the chunk is rejected as a whole and the pool is
// untouched; other channels and RPCs go on. A framing error (the bytes the
// client is sending cannot be received) also aborts the channel; a chunk
// that arrived and is then rejected (a gap, a bad value) leaves it open.
// At most nccl_max_channels are open, and at most its quota's
// max_nccl_channels of one tenant (config tenant_max_nccl_channels, by
// default with tokens an equal share: service/tenant_quotas.h); CloseIdle
// closes those unused for nccl_idle_seconds.
#ifndef DRIFTKV_SERVICE_CHANNELS_H_
#define DRIFTKV_SERVICE_CHANNELS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/backend.h"
#include "proto/driftkv.pb.h"
#include "service/handler.h"
#include "transport/transport.h"

namespace driftkv {

class ChannelManager {
 public:
  // `handler` and `factory` must outlive the manager; a null factory
  // answers OpenChannel with UNIMPLEMENTED.
  ChannelManager(Handler* handler, TransportFactory* factory);
  ~ChannelManager();  // aborts every channel

  // A channel belongs to the tenant that opened it (docs/security.md;
  // "" without tokens): to another tenant it is not open (NOT_FOUND), and
  // its chunks are stored for its tenant.
  absl::Status Open(const v1::OpenChannelRequest& request, v1::OpenChannelResponse* response,
                    const std::string& tenant = "");
  // `rpc_deadline`: the call's own deadline (absl::InfiniteFuture() for none).
  absl::Status Push(const v1::PushChunkRequest& request, absl::Time rpc_deadline, v1::AppendResponse* response,
                    const std::string& tenant = "");
  absl::Status Close(const v1::CloseChannelRequest& request, v1::CloseChannelResponse* response,
                     const std::string& tenant = "");
  // Closes channels unused for nccl_idle_seconds; returns how many.
  int CloseIdle();

  void Info(v1::InfoResponse* response) const;
  // The channels of the whole server, and `tenant`'s and its quota.
  void Stats(v1::StatsResponse* response, const std::string& tenant = "") const;

 private:
  struct Channel;
  enum class Ending { kClosed, kAborted, kIdle };
  // The open channel `id` of `tenant`; null for none.
  std::shared_ptr<Channel> Find(uint64_t id, const std::string& tenant);
  // Aborts the channel's link and forgets it; counts `why`.
  void End(const std::shared_ptr<Channel>& channel, Ending why);
  // Waits for the link, then receives keys and values (tensor_bytes each)
  // into the channel's staging buffer by `deadline`. REQUIRES: channel->mu
  // (Channel is defined in the .cc, where the analysis cannot name its
  // mutex from this declaration).
  absl::Status Receive(Channel* channel, uint64_t tensor_bytes, absl::Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Channels of `tenant` open now.
  int64_t OpenLocked(const std::string& tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Handler* const handler_;
  TransportFactory* const factory_;
  const ServiceOptions& options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<uint64_t> opened_{0}, aborted_{0}, idle_closed_{0}, chunks_{0};
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CHANNELS_H_
