// The tokens in force: a TokenTable that a reload of tokens_file replaces
// as a whole (service/credential_reloader.h), with the tenants' default
// quotas resolved for it (service/tenant_quotas.h: with tokens, the
// shares of max_sequences depend on the file's tenants). Readers take the
// current table and keep it for as long as they use it, so a call that
// started under the old table finishes under it; the next call sees the
// new one.
#ifndef DRIFTKV_SERVICE_TOKEN_STORE_H_
#define DRIFTKV_SERVICE_TOKEN_STORE_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "service/tokens.h"

namespace driftkv {

class TokenStore {
 public:
  // REQUIRES: table is not null.
  TokenStore(std::shared_ptr<const TokenTable> table, const TenantQuota& defaults)
      : table_(std::move(table)), defaults_(defaults) {}

  // Never null.
  std::shared_ptr<const TokenTable> Current() const {
    absl::MutexLock lock(&mu_);
    return table_;
  }
  // The quotas of `tenant` under the table in force.
  TenantQuota QuotaOf(const std::string& tenant) const {
    absl::MutexLock lock(&mu_);
    return table_->QuotaOf(tenant, defaults_);
  }
  // REQUIRES: table is not null.
  void Replace(std::shared_ptr<const TokenTable> table, const TenantQuota& defaults) {
    absl::MutexLock lock(&mu_);
    table_ = std::move(table);
    defaults_ = defaults;
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const TokenTable> table_ ABSL_GUARDED_BY(mu_);
  TenantQuota defaults_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TOKEN_STORE_H_
