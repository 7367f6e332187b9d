// Who a call is: its bearer token and, optionally, its client certificate
// (docs/security.md).
//
// Authenticator is the one place credentials are checked. The token
// ("authorization: Bearer TOKEN" metadata) names a tenant in the tokens in
// force (service/token_store.h, which a reload replaces). With a binding,
// the connection's client certificate must prove it too: a token line's
// cert=NAME asks for a certificate with NAME as subject CN or as a
// subjectAltName; tenant_from_certificate asks that the certificate's
// subject CN be the token's tenant. A token alone, stolen without its
// certificate's private key, then opens nothing.
//
// Two callers, both failing closed with UNAUTHENTICATED: the port's gate
// (service/credentials.cc, gRPC's auth metadata processor), which runs for
// every call to every service of the port (KvCache, health, reflection)
// before any of them sees it; and CallTenant, which every KvCache method
// calls to learn its tenant from the call's own metadata (the gate sees
// the connection's auth context, shared by every call on it, so a per-call
// tenant cannot be kept there).
//
// Refusals say which rule failed and what the connection presented, never
// the token, the token's tenant or the names it is bound to: a caller that
// fails the binding has not proven to be that tenant.
#ifndef DRIFTKV_SERVICE_AUTH_H_
#define DRIFTKV_SERVICE_AUTH_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpc/grpc_security.h"
#include "grpcpp/grpcpp.h"
#include "service/token_store.h"

namespace driftkv {

// The names a verified client certificate carries, as gRPC's TLS reports
// them in the connection's auth context ("x509_common_name",
// "x509_subject_alternative_name"). Empty without a client certificate.
struct PeerCertificate {
  std::string common_name;
  std::vector<std::string> alt_names;

  bool empty() const { return common_name.empty() && alt_names.empty(); }
  // NAME is the subject CN or one of the subjectAltNames.
  bool Names(absl::string_view name) const;
};

PeerCertificate PeerCertificateOf(const grpc::AuthContext& context);
PeerCertificate PeerCertificateOf(const grpc_auth_context* context);

class Authenticator {
 public:
  // `tokens` must not be null.
  Authenticator(std::shared_ptr<const TokenStore> tokens, bool tenant_from_certificate)
      : tokens_(std::move(tokens)), tenant_from_certificate_(tenant_from_certificate) {}

  // The tenant of an "authorization" metadata value ("Bearer TOKEN", the
  // scheme case-insensitive) presented over a connection whose client
  // certificate is `peer`; UNAUTHENTICATED when the token is not listed or
  // a binding does not hold.
  absl::StatusOr<std::string> TenantOf(absl::string_view authorization, const PeerCertificate& peer) const;

 private:
  const std::shared_ptr<const TokenStore> tokens_;
  const bool tenant_from_certificate_;
};

// The tenant a call acts for: "" when `auth` is null (tokens off); else
// from the call's one "authorization" metadata and its connection's client
// certificate, UNAUTHENTICATED when missing, repeated or refused.
absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, const Authenticator* auth);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_AUTH_H_
