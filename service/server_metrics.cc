#include "service/server_metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "prometheus/gauge.h"
#include "proto/driftkv.pb.h"

namespace driftkv {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// go-grpc-prometheus' default buckets (seconds), so that stock dashboards'
// quantiles read the same resolution as on Go servers.
const prometheus::Histogram::BucketBoundaries& Buckets() {
  static const prometheus::Histogram::BucketBoundaries b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                            0.5,   1.0,  2.5,   5.0,  10.0};
  return b;
}

const char* TypeName(ServerRpcInfo::Type type) {
  switch (type) {
    case ServerRpcInfo::Type::UNARY: return "unary";
    case ServerRpcInfo::Type::CLIENT_STREAMING: return "client_stream";
    case ServerRpcInfo::Type::SERVER_STREAMING: return "server_stream";
    case ServerRpcInfo::Type::BIDI_STREAMING: return "bidi_stream";
  }
  return "unary";
}

ServerRpcInfo::Type TypeOf(const google::protobuf::MethodDescriptor& m) {
  if (m.client_streaming() && m.server_streaming()) return ServerRpcInfo::Type::BIDI_STREAMING;
  if (m.client_streaming()) return ServerRpcInfo::Type::CLIENT_STREAMING;
  if (m.server_streaming()) return ServerRpcInfo::Type::SERVER_STREAMING;
  return ServerRpcInfo::Type::UNARY;
}

// One call: started at construction, handled at PRE_SEND_STATUS.
class MetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MetricsInterceptor(const GrpcServerMetrics::Method* m) : m_(m), start_(absl::Now()) {
    m_->started->Increment();
  }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // A failed read (end of the client's stream) is a POST_RECV_MESSAGE
    // without a message.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() != nullptr) {
      m_->msg_received->Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      m_->msg_sent->Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) && !handled_) {
      handled_ = true;
      const int code = static_cast<int>(methods->GetSendStatus().error_code());
      m_->handled[code >= 0 && code < 17 ? code : 2]->Increment();  // 2: UNKNOWN
      m_->seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const GrpcServerMetrics::Method* m_;
  absl::Time start_;
  bool handled_ = false;
};

class MetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(GrpcServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(ServerRpcInfo* info) override {
    const char* method = info->method();
    return new MetricsInterceptor(metrics_->Get(method != nullptr ? method : "", info->type()));
  }

 private:
  GrpcServerMetrics* metrics_;
};

}  // namespace

void RegisterServerInfo(prometheus::Registry& registry, const std::string& version, const std::string& backend,
                        const std::vector<int>& devices) {
  std::string device = backend;
  if (backend == "cuda") device = absl::StrCat("cuda:", devices.empty() ? "0" : absl::StrJoin(devices, ","));
  prometheus::BuildGauge()
      .Name("driftkv_server_info")
      .Help("1, labelled with the server's version, backend and device")
      .Register(registry)
      .Add({{"version", version}, {"backend", backend}, {"device", device}})
      .Set(1);
}

const char* GrpcCodeGoName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "Canceled";
    case grpc::UNKNOWN: return "Unknown";
    case grpc::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::NOT_FOUND: return "NotFound";
    case grpc::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::ABORTED: return "Aborted";
    case grpc::OUT_OF_RANGE: return "OutOfRange";
    case grpc::UNIMPLEMENTED: return "Unimplemented";
    case grpc::INTERNAL: return "Internal";
    case grpc::UNAVAILABLE: return "Unavailable";
    case grpc::DATA_LOSS: return "DataLoss";
    case grpc::UNAUTHENTICATED: return "Unauthenticated";
    default: return "Unknown";
  }
}

GrpcServerMetrics::GrpcServerMetrics(prometheus::Registry& registry)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("Total number of RPCs started on the server.")
                   .Register(registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("Total number of RPCs completed on the server, regardless of success or failure.")
                   .Register(registry)),
      msg_received_(prometheus::BuildCounter()
                        .Name("grpc_server_msg_received_total")
                        .Help("Total number of RPC stream messages received on the server.")
                        .Register(registry)),
      msg_sent_(prometheus::BuildCounter()
                    .Name("grpc_server_msg_sent_total")
                    .Help("Total number of gRPC stream messages sent by the server.")
                    .Register(registry)),
      seconds_(prometheus::BuildHistogram()
                   .Name("grpc_server_handling_seconds")
                   .Help("Histogram of response latency (seconds) of gRPC that had been application-level "
                         "handled by the server.")
                   .Register(registry)) {
  const google::protobuf::ServiceDescriptor* service =
      v1::AppendChunk::descriptor()->file()->FindServiceByName("KvCache");
  absl::MutexLock lock(&mu_);
  for (int i = 0; service != nullptr && i < service->method_count(); ++i) {
    const google::protobuf::MethodDescriptor& m = *service->method(i);
    AddLocked("/" + service->full_name() + "/" + m.name(), TypeOf(m));
  }
}

const GrpcServerMetrics::Method* GrpcServerMetrics::Get(const std::string& full_method, ServerRpcInfo::Type type) {
  absl::MutexLock lock(&mu_);
  auto it = methods_.find(full_method);
  if (it != methods_.end()) return it->second.get();
  return AddLocked(full_method, type);
}

const GrpcServerMetrics::Method* GrpcServerMetrics::AddLocked(const std::string& full_method,
                                                              ServerRpcInfo::Type type) {
  // "/driftkv.v1.KvCache/Append" -> service "driftkv.v1.KvCache", method "Append".
  std::string service = "unknown", method = full_method;
  const size_t slash = full_method.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    service = full_method.substr(full_method[0] == '/' ? 1 : 0, slash - (full_method[0] == '/' ? 1 : 0));
    method = full_method.substr(slash + 1);
  }
  const std::map<std::string, std::string> labels = {
      {"grpc_type", TypeName(type)}, {"grpc_service", service}, {"grpc_method", method}};
  auto m = std::make_unique<Method>();
  m->started = &started_.Add(labels);
  for (int code = 0; code < 17; ++code) {
    std::map<std::string, std::string> with_code = labels;
    with_code["grpc_code"] = GrpcCodeGoName(static_cast<grpc::StatusCode>(code));
    m->handled[code] = &handled_.Add(with_code);
  }
  m->msg_received = &msg_received_.Add(labels);
  m->msg_sent = &msg_sent_.Add(labels);
  m->seconds = &seconds_.Add(labels, Buckets());
  const Method* out = m.get();
  methods_[full_method] = std::move(m);
  return out;
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> GrpcServerMetrics::InterceptorFactory(
    GrpcServerMetrics* metrics) {
  return std::make_unique<MetricsInterceptorFactory>(metrics);
}

}  // namespace driftkv
