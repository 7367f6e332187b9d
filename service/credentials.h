// The credentials of the gRPC port from the resolved options: plaintext
// (no TLS configured), TLS (tls_cert_file + tls_key_file), mTLS (plus
// tls_client_ca_file: a client without a certificate signed by that CA has
// its handshake refused), and with tokens the token gate on top
// (service/auth.h).
//
// TLS goes through gRPC's SSL server credentials with a certificate
// config fetcher (grpc/grpc_security.h): gRPC asks CertificateSource at
// every new connection's handshake whether the files changed, and takes
// the new ones when a reload put them there. Connections open before a
// reload keep the session they negotiated; calls on them still meet the
// token check in force. Debian 12's gRPC (1.51) offers no C++ wrapper for
// the fetcher, hence a small grpc::ServerCredentials of our own.
#ifndef DRIFTKV_SERVICE_CREDENTIALS_H_
#define DRIFTKV_SERVICE_CREDENTIALS_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpc/grpc_security.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "service/auth.h"
#include "service/config.h"
#include "service/tls_files.h"

namespace driftkv {

// The port's certificate, key and client CA in force. One listening port
// may fetch from it (it remembers which version it handed out last).
class CertificateSource {
 public:
  explicit CertificateSource(TlsFiles files) : files_(std::move(files)) {}

  // The next handshake takes `files`. REQUIRES: checked by ReadTlsFiles.
  void Replace(TlsFiles files);

  // grpc_ssl_server_certificate_config_callback; `self` is the source.
  static grpc_ssl_certificate_config_reload_status Fetch(void* self, grpc_ssl_server_certificate_config** config);

 private:
  absl::Mutex mu_;
  TlsFiles files_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t fetched_ ABSL_GUARDED_BY(mu_) = 0;  // the version gRPC holds
};

// `certificates`: required with TLS, and must outlive the gRPC server the
// credentials are added to (gRPC calls it at each handshake). `auth`: null
// without tokens; else every call on the port must pass it. `refused` (may
// be null) counts the calls the gate refuses.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServiceOptions& options, CertificateSource* certificates, std::shared_ptr<const Authenticator> auth,
    prometheus::Counter* refused);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CREDENTIALS_H_
