#include "service/server.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpc/grpc.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/credentials.h"
#include "service/snapshot_compat.h"

namespace driftkv {
namespace {

// Counts the KvCache calls in flight: one interceptor lives as long as its
// call. Health and reflection calls are left out (a health Watch lasts as
// long as its client likes; ending it at shutdown loses nothing).
class CallCounter : public grpc::experimental::Interceptor {
 public:
  explicit CallCounter(std::atomic<int64_t>* calls) : calls_(calls) { calls_->fetch_add(1); }
  ~CallCounter() override { calls_->fetch_sub(1); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override { methods->Proceed(); }

 private:
  std::atomic<int64_t>* const calls_;
};

class CallCounterFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallCounterFactory(std::atomic<int64_t>* calls) : calls_(calls) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    if (!absl::StartsWith(info->method(), "/driftkv.v1.KvCache/")) return nullptr;
    return new CallCounter(calls_);
  }

 private:
  std::atomic<int64_t>* const calls_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DriftkvServer>> DriftkvServer::Start(const ServiceOptions& options, ServerHooks hooks) {
  std::unique_ptr<DriftkvServer> s(new DriftkvServer());
  s->metrics_ = std::make_unique<Metrics>(options.metrics_per_tenant);
  s->options_ = options;
  if (options.tokens != nullptr) {
    // Quotas too come from the tokens in force (ServiceOptions::QuotaOf).
    if (s->options_.token_store == nullptr)
      s->options_.token_store = std::make_shared<TokenStore>(options.tokens, options.tenant_defaults);
    s->token_store_ = s->options_.token_store;
    s->auth_ = std::make_shared<const Authenticator>(s->token_store_, options.tenant_from_certificate);
  }
  if (options.tls()) {
    absl::StatusOr<TlsFiles> files =
        ReadTlsFiles(options.tls_cert_file, options.tls_key_file, options.tls_client_ca_file);
    if (!files.ok()) return files.status();
    s->certificates_ = std::make_unique<CertificateSource>(*std::move(files));
  }
  // A snapshot of the earlier default containers keeps them (service/snapshot_compat.h).
  s->kept_payloads_ = KeepSnapshotPayloads(&s->options_);
  absl::StatusOr<std::unique_ptr<Handler>> handler = Handler::Create(s->options_, s->metrics_.get(), hooks.clock);
  if (!handler.ok()) return handler.status();
  s->handler_ = *std::move(handler);
  if (!options.snapshot_dir.empty()) {
    // Before the first call is taken: the restored sequences are the state
    // every call sees.
    absl::Status st = s->handler_->LoadSnapshot(options.snapshot_dir, &s->restored_);
    if (!st.ok() && !absl::IsNotFound(st)) return st;
  }
  TransportFactory* transport = hooks.transport != nullptr ? hooks.transport : DefaultTransportFactory();
  s->channels_ = std::make_unique<ChannelManager>(s->handler_.get(), transport);
  s->regions_ = std::make_unique<RegionTable>(s->handler_->options(), &s->handler_->backend(),
                                              s->metrics_->registry().get(), hooks.clock);
  if (!options.region_socket.empty()) {
    absl::StatusOr<std::unique_ptr<RegionSocket>> socket = RegionSocket::Start(
        options.region_socket, options.region_socket_mode, options.max_region_bytes, s->regions_.get());
    if (!socket.ok()) return socket.status();
    s->region_socket_ = *std::move(socket);
  }
  s->handler_->AttachRegions(s->regions_.get());
  Handler* attend_handler = s->handler_.get();
  s->doorbells_ = std::make_unique<DoorbellTable>(
      s->regions_.get(),
      [attend_handler](const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant) {
        return attend_handler->Attend(request, response, tenant);
      },
      [attend_handler](const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant,
                       AttendReuse* reuse) {
        return attend_handler->Attend(request, response, tenant, nullptr, reuse);
      });
  s->service_ =
      std::make_unique<KvCacheService>(s->handler_.get(), s->channels_.get(), s->metrics_.get(), s->auth_.get(),
                                       s->regions_.get(), s->doorbells_.get(), options.attend_poll_threads > 0);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> creds =
      MakeServerCredentials(options, s->certificates_.get(), s->auth_, s->metrics_->unauthenticated);
  if (!creds.ok()) return creds.status();
  s->reloader_ = std::make_unique<CredentialReloader>(options, s->token_store_.get(), s->certificates_.get(),
                                                      *s->metrics_->registry());

  // The standard grpc_server_* metrics and driftkv_server_info
  // (service/server_metrics.h); the interceptor goes last, so that it
  // records the status that is sent.
  s->grpc_metrics_ = std::make_unique<GrpcServerMetrics>(*s->metrics_->registry());
  hooks.interceptors.insert(hooks.interceptors.begin(), std::make_unique<CallCounterFactory>(&s->calls_in_flight_));
  hooks.interceptors.push_back(GrpcServerMetrics::InterceptorFactory(s->grpc_metrics_.get()));
  RegisterServerInfo(*s->metrics_->registry(), kServerVersion, options.backend, options.devices);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *creds, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  if (options.grpc_read_chunk_bytes != 0) {
    // Each read asks the socket for this much at least (gRPC otherwise
    // starts at 8 KiB and grows it over several reads).
    builder.AddChannelArgument("grpc.experimental.tcp_read_chunk_size",
                               static_cast<int>(options.grpc_read_chunk_bytes));
    builder.AddChannelArgument("grpc.experimental.tcp_min_read_chunk_size",
                               static_cast<int>(options.grpc_read_chunk_bytes));
  }
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> attend_queues;
  for (int i = 0; i < options.attend_poll_threads; ++i) attend_queues.push_back(builder.AddCompletionQueue());
  if (!hooks.interceptors.empty()) {
    builder.experimental().SetInterceptorCreators(std::move(hooks.interceptors));
  }
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  if (!attend_queues.empty()) {
    KvCacheService* service = s->service_.get();
    s->attend_poller_ = std::make_unique<AttendPoller>(
        std::move(attend_queues), absl::Microseconds(options.attend_poll_spin_us),
        [service](grpc::ServerContext* context, grpc::ByteBuffer* request,
                  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer>* writer, grpc::ServerCompletionQueue* cq,
                  void* tag) { service->RequestAttend(context, request, writer, cq, tag); },
        [service](grpc::ServerContext* context, grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
          return service->AttendBytes(context, request, response);
        });
    s->attend_poller_->Start();
  }
  s->server_->GetHealthCheckService()->SetServingStatus("driftkv.v1.KvCache", true);

  if (!options.health_listen.empty()) {
    // Probes that speak neither TLS nor tokens: nothing but health here
    // (and, as on every port of this process, server reflection).
    grpc::ServerBuilder health;
    health.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(), &s->health_port_);
    s->health_server_ = health.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      s->Shutdown(absl::ZeroDuration());
      return absl::UnavailableError(
          absl::StrCat("cannot serve health on ", options.health_listen, " (address in use or invalid)"));
    }
    s->health_server_->GetHealthCheckService()->SetServingStatus("driftkv.v1.KvCache", true);
  }
  s->SetServing(true);

  if (!options.metrics_listen.empty()) {
    try {
      s->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen, 2);
    } catch (const std::exception& e) {
      s->Shutdown(absl::ZeroDuration());
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", options.metrics_listen, ": ", e.what()));
    }
    s->exposer_->RegisterCollectable(s->metrics_->registry());
    const std::vector<int> ports = s->exposer_->GetListeningPorts();
    s->metrics_port_ = ports.empty() ? 0 : ports[0];
  }

  // Idle sequences expire after the TTL, and idle hot layers are demoted
  // after hot_idle_seconds, both from Handler::ExpireIdle.
  // Idle NCCL channels close after nccl_idle_seconds (ChannelManager::CloseIdle).
  const bool hot_idle = options.hot_tier() && options.hot_idle_seconds > 0.0;
  // Memory regions whose lease ran out are unregistered (RegionTable::ExpireIdle),
  // so the reaper always runs.
  const bool channels = transport != nullptr && options.nccl_max_channels > 0;
  if (options.reload_interval_seconds > 0.0 && (options.tokens != nullptr || options.tls())) {
    DriftkvServer* self = s.get();
    const absl::Duration period = absl::Seconds(options.reload_interval_seconds);
    s->watcher_ = std::thread([self, period] {
      while (!self->stop_.WaitForNotificationWithTimeout(period)) self->reloader_->ReloadChanged().IgnoreError();
    });
  }
  if (hooks.start_reaper) {
    // Checks a few times per TTL (and idle time), at most once a second.
    absl::Duration period = absl::Seconds(1);
    if (options.ttl_seconds > 0.0) period = std::min(period, absl::Seconds(options.ttl_seconds) / 4);
    if (hot_idle) period = std::min(period, absl::Seconds(options.hot_idle_seconds) / 4);
    if (channels) period = std::min(period, absl::Seconds(options.nccl_idle_seconds) / 4);
    DriftkvServer* self = s.get();
    s->reaper_ = std::thread([self, period] {
      while (!self->stop_.WaitForNotificationWithTimeout(period)) {
        self->handler_->ExpireIdle();
        self->channels_->CloseIdle();
        self->regions_->ExpireIdle();
        self->doorbells_->Sweep();
      }
    });
  }
  return s;
}

void DriftkvServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (reaper_.joinable()) reaper_.join();
  if (watcher_.joinable()) watcher_.join();
  SetServing(false);
  if (server_ != nullptr) {
    // grpc::Server::Shutdown returns when every connection is closed, not
    // when every call is done: a client that is connected but idle (and
    // does not act on the GOAWAY, as a Python channel with no call does not)
    // would hold it for the whole grace. So once the KvCache calls in
    // flight are done, the remaining connections are cut. Polled: a call
    // is counted from its first interceptor on, so one accepted an instant
    // before the shutdown but not yet dispatched may be cancelled with them.
    absl::Notification shut;
    std::thread closer([this, &shut] {
      while (!shut.WaitForNotificationWithTimeout(absl::Milliseconds(10))) {
        if (calls_in_flight_.load() == 0) grpc_server_cancel_all_calls(server_->c_server());
      }
    });
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(absl::ToInt64Milliseconds(grace)));
    shut.Notify();
    closer.join();
  }
  // After the server's Shutdown: its queues must outlive the server's use
  // of them.
  if (attend_poller_ != nullptr) attend_poller_->Stop();
  if (health_server_ != nullptr) health_server_->Shutdown(std::chrono::system_clock::now());
  exposer_.reset();
  // After the calls in flight: nothing refers to a region any more.
  if (doorbells_ != nullptr) doorbells_->CloseAll();
  region_socket_.reset();
  if (regions_ != nullptr) regions_->UnregisterAll();
}

void DriftkvServer::SetServing(bool serving) {
  // The form without a name sets every service name the health service
  // knows ("" and driftkv.v1.KvCache), so no probe sees one left behind.
  for (grpc::Server* s : {server_.get(), health_server_.get()}) {
    if (s != nullptr) s->GetHealthCheckService()->SetServingStatus(serving);
  }
}

absl::Status DriftkvServer::Drain(Handler::SnapshotSummary* summary) {
  handler_->BeginDrain();
  metrics_->draining->Set(1);
  SetServing(false);
  // Load balancers and readiness probes see NOT_SERVING and move new work
  // elsewhere; calls on existing sequences are still taken meanwhile.
  absl::SleepFor(absl::Seconds(options_.drain_notice_seconds));
  Shutdown(absl::Seconds(options_.drain_timeout_seconds));
  if (options_.snapshot_dir.empty()) return absl::OkStatus();
  return handler_->WriteSnapshot(options_.snapshot_dir, summary);
}

DriftkvServer::~DriftkvServer() {
  Shutdown(absl::ZeroDuration());
}

}  // namespace driftkv
