#include "service/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace driftkv {

absl::StatusOr<std::string> TenantOfAuthorization(absl::string_view value, const TokenTable& tokens) {
  constexpr absl::string_view kBearer = "bearer ";
  if (value.size() <= kBearer.size() || !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError("the authorization metadata is not \"Bearer TOKEN\"");
  }
  std::optional<std::string> tenant = tokens.TenantOf(absl::StripAsciiWhitespace(value.substr(kBearer.size())));
  // Says nothing about the token (no echo, no hint how close it was).
  if (!tenant.has_value()) return absl::UnauthenticatedError("the bearer token is not valid for this server");
  return *std::move(tenant);
}

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext*, OutputMetadata*,
                                         OutputMetadata*) {
  auto it = auth_metadata.find("authorization");
  if (it == auth_metadata.end()) {
    if (refused_ != nullptr) refused_->Increment();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing \"authorization: Bearer TOKEN\" metadata (this server requires a token)");
  }
  absl::StatusOr<std::string> tenant =
      TenantOfAuthorization(absl::string_view(it->second.data(), it->second.size()), *tokens_);
  if (!tenant.ok()) {
    if (refused_ != nullptr) refused_->Increment();
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(tenant.status().message()));
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, const TokenTable* tokens) {
  if (tokens == nullptr) return std::string();
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end() || md.count("authorization") != 1) {
    return absl::UnauthenticatedError("the call carries no (or more than one) authorization metadata");
  }
  return TenantOfAuthorization(absl::string_view(it->second.data(), it->second.size()), *tokens);
}

}  // namespace driftkv
