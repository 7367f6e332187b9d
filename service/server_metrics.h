// Metrics the server assembly adds to the handler's (service/metrics.h):
// driftkv_server_info, and the standard gRPC server metrics beside driftkv's
// own (docs/metrics.md, "Standard gRPC server metrics"): the names, labels and code spellings of
// go-grpc-prometheus / java-grpc-prometheus, so that stock gRPC dashboards
// and alerts work on driftkv-server unchanged.
//
//   grpc_server_started_total{grpc_type, grpc_service, grpc_method}
//   grpc_server_handled_total{grpc_type, grpc_service, grpc_method, grpc_code}
//   grpc_server_msg_received_total{grpc_type, grpc_service, grpc_method}
//   grpc_server_msg_sent_total{grpc_type, grpc_service, grpc_method}
//   grpc_server_handling_seconds{grpc_type, grpc_service, grpc_method}  (histogram)
//
// grpc_type is unary | client_stream | server_stream | bidi_stream;
// grpc_code is the Go spelling of the status code (OK, InvalidArgument,
// ResourceExhausted, DataLoss, ...). Every method of driftkv.v1.KvCache gets
// all its series at zero when the server starts (every code of
// grpc_server_handled_total too, as go-grpc-prometheus' InitializeMetrics
// does), so rates and "any DataLoss" alerts have a series before the first
// error; other services (health, reflection) get theirs on their first call.
//
// Recorded by a server interceptor: a call's clock starts when gRPC creates
// the interceptor (the call has been matched to a method) and stops at
// PRE_SEND_STATUS, where the code is the one sent to the client. Install it
// after any interceptor that rewrites statuses, so that it records what goes
// on the wire. Calls gRPC refuses before a method is matched are not seen.
#ifndef DRIFTKV_SERVICE_SERVER_METRICS_H_
#define DRIFTKV_SERVICE_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace driftkv {

// driftkv_server_info{version, backend, device} 1: which build, backend and
// device serve behind an instance (the dashboard's device variable). device
// is "cpu" on the CPU backend and "cuda:N" on the CUDA backend, N the
// config's devices (--devices; "cuda:0,1" for several, "cuda:0" for none).
void RegisterServerInfo(prometheus::Registry& registry, const std::string& version, const std::string& backend,
                        const std::vector<int>& devices);

// The Go spelling of a status code ("OK", "InvalidArgument", ...).
const char* GrpcCodeGoName(grpc::StatusCode code);

class GrpcServerMetrics {
 public:
  // One method's series.
  struct Method {
    prometheus::Counter* started;
    prometheus::Counter* handled[17];  // by grpc::StatusCode 0..16
    prometheus::Counter* msg_received;
    prometheus::Counter* msg_sent;
    prometheus::Histogram* seconds;
  };

  // Registers the families in `registry` (which must outlive this object)
  // and the series of every method of driftkv.v1.KvCache.
  explicit GrpcServerMetrics(prometheus::Registry& registry);

  // The series of `full_method` ("/package.Service/Method"), created on
  // first use. Never null; the pointer stays valid for this object's life.
  const Method* Get(const std::string& full_method, grpc::experimental::ServerRpcInfo::Type type);

  // A factory for ServerBuilder::experimental().SetInterceptorCreators.
  // `metrics` must outlive the server.
  static std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory(
      GrpcServerMetrics* metrics);

 private:
  const Method* AddLocked(const std::string& full_method, grpc::experimental::ServerRpcInfo::Type type)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Counter>& msg_received_;
  prometheus::Family<prometheus::Counter>& msg_sent_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Method>> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SERVER_METRICS_H_
