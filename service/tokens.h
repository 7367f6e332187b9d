// Bearer tokens and their tenants, read from config tokens_file. The file
// never holds a token, only its SHA-256 (64 lowercase hex digits), so a
// leaked file grants nothing. One line per token:
//   SHA256HEX TENANT [max_pages=N] [max_sequences=N] [max_bytes=N]
//                    [max_nccl_channels=N] [cert=NAME ...]
// '#' starts a comment; blank lines are ignored. Several tokens may name
// one tenant (rotation: add the new token, move clients, drop the old);
// their quotas, where given, must agree. cert=NAME (repeatable) binds the
// token to client certificates: a call with it must come over a connection
// whose client certificate has NAME as its subject CN or as one of its
// subjectAltNames (service/auth.h; needs mTLS). Make a line with
//   driftkv token-hash --tenant NAME < token_file
// or: printf %s "$TOKEN" | sha256sum | cut -d' ' -f1
#ifndef DRIFTKV_SERVICE_TOKENS_H_
#define DRIFTKV_SERVICE_TOKENS_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "service/tenant.h"
#include "wire/sha256.h"  // Sha256Hex, the hash of the file's lines

namespace driftkv {

// What one listed token grants.
struct TokenGrant {
  std::string tenant;
  // The client certificate names (subject CN or subjectAltName) the token
  // is bound to, any one of which the connection must prove; empty: none.
  std::vector<std::string> certificates;
};

class TokenTable {
 public:
  // Parses the file's text; InvalidArgument names the line.
  static absl::StatusOr<TokenTable> Parse(absl::string_view text, const std::string& path);
  static absl::StatusOr<TokenTable> ReadFile(const std::string& path);

  // The grant of a presented token; null when it is not listed. Valid as
  // long as the table.
  const TokenGrant* Find(absl::string_view token) const;
  // The tenant of a presented token; nullopt when it is not listed.
  std::optional<std::string> TenantOf(absl::string_view token) const;
  // Whether some line has a cert=NAME (such a file needs mTLS).
  bool binds_certificates() const { return binds_certificates_; }
  // The tenant's quotas: its lines' max_*=, `defaults` (config
  // tenant_max_*) for those its lines leave out.
  TenantQuota QuotaOf(const std::string& tenant, const TenantQuota& defaults) const;
  size_t size() const { return grant_of_hash_.size(); }

  // What a tenant's lines set (unset: the config's default applies).
  struct Limits {
    std::optional<uint64_t> max_pages, max_sequences, max_bytes, max_nccl_channels;
  };
  // Every tenant the file names, sorted, with what its lines set.
  std::vector<std::pair<std::string, Limits>> Tenants() const;

 private:
  absl::flat_hash_map<std::string, TokenGrant> grant_of_hash_;
  absl::flat_hash_map<std::string, Limits> limits_;
  bool binds_certificates_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TOKENS_H_
