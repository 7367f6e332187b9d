// driftkv::DoorbellClient: Attend through a doorbell (wire/doorbell.h) in a
// HostRegion, for a client on the server's host: the request and the
// answer cross shared memory; no socket, no per-call setup.
//
//   auto region = HostRegion::Create(&client, bytes);
//   auto bell = DoorbellClient::Open(&client, region->get(), /*offset=*/0);
//   auto r = (*bell)->Attend(request);        // items name regions by ref
//
// Not thread-safe: one request at a time per doorbell (open several for
// concurrency). The caller waits by spinning for kSpinTime, then on the
// futex. The region must outlive the doorbell.
#ifndef DRIFTKV_CLIENT_DOORBELL_H_
#define DRIFTKV_CLIENT_DOORBELL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/regions.h"
#include "proto/driftkv.pb.h"

namespace driftkv {

class DoorbellClient {
 public:
  static constexpr uint64_t kDefaultCapacity = 1 << 20;
  // Zeroes the doorbell's bytes at `offset` of `region` and asks the server
  // to watch them (OpenDoorbell). `offset` a multiple of 64.
  static absl::StatusOr<std::unique_ptr<DoorbellClient>> Open(Client* client, HostRegion* region, uint64_t offset,
                                                              uint64_t request_capacity = kDefaultCapacity,
                                                              uint64_t response_capacity = kDefaultCapacity);
  ~DoorbellClient();  // Close, errors ignored

  // Sends `request` and waits for its answer; `timeout` (0: none) is the
  // request's deadline on the server and bounds the wait here
  // (DEADLINE_EXCEEDED; the doorbell is then unusable: the answer may still
  // come). The answer's status is the server's.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Duration timeout = absl::ZeroDuration());
  // The same with the request already serialized; *response parsed into.
  absl::Status Call(absl::string_view request_bytes, absl::Duration timeout, v1::AttendResponse* response);
  // PREPARED REQUESTS (wire/doorbell.h): keeps `request` (every tensor by
  // reference) in `slot` on the server, for AttendPrepared to answer again
  // and again without sending it; an empty request empties the slot.
  absl::Status Prepare(uint32_t slot, const v1::AttendRequest& request, absl::Duration timeout = absl::ZeroDuration());
  // Answers the request kept in `slot`, each new_token_index it set
  // advanced by `token_index_offset` (the decode steps taken since it was
  // prepared). The tensors are read from the regions at this call.
  absl::Status AttendPrepared(uint32_t slot, uint64_t token_index_offset, v1::AttendResponse* response,
                              absl::Duration timeout = absl::ZeroDuration());
  absl::Status Close();
  uint64_t id() const { return id_; }
  // Bytes a doorbell of these capacities spans in its region.
  static uint64_t Bytes(uint64_t request_capacity, uint64_t response_capacity);

 private:
  DoorbellClient() = default;
  // Rings for the `bytes` of request already in the request area and waits.
  // OK when a request of `bytes` fits the request area and the doorbell
  // still answers; otherwise the refusal, before anything is written.
  absl::Status Writable(size_t bytes) const;
  // `kind`, `slot` and `offset` as wire/doorbell.h's client line has them.
  absl::Status Ring(uint32_t bytes, absl::Duration timeout, v1::AttendResponse* response, uint32_t kind = 0,
                    uint32_t slot = 0, uint64_t offset = 0);
  Client* client_ = nullptr;
  uint8_t* base_ = nullptr;
  uint64_t request_capacity_ = 0, response_capacity_ = 0;
  uint64_t id_ = 0;
  uint64_t seq_ = 0;
  bool broken_ = false, closed_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_DOORBELL_H_
