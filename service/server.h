// A running driftkv server: handler, gRPC server (KvCache, the standard
// health service, server reflection; TLS, mTLS and tokens as configured,
// service/credentials.h, reloaded by service/credential_reloader.h), an
// optional plaintext health-only port, the Prometheus exposer, the TTL
// reaper and the memory regions. Used by
// driftkv-server's main and by the in-process tests.
#ifndef DRIFTKV_SERVICE_SERVER_H_
#define DRIFTKV_SERVICE_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/exposer.h"
#include "service/attend_poller.h"
#include "service/auth.h"
#include "service/config.h"
#include "service/credential_reloader.h"
#include "service/credentials.h"
#include "service/doorbell.h"
#include "service/grpc_service.h"
#include "service/handler.h"
#include "service/metrics.h"
#include "service/region_socket.h"
#include "service/regions.h"
#include "service/server_metrics.h"

namespace driftkv {

// Extra knobs for tests.
struct ServerHooks {
  Handler::Clock clock;  // null: absl::Now
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  bool start_reaper = true;  // the TTL thread (tests call ExpireIdle themselves)
  // The channels' transport (service/channels.h); null: the binary's
  // default (transport/transport.h DefaultTransportFactory).
  TransportFactory* transport = nullptr;
};

class DriftkvServer {
 public:
  // Binds options.listen (port 0: the OS picks) and options.metrics_listen
  // (empty: none). Fails with the reason (bad address, port in use, ...).
  static absl::StatusOr<std::unique_ptr<DriftkvServer>> Start(const ServiceOptions& options, ServerHooks hooks = {});
  ~DriftkvServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }  // 0: none
  int health_port() const { return health_port_; }    // 0: none (options.health_listen empty)
  Handler& handler() { return *handler_; }
  ChannelManager& channels() { return *channels_; }
  RegionTable& regions() { return *regions_; }
  DoorbellTable& doorbells() { return *doorbells_; }
  Metrics& metrics() { return *metrics_; }

  // Stops accepting calls, lets calls in flight finish for up to `grace`,
  // then cancels the rest; returns as soon as they are done (idle
  // connections do not hold it). Idempotent.
  void Shutdown(absl::Duration grace = absl::Seconds(5));

  // The graceful drain (docs/reliability.md): health NOT_SERVING (every
  // service name, on the main and the health port) and new
  // sequences refused (UNAVAILABLE) for options.drain_notice_seconds while
  // existing ones are served, then Shutdown(drain_timeout_seconds), then
  // the snapshot to options.snapshot_dir when set (*summary says what was
  // written). The status is the snapshot's.
  absl::Status Drain(Handler::SnapshotSummary* summary);
  // Re-reads tokens_file and the TLS files (SIGHUP): what passes the
  // checks replaces what is in force, what fails is refused and logged
  // (service/credential_reloader.h). The status is the first refusal.
  absl::Status ReloadCredentials() { return reloader_->ReloadAll(); }
  // What Start restored from options.snapshot_dir (zeros: none).
  const Handler::SnapshotSummary& restored() const { return restored_; }
  // The line of KeepSnapshotPayloads (service/snapshot_compat.h) when Start
  // kept a snapshot's payload sizes in place of the config's defaults ("":
  // it did not); handler().options() holds the sizes in force.
  const std::string& kept_payloads() const { return kept_payloads_; }
  void Wait() { server_->Wait(); }

 private:
  DriftkvServer() = default;
  // Every health service name on the main port and on the health port.
  void SetServing(bool serving);

  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<GrpcServerMetrics> grpc_metrics_;  // grpc_server_*, in metrics_'s registry
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<ChannelManager> channels_;
  // Memory regions (service/regions.h) and their socket (options.region_socket).
  std::unique_ptr<RegionTable> regions_;
  std::unique_ptr<RegionSocket> region_socket_;
  // Doorbells in host regions (service/doorbell.h); stopped before the
  // regions go.
  std::unique_ptr<DoorbellTable> doorbells_;
  std::unique_ptr<KvCacheService> service_;
  // Serves Attend when options.attend_poll_threads > 0; stopped after
  // server_'s Shutdown, and declared before server_ so that its queues
  // outlive the server.
  std::unique_ptr<AttendPoller> attend_poller_;
  // The tokens in force (null without tokens), checked by auth_; the TLS
  // files in force (null without TLS), which gRPC fetches at each
  // handshake, so it outlives server_; and what reloads them.
  std::shared_ptr<TokenStore> token_store_;
  std::shared_ptr<const Authenticator> auth_;
  std::unique_ptr<CertificateSource> certificates_;
  std::unique_ptr<CredentialReloader> reloader_;
  std::thread watcher_;  // every options.reload_interval_seconds, when > 0
  // KvCache calls in flight on server_ (outlives it: its interceptors
  // count here until the last call is gone).
  std::atomic<int64_t> calls_in_flight_{0};
  std::unique_ptr<grpc::Server> server_;
  // Plaintext grpc.health.v1 only (options.health_listen), mirroring the
  // main port's serving status.
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::thread reaper_;
  absl::Notification stop_;
  ServiceOptions options_;
  Handler::SnapshotSummary restored_;
  std::string kept_payloads_;
  int port_ = 0;
  int metrics_port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SERVER_H_
