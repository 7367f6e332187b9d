// The PEM files of the gRPC port's TLS (config tls_cert_file, tls_key_file,
// tls_client_ca_file), read and checked before gRPC is given them, at start
// and at every reload (service/credential_reloader.h): a file that fails
// here never replaces the one in force.
//
// Checks: the chain holds at least one certificate and the first (the
// server's) has not expired; the key parses and is the private key of that
// certificate; the client CA bundle, when configured, holds at least one
// certificate. Not checked: that the chain is in order or reaches a root
// the clients trust, and revocation.
#ifndef DRIFTKV_SERVICE_TLS_FILES_H_
#define DRIFTKV_SERVICE_TLS_FILES_H_

#include <string>

#include "absl/status/statusor.h"

namespace driftkv {

struct TlsFiles {
  std::string cert_chain;   // PEM, the server's certificate first
  std::string private_key;  // PEM
  std::string client_ca;    // PEM bundle; empty: no client certificates (no mTLS)
};

// Reads and checks the files (`ca_file` empty: no client CA);
// InvalidArgument naming the config field, the file and what is wrong.
absl::StatusOr<TlsFiles> ReadTlsFiles(const std::string& cert_file, const std::string& key_file,
                                      const std::string& ca_file);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TLS_FILES_H_
