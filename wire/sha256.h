// SHA-256 as lowercase hex (OpenSSL's libcrypto): the bearer-token hashes
// of the tokens file (service/tokens.h), computed by the server for each
// presented token and by `driftkv token-hash` for the file's lines.
#ifndef DRIFTKV_WIRE_SHA256_H_
#define DRIFTKV_WIRE_SHA256_H_

#include <string>

#include "absl/strings/string_view.h"

namespace driftkv {

// SHA-256 of `bytes` as 64 lowercase hex digits.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_SHA256_H_
