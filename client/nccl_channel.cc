#include "client/nccl_channel.h"

#include <chrono>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "transport/nccl_comm.h"

namespace driftkv {
namespace {

void SetTimeout(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Open(Client* client, int device) {
  absl::StatusOr<std::string> uid = NcclComm::NewUniqueId();
  if (!uid.ok()) return uid.status();
  absl::StatusOr<std::unique_ptr<NcclComm>> comm = NcclComm::Join(*uid, 0, device);
  if (!comm.ok()) return comm.status();
  std::unique_ptr<NcclChannel> ch(new NcclChannel());
  ch->client_ = client;
  ch->comm_ = *std::move(comm);
  v1::OpenChannelRequest request;
  request.set_nccl_unique_id(*uid);
  request.set_nccl_version(NcclComm::Version());
  v1::OpenChannelResponse response;
  grpc::ClientContext context;
  SetTimeout(&context, client->options().timeout);
  absl::Status st = FromGrpc(client->stub()->OpenChannel(&context, request, &response));
  if (!st.ok()) return st;
  ch->id_ = response.channel_id();
  ch->server_device_ = response.device();
  const absl::Time deadline = absl::Now() + client->options().timeout;
  for (;;) {
    absl::StatusOr<bool> ready = ch->comm_->Ready();
    if (!ready.ok()) return ready.status();
    if (*ready) break;
    if (absl::Now() > deadline)
      return absl::DeadlineExceededError("the server did not join the NCCL communicator in time");
    absl::SleepFor(absl::Microseconds(100));
  }
  return ch;
}

NcclChannel::~NcclChannel() {
  Close().IgnoreError();
}

absl::StatusOr<v1::AppendResponse> NcclChannel::Push(v1::PushChunkRequest header, const void* keys_dev,
                                                     const void* values_dev) {
  if (dead_ || closed_) return absl::FailedPreconditionError(absl::StrCat("channel ", id_, " is closed or aborted"));
  header.set_channel_id(id_);
  const TransportBuffer parts[2] = {{const_cast<void*>(keys_dev), header.tensor_bytes()},
                                    {const_cast<void*>(values_dev), header.tensor_bytes()}};
  grpc::ClientContext context;
  SetTimeout(&context, client_->options().timeout);
  v1::AppendResponse response;
  std::future<grpc::Status> rpc =
      std::async(std::launch::async, [&] { return client_->stub()->PushChunk(&context, header, &response); });
  absl::Status st = comm_->Start(true, parts);
  bool sent = false;
  absl::Time answered = absl::InfiniteFuture();
  while (st.ok() && !sent) {
    absl::StatusOr<bool> done = comm_->Done();
    if (!done.ok()) {
      st = done.status();
      break;
    }
    sent = *done;
    if (sent) break;
    if (answered == absl::InfiniteFuture() && rpc.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      answered = absl::Now();
    }
    // An answer while the data has not left: the server will never take
    // it (after a grace for the send's own completion to show).
    if (absl::Now() - answered > absl::Milliseconds(200)) break;
    std::this_thread::yield();
  }
  if (!sent) {
    comm_->Abort();
    dead_ = true;
    context.TryCancel();
  }
  const grpc::Status rs = rpc.get();
  if (!rs.ok()) {
    if (!sent) dead_ = true;
    return FromGrpc(rs);
  }
  if (!st.ok()) return st;
  return response;
}

absl::Status NcclChannel::Close() {
  if (closed_) return absl::OkStatus();
  closed_ = true;
  absl::Status st;
  if (!dead_) {
    v1::CloseChannelRequest request;
    request.set_channel_id(id_);
    v1::CloseChannelResponse response;
    grpc::ClientContext context;
    SetTimeout(&context, client_->options().timeout);
    st = FromGrpc(client_->stub()->CloseChannel(&context, request, &response));
  }
  comm_->Abort();
  return st;
}

}  // namespace driftkv
