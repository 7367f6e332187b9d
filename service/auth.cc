#include "service/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace driftkv {

grpc::Status TokenAuthProcessor::Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                                         OutputMetadata* consumed_auth_metadata, OutputMetadata*) {
  auto it = auth_metadata.find("authorization");
  if (it == auth_metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing \"authorization: Bearer TOKEN\" metadata (this server requires a token)");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "bearer ";
  if (value.size() <= kBearer.size() || !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the authorization metadata is not \"Bearer TOKEN\"");
  }
  const std::optional<std::string> tenant = tokens_->TenantOf(absl::StripAsciiWhitespace(value.substr(kBearer.size())));
  if (!tenant.has_value()) {
    // Says nothing about the token (no echo, no hint how close it was).
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the bearer token is not valid for this server");
  }
  context->AddProperty(kTenantProperty, *tenant);
  consumed_auth_metadata->insert(std::make_pair(std::string("authorization"), std::string(value)));
  return grpc::Status::OK;
}

absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, bool tokens_on) {
  if (!tokens_on) return std::string();
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> values = auth->FindPropertyValues(kTenantProperty);
    if (values.size() == 1 && !values[0].empty()) return std::string(values[0].data(), values[0].size());
  }
  return absl::UnauthenticatedError("the call carries no authenticated tenant");
}

}  // namespace driftkv
