#include "service/transport.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "service/auth.h"

namespace driftkv {

absl::StatusOr<std::string> ReadPemFile(const std::string& path, const char* what) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " \"", path, "\" cannot be read or is empty"));
  }
  return text.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServiceOptions& o,
                                                                                prometheus::Counter* refused) {
  if (!o.tls()) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadPemFile(o.tls_cert_file, "tls_cert_file");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPemFile(o.tls_key_file, "tls_key_file");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (o.client_certificates()) {
    absl::StatusOr<std::string> ca = ReadPemFile(o.tls_client_ca_file, "tls_client_ca_file");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::SslServerCredentials(ssl);
  if (o.tokens != nullptr) creds->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(o.tokens, refused));
  return creds;
}

}  // namespace driftkv
