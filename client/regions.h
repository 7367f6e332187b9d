// Memory regions from the client's side (docs/api.md, "Memory regions"):
// memory registered once with the server, that requests then name by
// (region, offset) instead of carrying bytes.
//
// HostRegion: host shared memory. Create() makes a memfd of the asked size
// (zeros), seals it against shrinking (the server maps it, and a file that
// shrank under a mapping would fault the server), maps it here, hands the
// descriptor to the server's region socket (wire/fd_socket.h) and
// registers the attach token it answers. Both processes then see the same
// pages. The lease is renewed by a background thread every third of it
// (unless options.renew_in_background is false: call Renew()); the
// destructor unregisters and unmaps. If this process dies, the server
// drops the region when the lease runs out.
//
// RegisterCudaRegion: device memory, by a cudaIpcMemHandle_t the caller
// got from cudaIpcGetMemHandle (this library needs no CUDA).
#ifndef DRIFTKV_CLIENT_REGIONS_H_
#define DRIFTKV_CLIENT_REGIONS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace driftkv {

struct HostRegionOptions {
  std::string socket_path;     // the server's region socket; empty: InfoResponse.region_socket
  uint32_t lease_seconds = 0;  // 0: the server's default
  std::string name;            // a label, at most 128 bytes
  bool renew_in_background = true;
  absl::Duration socket_timeout = absl::Seconds(5);
};

class HostRegion {
 public:
  // `client` must outlive the region. FailedPrecondition with the server's
  // reason when its socket refuses the memory; what RegisterRegion answers
  // otherwise.
  static absl::StatusOr<std::unique_ptr<HostRegion>> Create(Client* client, uint64_t bytes,
                                                            HostRegionOptions options = {});
  ~HostRegion();  // Unregister (errors ignored), then unmap
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uint64_t id() const { return id_; }
  void* data() const { return base_; }  // host memory, shared with the server
  uint64_t size() const { return size_; }
  uint32_t lease_seconds() const { return lease_seconds_; }
  // `offset` into this region, for a request's *_ref field.
  v1::TensorRef Ref(uint64_t offset) const;

  // RenewRegions of this region; NotFound when the server no longer has it.
  absl::Status Renew();
  // UnregisterRegion; later calls do nothing. The memory stays mapped here
  // until the destructor.
  absl::Status Unregister();

 private:
  HostRegion() = default;

  Client* client_ = nullptr;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t id_ = 0;
  uint32_t lease_seconds_ = 0;
  bool unregistered_ = false;
  absl::Notification stop_;
  std::thread renewer_;
};

// The RPCs themselves (one attempt each: an attach token is single-use).
// `handle`: the 64 bytes of a cudaIpcMemHandle_t; `device`: the
// allocation's CUDA device ordinal on the server's node; `size`: bytes
// from the allocation's base.
absl::StatusOr<v1::RegisterRegionResponse> RegisterCudaRegion(Client* client, absl::string_view handle, int device,
                                                              uint64_t size, uint32_t lease_seconds = 0,
                                                              const std::string& name = "");
absl::StatusOr<v1::RegisterRegionResponse> RegisterRegion(Client* client, const v1::RegisterRegionRequest& request);
absl::Status UnregisterRegion(Client* client, uint64_t region_id);
// Empty `region_ids`: every region of the caller's tenant.
absl::StatusOr<v1::RenewRegionsResponse> RenewRegions(Client* client, absl::Span<const uint64_t> region_ids);

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_REGIONS_H_
