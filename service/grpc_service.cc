#include "service/grpc_service.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace driftkv {
namespace {

// Times one RPC and records it when it finishes.
class RpcTimer {
 public:
  RpcTimer(Metrics* metrics, const char* method)
      : metrics_(metrics), method_(method), start_(absl::Now()) {}
  grpc::Status Finish(const grpc::Status& status) {
    metrics_->RecordRpc(method_, StatusCodeName(status.error_code()),
                        absl::ToDoubleSeconds(absl::Now() - start_));
    return status;
  }

 private:
  Metrics* metrics_;
  const char* method_;
  absl::Time start_;
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

grpc::Status KvCacheService::Append(grpc::ServerContext*, grpc::ServerReader<v1::AppendChunk>* reader,
                                    v1::AppendResponse* response) {
  RpcTimer timer(metrics_, "Append");
  v1::AppendChunk chunk;
  for (uint64_t index = 0; reader->Read(&chunk); ++index) {
    absl::Status st = handler_->Append(chunk, response);
    if (!st.ok()) {
      return timer.Finish(grpc::Status(
          static_cast<grpc::StatusCode>(st.code()),
          absl::StrCat("chunk ", index, " of the stream (", response->chunks(),
                       " accepted before it): ", st.message())));
    }
  }
  return timer.Finish(grpc::Status::OK);
}

grpc::Status KvCacheService::Attend(grpc::ServerContext*, const v1::AttendRequest* request,
                                    v1::AttendResponse* response) {
  RpcTimer timer(metrics_, "Attend");
  return timer.Finish(ToGrpcStatus(handler_->Attend(*request, response)));
}

grpc::Status KvCacheService::Read(grpc::ServerContext* context, const v1::ReadRequest* request,
                                  grpc::ServerWriter<v1::ReadChunk>* writer) {
  RpcTimer timer(metrics_, "Read");
  return timer.Finish(ToGrpcStatus(handler_->Read(*request, [&](const v1::ReadChunk& chunk) {
    return !context->IsCancelled() && writer->Write(chunk);
  })));
}

grpc::Status KvCacheService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                     v1::ReleaseResponse* response) {
  RpcTimer timer(metrics_, "Release");
  return timer.Finish(ToGrpcStatus(handler_->Release(*request, response)));
}

grpc::Status KvCacheService::Length(grpc::ServerContext*, const v1::LengthRequest* request,
                                    v1::LengthResponse* response) {
  RpcTimer timer(metrics_, "Length");
  return timer.Finish(ToGrpcStatus(handler_->Length(*request, response)));
}

grpc::Status KvCacheService::Info(grpc::ServerContext*, const v1::InfoRequest*,
                                  v1::InfoResponse* response) {
  RpcTimer timer(metrics_, "Info");
  handler_->Info(response);
  channels_->Info(response);
  return timer.Finish(grpc::Status::OK);
}

grpc::Status KvCacheService::Stats(grpc::ServerContext*, const v1::StatsRequest*,
                                   v1::StatsResponse* response) {
  RpcTimer timer(metrics_, "Stats");
  handler_->Stats(response);
  channels_->Stats(response);
  return timer.Finish(grpc::Status::OK);
}

grpc::Status KvCacheService::OpenChannel(grpc::ServerContext*, const v1::OpenChannelRequest* request,
                                         v1::OpenChannelResponse* response) {
  RpcTimer timer(metrics_, "OpenChannel");
  return timer.Finish(ToGrpcStatus(channels_->Open(*request, response)));
}

grpc::Status KvCacheService::PushChunk(grpc::ServerContext* context, const v1::PushChunkRequest* request,
                                       v1::AppendResponse* response) {
  RpcTimer timer(metrics_, "PushChunk");
  const absl::Time deadline = absl::FromChrono(context->deadline());
  return timer.Finish(ToGrpcStatus(channels_->Push(*request, deadline, response)));
}

grpc::Status KvCacheService::CloseChannel(grpc::ServerContext*, const v1::CloseChannelRequest* request,
                                          v1::CloseChannelResponse* response) {
  RpcTimer timer(metrics_, "CloseChannel");
  return timer.Finish(ToGrpcStatus(channels_->Close(*request, response)));
}

}  // namespace driftkv
