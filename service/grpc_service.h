// The thin gRPC layer: unpacks each call, hands it to the Handler, converts
// absl::Status to grpc::Status once, and records the RPC's latency by method
// and status code. No decisions are taken here, except who the caller is:
// with tokens on, every method first takes the call's tenant
// (service/auth.h) and refuses a call without one (UNAUTHENTICATED).
#ifndef DRIFTKV_SERVICE_GRPC_SERVICE_H_
#define DRIFTKV_SERVICE_GRPC_SERVICE_H_

#include <string>

#include "proto/driftkv.grpc.pb.h"
#include "service/attend_request_wire.h"
#include "service/auth.h"
#include "service/channels.h"
#include "service/doorbell.h"
#include "service/handler.h"
#include "service/metrics.h"
#include "service/regions.h"

namespace driftkv {

class KvCacheService final : public v1::KvCache::Service {
 public:
  // All must outlive the service.
  // `auth`: null without tokens; else each call's tenant comes from its
  // bearer token and client certificate (service/auth.h).
  // `regions`, `doorbells`: null answers their methods with UNIMPLEMENTED.
  // gRPC calls AttendToBuffer for Attend; with `polled_attend` the method
  // is raw instead, and the server's AttendPoller (service/attend_poller.h)
  // asks for its calls with RequestAttend and serves them with AttendBytes.
  KvCacheService(Handler* handler, ChannelManager* channels, Metrics* metrics, const Authenticator* auth = nullptr,
                 RegionTable* regions = nullptr, DoorbellTable* doorbells = nullptr, bool polled_attend = false);

  grpc::Status Append(grpc::ServerContext* context, grpc::ServerReader<v1::AppendChunk>* reader,
                      v1::AppendResponse* response) override;
  // Attend on the wire: the request's inline queries are read where gRPC
  // received them (service/attend_request_wire.h) and the answer's inline
  // outputs go out from the pinned staging the device wrote them to
  // (service/attend_wire.h), not copied
  // into the response and again into gRPC's slices.
  grpc::Status AttendToBuffer(grpc::ServerContext* context,
                              grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream);
  // The polled form (REQUIRES: polled_attend): the next Attend call on
  // `cq`, its request as bytes; and one call served, bytes in and out.
  void RequestAttend(grpc::ServerContext* context, grpc::ByteBuffer* request,
                     grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                     void* tag);
  grpc::Status AttendBytes(grpc::ServerContext* context, grpc::ByteBuffer* request, grpc::ByteBuffer* response);
  grpc::Status Read(grpc::ServerContext* context, const v1::ReadRequest* request,
                    grpc::ServerWriter<v1::ReadChunk>* writer) override;
  grpc::Status Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse* response) override;
  grpc::Status Length(grpc::ServerContext* context, const v1::LengthRequest* request,
                      v1::LengthResponse* response) override;
  grpc::Status Prefetch(grpc::ServerContext* context, const v1::PrefetchRequest* request,
                        v1::PrefetchResponse* response) override;
  grpc::Status Fork(grpc::ServerContext* context, const v1::ForkRequest* request, v1::ForkResponse* response) override;
  grpc::Status Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                      v1::LookupResponse* response) override;
  grpc::Status Pin(grpc::ServerContext* context, const v1::PinRequest* request, v1::PinResponse* response) override;
  grpc::Status Unpin(grpc::ServerContext* context, const v1::UnpinRequest* request,
                     v1::UnpinResponse* response) override;
  grpc::Status WatchPages(grpc::ServerContext* context, const v1::WatchPagesRequest* request,
                          grpc::ServerWriter<v1::PageEventBatch>* writer) override;
  grpc::Status Info(grpc::ServerContext* context, const v1::InfoRequest* request, v1::InfoResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;
  grpc::Status OpenChannel(grpc::ServerContext* context, const v1::OpenChannelRequest* request,
                           v1::OpenChannelResponse* response) override;
  grpc::Status PushChunk(grpc::ServerContext* context, const v1::PushChunkRequest* request,
                         v1::AppendResponse* response) override;
  grpc::Status CloseChannel(grpc::ServerContext* context, const v1::CloseChannelRequest* request,
                            v1::CloseChannelResponse* response) override;
  grpc::Status RegisterRegion(grpc::ServerContext* context, const v1::RegisterRegionRequest* request,
                              v1::RegisterRegionResponse* response) override;
  grpc::Status UnregisterRegion(grpc::ServerContext* context, const v1::UnregisterRegionRequest* request,
                                v1::UnregisterRegionResponse* response) override;
  grpc::Status RenewRegions(grpc::ServerContext* context, const v1::RenewRegionsRequest* request,
                            v1::RenewRegionsResponse* response) override;
  grpc::Status AttendStream(grpc::ServerContext* context,
                            grpc::ServerReaderWriter<v1::AttendFrameResult, v1::AttendFrame>* stream) override;
  grpc::Status OpenDoorbell(grpc::ServerContext* context, const v1::OpenDoorbellRequest* request,
                            v1::OpenDoorbellResponse* response) override;
  grpc::Status CloseDoorbell(grpc::ServerContext* context, const v1::CloseDoorbellRequest* request,
                             v1::CloseDoorbellResponse* response) override;

 private:
  // Both forms of Attend first: the caller's tenant into *tenant and
  // `bytes` (null: the call sent none) parsed into *request, as the call's
  // `request` phase (the phase clock begun here, abandoned on an error).
  grpc::Status BeginAttend(const grpc::ServerContext& context, const grpc::ByteBuffer* bytes,
                           AttendRequestWire* request, std::string* tenant);
  // Both forms of Attend once the caller's tenant is known and the
  // request parsed: the answer's wire bytes, or the status to send instead;
  // *answer is the message the Handler fills (its results replaced).
  grpc::Status ServeAttend(const AttendRequestWire& request, const std::string& tenant, v1::AttendResponse* answer,
                           grpc::ByteBuffer* response);

  const int attend_method_;  // Attend's index among the service's methods
  Handler* const handler_;
  ChannelManager* const channels_;
  Metrics* const metrics_;
  const Authenticator* const auth_;
  RegionTable* const regions_;
  DoorbellTable* const doorbells_;
};

// absl::Status -> grpc::Status (the code numbers are the same by design).
grpc::Status ToGrpcStatus(const absl::Status& status);
// "OK", "INVALID_ARGUMENT", ...
const char* StatusCodeName(grpc::StatusCode code);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_GRPC_SERVICE_H_
