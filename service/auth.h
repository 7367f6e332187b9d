// Bearer-token authentication of the gRPC port (docs/security.md).
//
// TokenAuthProcessor is gRPC's server-side hook for call credentials
// (grpc::AuthMetadataProcessor, installed on the port's TLS credentials):
// it runs for every call on the port, before any service sees it, so calls
// to every service there (KvCache, health, reflection) fail closed with
// UNAUTHENTICATED when the "authorization: Bearer TOKEN" metadata is
// missing or names no listed token. (A grpc::experimental server
// interceptor cannot refuse a call; this can.) An accepted call carries its
// tenant as the auth-context property kTenantProperty, which CallTenant
// reads; the token itself is consumed and never reaches a handler.
#ifndef DRIFTKV_SERVICE_AUTH_H_
#define DRIFTKV_SERVICE_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "service/tokens.h"

namespace driftkv {

constexpr char kTenantProperty[] = "driftkv.tenant";

class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::shared_ptr<const TokenTable> tokens) : tokens_(std::move(tokens)) {}
  // One hash and one lookup: cheap enough to run on gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  const std::shared_ptr<const TokenTable> tokens_;
};

// The tenant a call acts for: "" when tokens are off; with tokens on, the
// processor's property, or UNAUTHENTICATED when it is missing (a second,
// independent check: a call the processor did not vet is refused too).
absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, bool tokens_on);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_AUTH_H_
