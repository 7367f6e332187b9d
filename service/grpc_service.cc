#include "service/grpc_service.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "backends/attend_phases.h"
#include "service/attend_io.h"
#include "service/attend_stream.h"
#include "service/attend_wire.h"
#include "service/auth.h"
#include "service/stats_scope.h"

namespace driftkv {
namespace {

// Times one RPC and records it when it finishes.
class RpcTimer {
 public:
  RpcTimer(Metrics* metrics, const char* method) : metrics_(metrics), method_(method), start_(absl::Now()) {}
  grpc::Status Finish(const grpc::Status& status) {
    metrics_->RecordRpc(method_, StatusCodeName(status.error_code()), absl::ToDoubleSeconds(absl::Now() - start_));
    return status;
  }

 private:
  Metrics* metrics_;
  const char* method_;
  absl::Time start_;
};

// The messages of one unary Attend, kept per thread: a thread serves one
// call at a time, and a cleared message keeps its elements' allocations
// for the next call (for 64 items some 250 allocations and frees fewer a
// call). Done lets go of the call's slices; a call whose messages grew
// past kKeptBytes leaves fresh ones behind.
class AttendScratch {
 public:
  static AttendScratch& ForThread() {
    thread_local AttendScratch scratch;
    return scratch;
  }
  AttendRequestWire& request() { return request_; }
  v1::AttendResponse& answer() { return answer_; }
  void Done() {
    request_.Release();
    size_t bytes = 0;
    for (const v1::AttendResult& r : answer_.results()) {
      bytes += r.output().capacity() + sizeof(float) * static_cast<size_t>(r.lse().Capacity());
    }
    if (bytes > kKeptBytes) {
      answer_ = v1::AttendResponse();
    } else {
      answer_.Clear();
    }
  }

 private:
  static constexpr size_t kKeptBytes = 1 << 20;
  AttendRequestWire request_;
  v1::AttendResponse answer_;
};

// Done when the call's answer is built (or it failed).
class ScratchDone {
 public:
  explicit ScratchDone(AttendScratch* scratch) : scratch_(scratch) {}
  ~ScratchDone() { scratch_->Done(); }
  ScratchDone(const ScratchDone&) = delete;
  ScratchDone& operator=(const ScratchDone&) = delete;

 private:
  AttendScratch* scratch_;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

const char* StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

// Every method starts with it: the caller's tenant, or the method returns
// UNAUTHENTICATED.
#define DRIFTKV_TENANT_OR_RETURN(tenant, context, timer)                            \
  absl::StatusOr<std::string> tenant##_or = CallTenant(*(context), auth_);          \
  if (!tenant##_or.ok()) return (timer).Finish(ToGrpcStatus(tenant##_or.status())); \
  const std::string& tenant = *tenant##_or

grpc::Status KvCacheService::Append(grpc::ServerContext* context, grpc::ServerReader<v1::AppendChunk>* reader,
                                    v1::AppendResponse* response) {
  RpcTimer timer(metrics_, "Append");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  v1::AppendChunk chunk;
  for (uint64_t index = 0; reader->Read(&chunk); ++index) {
    absl::Status st = handler_->Append(chunk, response, tenant);
    if (!st.ok()) {
      return timer.Finish(grpc::Status(static_cast<grpc::StatusCode>(st.code()),
                                       absl::StrCat("chunk ", index, " of the stream (", response->chunks(),
                                                    " accepted before it): ", st.message())));
    }
  }
  return timer.Finish(grpc::Status::OK);
}

KvCacheService::KvCacheService(Handler* handler, ChannelManager* channels, Metrics* metrics, const Authenticator* auth,
                               RegionTable* regions, DoorbellTable* doorbells, bool polled_attend)
    // The generated service registers its methods in the proto's order.
    : attend_method_(
          v1::AttendRequest::descriptor()->file()->FindServiceByName("KvCache")->FindMethodByName("Attend")->index()),
      handler_(handler),
      channels_(channels),
      metrics_(metrics),
      auth_(auth),
      regions_(regions),
      doorbells_(doorbells) {
  if (polled_attend) {
    MarkMethodRaw(attend_method_);
    return;
  }
  MarkMethodStreamed(attend_method_, new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                                         [this](grpc::ServerContext* context,
                                                grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
                                           return AttendToBuffer(context, stream);
                                         }));
}

grpc::Status KvCacheService::ServeAttend(const AttendRequestWire& request, const std::string& tenant,
                                         v1::AttendResponse* answer, grpc::ByteBuffer* response) {
  StagedOutputs staged;
  const absl::Status st = handler_->Attend(request.message(), answer, tenant, &staged, nullptr, request.tensors());
  if (!st.ok()) return ToGrpcStatus(st);
  *response = AttendResponseBuffer(*answer, std::move(staged));
  return grpc::Status::OK;
}

grpc::Status KvCacheService::BeginAttend(const grpc::ServerContext& context, const grpc::ByteBuffer* bytes,
                                         AttendRequestWire* request, std::string* tenant) {
  AttendPhaseClock::Begin();
  absl::StatusOr<std::string> tenant_or = CallTenant(context, auth_);
  if (!tenant_or.ok()) {
    AttendPhaseClock::Abandon();
    return ToGrpcStatus(tenant_or.status());
  }
  if (bytes == nullptr || !request->Parse(*bytes)) {
    AttendPhaseClock::Abandon();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the request is not an AttendRequest");
  }
  AttendPhaseClock::Mark(AttendPhase::kRequest);
  *tenant = *std::move(tenant_or);
  return grpc::Status::OK;
}

grpc::Status KvCacheService::AttendToBuffer(grpc::ServerContext* context,
                                            grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  RpcTimer timer(metrics_, "Attend");
  grpc::ByteBuffer bytes;
  const bool read = stream->Read(&bytes);
  AttendScratch& scratch = AttendScratch::ForThread();
  const ScratchDone done(&scratch);
  std::string tenant;
  grpc::Status st = BeginAttend(*context, read ? &bytes : nullptr, &scratch.request(), &tenant);
  if (!st.ok()) return timer.Finish(st);
  grpc::ByteBuffer response;
  st = ServeAttend(scratch.request(), tenant, &scratch.answer(), &response);
  if (!st.ok()) return timer.Finish(st);
  // Sent with the status that follows, as a unary answer is; the call
  // serialises (refs) the buffer at once.
  stream->Write(response, grpc::WriteOptions().set_last_message());
  return timer.Finish(grpc::Status::OK);
}

void KvCacheService::RequestAttend(grpc::ServerContext* context, grpc::ByteBuffer* request,
                                   grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer,
                                   grpc::ServerCompletionQueue* cq, void* tag) {
  RequestAsyncUnary(attend_method_, context, request, writer, cq, cq, tag);
}

grpc::Status KvCacheService::AttendBytes(grpc::ServerContext* context, grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) {
  RpcTimer timer(metrics_, "Attend");
  AttendScratch& scratch = AttendScratch::ForThread();
  const ScratchDone done(&scratch);
  std::string tenant;
  const grpc::Status st = BeginAttend(*context, request, &scratch.request(), &tenant);
  if (!st.ok()) return timer.Finish(st);
  return timer.Finish(ServeAttend(scratch.request(), tenant, &scratch.answer(), response));
}

grpc::Status KvCacheService::Read(grpc::ServerContext* context, const v1::ReadRequest* request,
                                  grpc::ServerWriter<v1::ReadChunk>* writer) {
  RpcTimer timer(metrics_, "Read");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Read(
      *request, [&](const v1::ReadChunk& chunk) { return !context->IsCancelled() && writer->Write(chunk); }, tenant)));
}

grpc::Status KvCacheService::Release(grpc::ServerContext* context, const v1::ReleaseRequest* request,
                                     v1::ReleaseResponse* response) {
  RpcTimer timer(metrics_, "Release");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Release(*request, response, tenant)));
}

grpc::Status KvCacheService::Length(grpc::ServerContext* context, const v1::LengthRequest* request,
                                    v1::LengthResponse* response) {
  RpcTimer timer(metrics_, "Length");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Length(*request, response, tenant)));
}

grpc::Status KvCacheService::Prefetch(grpc::ServerContext* context, const v1::PrefetchRequest* request,
                                      v1::PrefetchResponse* response) {
  RpcTimer timer(metrics_, "Prefetch");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Prefetch(*request, response, tenant)));
}

grpc::Status KvCacheService::Fork(grpc::ServerContext* context, const v1::ForkRequest* request,
                                  v1::ForkResponse* response) {
  RpcTimer timer(metrics_, "Fork");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Fork(*request, response, tenant)));
}

grpc::Status KvCacheService::Lookup(grpc::ServerContext* context, const v1::LookupRequest* request,
                                    v1::LookupResponse* response) {
  RpcTimer timer(metrics_, "Lookup");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Lookup(*request, response, tenant)));
}

grpc::Status KvCacheService::Pin(grpc::ServerContext* context, const v1::PinRequest* request,
                                 v1::PinResponse* response) {
  RpcTimer timer(metrics_, "Pin");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Pin(*request, response, tenant)));
}

grpc::Status KvCacheService::Unpin(grpc::ServerContext* context, const v1::UnpinRequest* request,
                                   v1::UnpinResponse* response) {
  RpcTimer timer(metrics_, "Unpin");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(handler_->Unpin(*request, response, tenant)));
}

grpc::Status KvCacheService::WatchPages(grpc::ServerContext* context, const v1::WatchPagesRequest* request,
                                        grpc::ServerWriter<v1::PageEventBatch>* writer) {
  RpcTimer timer(metrics_, "WatchPages");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  absl::Status st = handler_->WatchPages(
      *request, [writer](const v1::PageEventBatch& batch) { return writer->Write(batch); },
      [context] { return context->IsCancelled(); }, tenant);
  // CANCELLED when the client cancels it: that is its normal end.
  return timer.Finish(ToGrpcStatus(st));
}

grpc::Status KvCacheService::Info(grpc::ServerContext* context, const v1::InfoRequest*, v1::InfoResponse* response) {
  RpcTimer timer(metrics_, "Info");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  handler_->Info(response, tenant);
  channels_->Info(response);
  if (regions_ != nullptr) regions_->Info(response);
  return timer.Finish(grpc::Status::OK);
}

grpc::Status KvCacheService::Stats(grpc::ServerContext* context, const v1::StatsRequest*, v1::StatsResponse* response) {
  RpcTimer timer(metrics_, "Stats");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  handler_->Stats(response, tenant);
  channels_->Stats(response, tenant);
  if (regions_ != nullptr) regions_->Stats(response, tenant);
  if (auth_ != nullptr) KeepTenantScope(response);
  return timer.Finish(grpc::Status::OK);
}

grpc::Status KvCacheService::OpenChannel(grpc::ServerContext* context, const v1::OpenChannelRequest* request,
                                         v1::OpenChannelResponse* response) {
  RpcTimer timer(metrics_, "OpenChannel");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(channels_->Open(*request, response, tenant)));
}

grpc::Status KvCacheService::PushChunk(grpc::ServerContext* context, const v1::PushChunkRequest* request,
                                       v1::AppendResponse* response) {
  RpcTimer timer(metrics_, "PushChunk");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  // By reference: the keys and values are in a registered region; no
  // channel carries them.
  if (request->has_keys_ref() || request->has_values_ref()) {
    return timer.Finish(ToGrpcStatus(handler_->AppendReferenced(*request, response, tenant)));
  }
  const absl::Time deadline = absl::FromChrono(context->deadline());
  return timer.Finish(ToGrpcStatus(channels_->Push(*request, deadline, response, tenant)));
}

grpc::Status KvCacheService::CloseChannel(grpc::ServerContext* context, const v1::CloseChannelRequest* request,
                                          v1::CloseChannelResponse* response) {
  RpcTimer timer(metrics_, "CloseChannel");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  return timer.Finish(ToGrpcStatus(channels_->Close(*request, response, tenant)));
}

grpc::Status KvCacheService::RegisterRegion(grpc::ServerContext* context, const v1::RegisterRegionRequest* request,
                                            v1::RegisterRegionResponse* response) {
  RpcTimer timer(metrics_, "RegisterRegion");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  if (regions_ == nullptr) return timer.Finish(grpc::Status(grpc::UNIMPLEMENTED, "no memory regions"));
  return timer.Finish(ToGrpcStatus(regions_->Register(*request, response, tenant)));
}

grpc::Status KvCacheService::UnregisterRegion(grpc::ServerContext* context, const v1::UnregisterRegionRequest* request,
                                              v1::UnregisterRegionResponse*) {
  RpcTimer timer(metrics_, "UnregisterRegion");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  if (regions_ == nullptr) return timer.Finish(grpc::Status(grpc::UNIMPLEMENTED, "no memory regions"));
  return timer.Finish(ToGrpcStatus(regions_->Unregister(*request, tenant)));
}

grpc::Status KvCacheService::RenewRegions(grpc::ServerContext* context, const v1::RenewRegionsRequest* request,
                                          v1::RenewRegionsResponse* response) {
  RpcTimer timer(metrics_, "RenewRegions");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  if (regions_ == nullptr) return timer.Finish(grpc::Status(grpc::UNIMPLEMENTED, "no memory regions"));
  return timer.Finish(ToGrpcStatus(regions_->Renew(*request, response, tenant)));
}

namespace {

// The gRPC end of service/attend_stream.h.
class GrpcFrameStream : public FrameStream {
 public:
  GrpcFrameStream(grpc::ServerContext* context,
                  grpc::ServerReaderWriter<v1::AttendFrameResult, v1::AttendFrame>* stream)
      : context_(context), stream_(stream) {}
  bool Read(v1::AttendFrame* frame) override { return stream_->Read(frame); }
  bool Write(const v1::AttendFrameResult& result) override { return stream_->Write(result); }
  bool Cancelled() override { return context_->IsCancelled(); }

 private:
  grpc::ServerContext* const context_;
  grpc::ServerReaderWriter<v1::AttendFrameResult, v1::AttendFrame>* const stream_;
};

}  // namespace

grpc::Status KvCacheService::AttendStream(grpc::ServerContext* context,
                                          grpc::ServerReaderWriter<v1::AttendFrameResult, v1::AttendFrame>* stream) {
  RpcTimer timer(metrics_, "AttendStream");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  GrpcFrameStream frames(context, stream);
  Handler* handler = handler_;
  Metrics* metrics = metrics_;
  // Each frame is timed as an Attend (the stream's own latency is its life).
  const AttendFn attend = [handler, metrics](const v1::AttendRequest& request, v1::AttendResponse* response,
                                             const std::string& tenant) {
    RpcTimer frame_timer(metrics, "AttendStream.frame");
    absl::Status st = handler->Attend(request, response, tenant);
    frame_timer.Finish(ToGrpcStatus(st));
    return st;
  };
  return timer.Finish(ToGrpcStatus(ServeAttendStream(&frames, attend, tenant)));
}

grpc::Status KvCacheService::OpenDoorbell(grpc::ServerContext* context, const v1::OpenDoorbellRequest* request,
                                          v1::OpenDoorbellResponse* response) {
  RpcTimer timer(metrics_, "OpenDoorbell");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  if (doorbells_ == nullptr) return timer.Finish(grpc::Status(grpc::UNIMPLEMENTED, "no doorbells"));
  return timer.Finish(ToGrpcStatus(doorbells_->Open(*request, response, tenant)));
}

grpc::Status KvCacheService::CloseDoorbell(grpc::ServerContext* context, const v1::CloseDoorbellRequest* request,
                                           v1::CloseDoorbellResponse* response) {
  RpcTimer timer(metrics_, "CloseDoorbell");
  DRIFTKV_TENANT_OR_RETURN(tenant, context, timer);
  if (doorbells_ == nullptr) return timer.Finish(grpc::Status(grpc::UNIMPLEMENTED, "no doorbells"));
  return timer.Finish(ToGrpcStatus(doorbells_->Close(*request, tenant)));
}

#undef DRIFTKV_TENANT_OR_RETURN

}  // namespace driftkv
