#include "service/credentials.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "grpc/grpc.h"
#include "grpc/slice.h"

namespace driftkv {
namespace {

// The token gate: gRPC's auth metadata processor, run inline (one hash and
// one lookup) for every call on the port before any service sees it.
struct Gate {
  std::shared_ptr<const Authenticator> auth;
  prometheus::Counter* refused;

  static void Process(void* state, grpc_auth_context* context, const grpc_metadata* md, size_t num_md,
                      grpc_process_auth_metadata_done_cb done, void* user_data) {
    const Gate* gate = static_cast<const Gate*>(state);
    const grpc_metadata* authorization = nullptr;
    for (size_t i = 0; i < num_md; ++i) {
      const grpc_slice& key = md[i].key;
      const absl::string_view name(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(key)), GRPC_SLICE_LENGTH(key));
      if (name == "authorization") {
        authorization = &md[i];
        break;
      }
    }
    std::string error;
    if (authorization == nullptr) {
      error = "missing \"authorization: Bearer TOKEN\" metadata (this server requires a token)";
    } else {
      const grpc_slice& v = authorization->value;
      absl::StatusOr<std::string> tenant = gate->auth->TenantOf(
          absl::string_view(reinterpret_cast<const char*>(GRPC_SLICE_START_PTR(v)), GRPC_SLICE_LENGTH(v)),
          PeerCertificateOf(context));
      if (!tenant.ok()) error = std::string(tenant.status().message());
    }
    if (error.empty()) {
      done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_OK, nullptr);
      return;
    }
    if (gate->refused != nullptr) gate->refused->Increment();
    done(user_data, nullptr, 0, nullptr, 0, GRPC_STATUS_UNAUTHENTICATED, error.c_str());
  }
  static void Destroy(void* state) { delete static_cast<Gate*>(state); }
};

// gRPC's SSL server credentials made with a certificate config fetcher.
class FetchingServerCredentials final : public grpc::ServerCredentials {
 public:
  explicit FetchingServerCredentials(grpc_server_credentials* creds) : creds_(creds) {}
  ~FetchingServerCredentials() override { grpc_server_credentials_release(creds_); }

  // The gate is installed by MakeServerCredentials, on the C credentials;
  // a C++ processor is not bridged here.
  void SetAuthMetadataProcessor(const std::shared_ptr<grpc::AuthMetadataProcessor>&) override {
    std::fprintf(stderr, "driftkv-server: SetAuthMetadataProcessor is not supported on these credentials\n");
    std::abort();
  }

 private:
  // Called by grpc::Server, which takes its own reference to creds_.
  int AddPortToServer(const std::string& addr, grpc_server* server) override {
    return grpc_server_add_http2_port(server, addr.c_str(), creds_);
  }

  grpc_server_credentials* const creds_;
};

}  // namespace

void CertificateSource::Replace(TlsFiles files) {
  absl::MutexLock lock(&mu_);
  files_ = std::move(files);
  ++version_;
}

grpc_ssl_certificate_config_reload_status CertificateSource::Fetch(void* self,
                                                                   grpc_ssl_server_certificate_config** config) {
  CertificateSource* s = static_cast<CertificateSource*>(self);
  absl::MutexLock lock(&s->mu_);
  if (s->fetched_ == s->version_) return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
  const grpc_ssl_pem_key_cert_pair pair = {s->files_.private_key.c_str(), s->files_.cert_chain.c_str()};
  // gRPC 1.51 asserts that a fetched config has root certificates, even
  // when the port requests no client certificate; there the server's own
  // chain stands in, never used to verify anything.
  const std::string& roots = s->files_.client_ca.empty() ? s->files_.cert_chain : s->files_.client_ca;
  // gRPC copies the strings and destroys the config when done with it.
  *config = grpc_ssl_server_certificate_config_create(roots.c_str(), &pair, 1);
  s->fetched_ = s->version_;
  return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServiceOptions& o, CertificateSource* certificates, std::shared_ptr<const Authenticator> auth,
    prometheus::Counter* refused) {
  if (!o.tls()) return grpc::InsecureServerCredentials();
  if (certificates == nullptr) return absl::InternalError("TLS credentials need a CertificateSource");
  // With a client CA the port requires and verifies a client certificate,
  // so a client without one fails in the handshake and never reaches the gate.
  const grpc_ssl_client_certificate_request_type request =
      o.client_certificates() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  grpc_server_credentials* creds =
      grpc_ssl_server_credentials_create_with_options(grpc_ssl_server_credentials_create_options_using_config_fetcher(
          request, &CertificateSource::Fetch, certificates));
  if (creds == nullptr) return absl::InternalError("gRPC refused the TLS server credentials");
  if (auth != nullptr) {
    grpc_server_credentials_set_auth_metadata_processor(
        creds, {&Gate::Process, &Gate::Destroy, new Gate{std::move(auth), refused}});
  }
  return std::shared_ptr<grpc::ServerCredentials>(new FetchingServerCredentials(creds));
}

}  // namespace driftkv
