#include "service/auth.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "service/quoted.h"

namespace driftkv {
namespace {

// What the connection presented, for a refusal: the caller's own
// certificate, quoted (its names are the client's bytes).
std::string Presented(const PeerCertificate& peer) {
  if (peer.empty()) return "this connection presented no client certificate";
  return absl::StrCat("this connection's client certificate has subject CN ", Quoted(peer.common_name), " and ",
                      peer.alt_names.size(), " subjectAltName(s)");
}

}  // namespace

bool PeerCertificate::Names(absl::string_view name) const {
  if (name.empty()) return false;
  return common_name == name || std::find(alt_names.begin(), alt_names.end(), name) != alt_names.end();
}

PeerCertificate PeerCertificateOf(const grpc::AuthContext& context) {
  PeerCertificate peer;
  for (const grpc::string_ref& v : context.FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    peer.common_name.assign(v.data(), v.size());
  }
  for (const grpc::string_ref& v : context.FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    peer.alt_names.emplace_back(v.data(), v.size());
  }
  return peer;
}

PeerCertificate PeerCertificateOf(const grpc_auth_context* context) {
  PeerCertificate peer;
  grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(context, GRPC_X509_CN_PROPERTY_NAME);
  for (const grpc_auth_property* p; (p = grpc_auth_property_iterator_next(&it)) != nullptr;) {
    peer.common_name.assign(p->value, p->value_length);
  }
  it = grpc_auth_context_find_properties_by_name(context, GRPC_X509_SAN_PROPERTY_NAME);
  for (const grpc_auth_property* p; (p = grpc_auth_property_iterator_next(&it)) != nullptr;) {
    peer.alt_names.emplace_back(p->value, p->value_length);
  }
  return peer;
}

absl::StatusOr<std::string> Authenticator::TenantOf(absl::string_view authorization,
                                                    const PeerCertificate& peer) const {
  constexpr absl::string_view kBearer = "bearer ";
  if (authorization.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError("the authorization metadata is not \"Bearer TOKEN\"");
  }
  // Held for the check: a reload meanwhile does not free the grant.
  const std::shared_ptr<const TokenTable> table = tokens_->Current();
  const TokenGrant* grant = table->Find(absl::StripAsciiWhitespace(authorization.substr(kBearer.size())));
  // Says nothing about the token (no echo, no hint how close it was).
  if (grant == nullptr) return absl::UnauthenticatedError("the bearer token is not valid for this server");
  if (!grant->certificates.empty() && std::none_of(grant->certificates.begin(), grant->certificates.end(),
                                                   [&peer](const std::string& name) { return peer.Names(name); })) {
    return absl::UnauthenticatedError(
        absl::StrCat("the bearer token is bound to client certificates (cert= in the server's tokens_file) and ",
                     Presented(peer), ", none of them a name the token is bound to"));
  }
  if (tenant_from_certificate_ && peer.common_name != grant->tenant) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this server takes the tenant from the client certificate (tenant_from_certificate): the certificate's "
        "subject CN must be the bearer token's tenant, and ",
        Presented(peer)));
  }
  return grant->tenant;
}

absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, const Authenticator* auth) {
  if (auth == nullptr) return std::string();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end() || md.count("authorization") != 1) {
    return absl::UnauthenticatedError("the call carries no (or more than one) authorization metadata");
  }
  const std::shared_ptr<const grpc::AuthContext> peer = context.auth_context();
  return auth->TenantOf(absl::string_view(it->second.data(), it->second.size()),
                        peer != nullptr ? PeerCertificateOf(*peer) : PeerCertificate());
}

}  // namespace driftkv
