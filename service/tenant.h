// Tenants: who a call acts for (from its bearer token, service/tokens.h),
// how their sequences are kept apart, and what each may hold.
//
// A sequence's key in the handler's table qualifies its id with its
// tenant: TenantKey("", id) = id (no tokens configured: one anonymous
// tenant, keys as they always were), TenantKey(t, id) = "\0" t "\0" id.
// Tenant names have no NUL byte, so the key of a named tenant decodes
// uniquely; anything that serialises the table (keys) carries tenants.
// Another tenant's id is simply a different key: NOT_FOUND, never
// PERMISSION_DENIED (which would confirm that the id exists).
#ifndef DRIFTKV_SERVICE_TENANT_H_
#define DRIFTKV_SERVICE_TENANT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "wire/tenant_name.h"  // CheckTenantName

namespace driftkv {

std::string TenantKey(absl::string_view tenant, absl::string_view id);
// The tenant of a table key ("" for a key without one); for code that
// rebuilds the table from its keys (a snapshot loader).
std::string TenantOfKey(absl::string_view key);

struct TenantQuota {
  uint64_t max_pages = 0;      // pages of both tiers; 0: unlimited
  uint64_t max_sequences = 0;  // 0: unlimited
};

// What one tenant holds. Counters are atomic: charged before pages are
// reserved (so concurrent appends cannot overshoot the quota) and refunded
// when they are freed or a reservation is given back.
class TenantUsage {
 public:
  TenantUsage(std::string name, TenantQuota quota) : name_(std::move(name)), quota_(quota) {}
  const std::string& name() const { return name_; }
  const TenantQuota& quota() const { return quota_; }
  int64_t pages() const { return pages_.load(); }
  int64_t sequences() const { return sequences_.load(); }
  // Sequences of the tenant freed by Release and by idle expiry (Stats).
  uint64_t released() const { return released_.load(); }
  uint64_t expired() const { return expired_.load(); }
  void CountRelease() { ++released_; }
  void CountExpiry() { ++expired_; }
  // Sequences of the tenant restored from the snapshot at start (Info).
  uint64_t restored() const { return restored_.load(); }
  void CountRestore() { ++restored_; }

  // RESOURCE_EXHAUSTED naming the quota ("tenant \"a\" quota max_pages 8:
  // it holds 7 pages and this call needs 2") when `count` more pages would
  // exceed it; nothing is charged then.
  absl::Status ChargePages(int64_t count);
  void RefundPages(int64_t count) { pages_ -= count; }
  // The same for one new sequence. REQUIRES: the caller serialises
  // creations (the handler's table_mu_).
  absl::Status ChargeSequence();
  void RefundSequence() { --sequences_; }

 private:
  const std::string name_;
  const TenantQuota quota_;
  std::atomic<int64_t> pages_{0};
  std::atomic<int64_t> sequences_{0};
  std::atomic<uint64_t> released_{0};
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> restored_{0};
};

// Every tenant's usage, created on first use with its quota. Entries live
// as long as the ledger (sequences keep raw pointers to them).
class TenantLedger {
 public:
  using QuotaFn = std::function<TenantQuota(const std::string& tenant)>;
  explicit TenantLedger(QuotaFn quota_of) : quota_of_(std::move(quota_of)) {}
  TenantUsage* Get(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Null when the tenant holds nothing and never did.
  const TenantUsage* Find(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  // Calls f on every tenant's usage (under the ledger's lock: f must not
  // call back into the ledger).
  void ForEach(const std::function<void(const TenantUsage&)>& f) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const QuotaFn quota_of_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<TenantUsage>> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TENANT_H_
