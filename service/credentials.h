// The credentials of the gRPC port from the resolved options: plaintext
// (no TLS configured), TLS (tls_cert_file + tls_key_file), mTLS (plus
// tls_client_ca_file: a client without a certificate signed by that CA has
// its handshake refused), and with tokens the TokenAuthProcessor on top.
#ifndef DRIFTKV_SERVICE_CREDENTIALS_H_
#define DRIFTKV_SERVICE_CREDENTIALS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "service/config.h"

namespace driftkv {

// InvalidArgument naming the file that cannot be read. `refused` (may be
// null) counts calls the token check refuses.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServiceOptions& options,
                                                                               prometheus::Counter* refused);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_CREDENTIALS_H_
