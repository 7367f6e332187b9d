// Server options as a config file and a tokens file make them
// (ResolveConfig), for tests of what tokens change in the handler and the
// channels: SmallOptions' model, codec and pool in text format, TLS files
// that only have to open (nothing here listens) and a tokens file.
#ifndef DRIFTKV_TESTS_TENANT_CONFIG_H_
#define DRIFTKV_TESTS_TENANT_CONFIG_H_

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "service/config.h"
#include "wire/sha256.h"

namespace driftkv {
namespace testing {

// The token of line `i` of TenantOptions' tokens file.
inline std::string TenantToken(int i) {
  return absl::StrCat("token-of-line-", i, "-0123456789abcdef");
}

// ResolveConfig of SmallOptions' settings, then `config` (text format; its
// fields override those), with a tokens file of `lines` ("alice",
// "bob max_sequences=3"): line i gets the hash of TenantToken(i). `name`
// keeps the files of one test apart from another's.
inline absl::StatusOr<ServiceOptions> TenantOptions(const std::string& name, const std::string& config,
                                                    const std::vector<std::string>& lines) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/tenant-config-", name);
  if (std::system(absl::StrCat("mkdir -p ", dir).c_str()) != 0) return absl::InternalError("mkdir " + dir);
  std::ofstream(dir + "/tls.pem") << "placeholder\n";
  std::ofstream(dir + "/tls.key") << "placeholder\n";
  {
    std::ofstream tokens(dir + "/tokens");
    for (size_t i = 0; i < lines.size(); ++i)
      tokens << Sha256Hex(TenantToken(static_cast<int>(i))) << " " << lines[i] << "\n";
  }
  const std::string text = absl::StrCat(
      "listen: \"127.0.0.1:0\" metrics_listen: \"none\"\n"
      "model { layers: 2 kv_heads: 2 head_dim: 64 }\n"
      "codec { page_tokens: 32 }\n"
      "window_tokens: 32 pool_bytes: 8388608 max_sequences: 64 read_chunk_tokens: 64\n",
      "tls_cert_file: \"", dir, "/tls.pem\" tls_key_file: \"", dir, "/tls.key\" tokens_file: \"", dir, "/tokens\"\n",
      config);
  v1::ServerConfig c;
  if (!google::protobuf::TextFormat::MergeFromString(text, &c)) {
    return absl::InvalidArgumentError(absl::StrCat("config does not parse: ", config));
  }
  return ResolveConfig(c);
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_TENANT_CONFIG_H_
