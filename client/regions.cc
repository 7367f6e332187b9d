#include "client/regions.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "wire/fd_socket.h"

namespace driftkv {
namespace {

void SetDeadline(const Client& client, grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::microseconds(absl::ToInt64Microseconds(client.options().timeout)));
}

}  // namespace

absl::StatusOr<v1::RegisterRegionResponse> RegisterRegion(Client* client, const v1::RegisterRegionRequest& request) {
  grpc::ClientContext context;
  SetDeadline(*client, &context);
  v1::RegisterRegionResponse response;
  absl::Status st = FromGrpc(client->stub()->RegisterRegion(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<v1::RegisterRegionResponse> RegisterCudaRegion(Client* client, absl::string_view handle, int device,
                                                              uint64_t size, uint32_t lease_seconds,
                                                              const std::string& name) {
  v1::RegisterRegionRequest request;
  request.set_kind(v1::REGION_CUDA_IPC);
  request.set_cuda_ipc_handle(std::string(handle));
  request.set_device(device);
  request.set_size(size);
  request.set_lease_seconds(lease_seconds);
  request.set_name(name);
  return RegisterRegion(client, request);
}

absl::Status UnregisterRegion(Client* client, uint64_t region_id) {
  grpc::ClientContext context;
  SetDeadline(*client, &context);
  v1::UnregisterRegionRequest request;
  request.set_region_id(region_id);
  v1::UnregisterRegionResponse response;
  return FromGrpc(client->stub()->UnregisterRegion(&context, request, &response));
}

absl::StatusOr<v1::RenewRegionsResponse> RenewRegions(Client* client, absl::Span<const uint64_t> region_ids) {
  grpc::ClientContext context;
  SetDeadline(*client, &context);
  v1::RenewRegionsRequest request;
  for (uint64_t id : region_ids) request.add_region_ids(id);
  v1::RenewRegionsResponse response;
  absl::Status st = FromGrpc(client->stub()->RenewRegions(&context, request, &response));
  if (!st.ok()) return st;
  return response;
}

absl::StatusOr<std::unique_ptr<HostRegion>> HostRegion::Create(Client* client, uint64_t bytes,
                                                               HostRegionOptions options) {
  if (options.socket_path.empty()) {
    absl::StatusOr<v1::InfoResponse> info = client->Info();
    if (!info.ok()) return info.status();
    if (info->region_socket().empty()) {
      return absl::FailedPreconditionError("the server has no region socket (config region_socket)");
    }
    options.socket_path = info->region_socket();
  }
  absl::StatusOr<int> fd = CreateSealedMemfd(options.name.empty() ? "driftkv-region" : options.name, bytes);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<HostRegion> region(new HostRegion());
  region->client_ = client;
  region->size_ = bytes;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (base == MAP_FAILED) {
    close(*fd);
    return absl::ResourceExhaustedError("mmap of the region's memfd failed");
  }
  region->base_ = base;
  absl::StatusOr<AttachReply> reply = AttachFd(options.socket_path, *fd, options.socket_timeout);
  close(*fd);  // both mappings keep the memory
  if (!reply.ok()) return reply.status();
  v1::RegisterRegionRequest request;
  request.set_kind(v1::REGION_HOST_SHM);
  request.set_attach_token(reply->token);
  request.set_lease_seconds(options.lease_seconds);
  request.set_name(options.name);
  absl::StatusOr<v1::RegisterRegionResponse> registered = RegisterRegion(client, request);
  if (!registered.ok()) return registered.status();
  region->id_ = registered->region_id();
  region->lease_seconds_ = registered->lease_seconds();
  if (options.renew_in_background && region->lease_seconds_ > 0) {
    const absl::Duration period = absl::Seconds(region->lease_seconds_) / 3;
    HostRegion* self = region.get();
    region->renewer_ = std::thread([self, period] {
      while (!self->stop_.WaitForNotificationWithTimeout(period)) (void)self->Renew();
    });
  }
  return region;
}

HostRegion::~HostRegion() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (renewer_.joinable()) renewer_.join();
  if (id_ != 0) (void)Unregister();
  if (base_ != nullptr) munmap(base_, size_);
}

v1::TensorRef HostRegion::Ref(uint64_t offset) const {
  v1::TensorRef ref;
  ref.set_region_id(id_);
  ref.set_offset(offset);
  return ref;
}

absl::Status HostRegion::Renew() {
  const uint64_t ids[1] = {id_};
  absl::StatusOr<v1::RenewRegionsResponse> renewed = RenewRegions(client_, ids);
  if (!renewed.ok()) return renewed.status();
  if (renewed->unknown_region_ids_size() > 0) {
    return absl::NotFoundError(absl::StrCat("region_id ", id_, " not found"));
  }
  return absl::OkStatus();
}

absl::Status HostRegion::Unregister() {
  if (unregistered_) return absl::OkStatus();
  unregistered_ = true;
  return UnregisterRegion(client_, id_);
}

}  // namespace driftkv
