#include "service/credentials.h"

#include "service/auth.h"
#include "wire/text_file.h"

namespace driftkv {

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServiceOptions& o,
                                                                               prometheus::Counter* refused) {
  if (!o.tls()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadNonEmptyFile(o.tls_cert_file, "tls_cert_file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadNonEmptyFile(o.tls_key_file, "tls_key_file");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (o.client_certificates()) {
    absl::StatusOr<std::string> ca = ReadNonEmptyFile(o.tls_client_ca_file, "tls_client_ca_file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (o.tokens != nullptr) creds->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(o.tokens, refused));
  return creds;
}

}  // namespace driftkv
