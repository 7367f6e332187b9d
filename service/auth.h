// Bearer-token authentication of the gRPC port (docs/security.md).
//
// TokenAuthProcessor is gRPC's server-side hook for call credentials
// (grpc::AuthMetadataProcessor, installed on the port's TLS credentials):
// it runs for every call on the port, before any service sees it, so calls
// to every service there (KvCache, health, reflection) fail closed with
// UNAUTHENTICATED when the "authorization: Bearer TOKEN" metadata is
// missing or names no listed token. (A grpc::experimental server
// interceptor cannot refuse a call; this can.) It only gates: gRPC hands
// it the connection's auth context, shared by every call on the
// connection, so a per-call identity cannot be kept there. The tenant is
// taken again from each call's own metadata by CallTenant.
#ifndef DRIFTKV_SERVICE_AUTH_H_
#define DRIFTKV_SERVICE_AUTH_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "prometheus/counter.h"
#include "service/tokens.h"

namespace driftkv {

// The tenant of an "authorization" metadata value ("Bearer TOKEN", the
// scheme case-insensitive); UNAUTHENTICATED without saying why a token
// failed beyond "not valid".
absl::StatusOr<std::string> TenantOfAuthorization(absl::string_view value, const TokenTable& tokens);

class TokenAuthProcessor : public grpc::AuthMetadataProcessor {
 public:
  // `refused` (may be null) counts the calls refused.
  TokenAuthProcessor(std::shared_ptr<const TokenTable> tokens, prometheus::Counter* refused)
      : tokens_(std::move(tokens)), refused_(refused) {}
  // One hash and one lookup: cheap enough to run on gRPC's own thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context,
                       OutputMetadata* consumed_auth_metadata, OutputMetadata* response_metadata) override;

 private:
  const std::shared_ptr<const TokenTable> tokens_;
  prometheus::Counter* const refused_;
};

// The tenant a call acts for: "" when `tokens` is null (tokens off); else
// from the call's "authorization" metadata, UNAUTHENTICATED when missing
// or not listed (checked again here, so a call the processor did not see
// is refused too).
absl::StatusOr<std::string> CallTenant(const grpc::ServerContext& context, const TokenTable* tokens);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_AUTH_H_
