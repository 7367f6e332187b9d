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
#include <optional>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "wire/tenant_name.h"  // CheckTenantName

namespace driftkv {

std::string TenantKey(absl::string_view tenant, absl::string_view id);
// The tenant of a table key ("" for a key without one); for code that
// rebuilds the table from its keys (a snapshot loader).
std::string TenantOfKey(absl::string_view key);

struct TenantQuota {
  uint64_t max_pages = 0;          // pages of both tiers; 0: unlimited
  uint64_t max_sequences = 0;      // 0: unlimited
  uint64_t max_bytes = 0;          // HeldBytes::total(); 0: unlimited
  uint64_t max_nccl_channels = 0;  // open NCCL channels (service/channels.h); 0: unlimited
};

// The config's tenant_max_* as written: unset ones are absent (with
// tokens, service/tenant_quotas.h gives them defaults).
struct TenantQuotaSettings {
  std::optional<uint64_t> max_pages, max_sequences, max_bytes, max_nccl_channels;
};

// Memory a tenant holds, in bytes, by what holds it; as a change, signed.
// Pages count at their own pool's page size (cold D-Quant pages and hot
// level pages differ); a window token is its bf16 keys and values,
// WindowBytesPerToken. Whatever holds memory for a tenant in future (pins,
// which do not exist yet) gets its own field here and charges it through
// ByteCharge like the rest.
struct HeldBytes {
  int64_t cold_pages = 0;
  int64_t hot_pages = 0;
  int64_t windows = 0;

  int64_t total() const { return cold_pages + hot_pages + windows; }
  HeldBytes operator-() const { return {-cold_pages, -hot_pages, -windows}; }
  HeldBytes& operator+=(const HeldBytes& o) {
    cold_pages += o.cold_pages;
    hot_pages += o.hot_pages;
    windows += o.windows;
    return *this;
  }
  // "cold pages 8192, hot pages 0, windows 4096"; as a `change`, only
  // the nonzero ones, signed: "cold pages +8192, windows -12288".
  std::string ToString(bool change = false) const;
};

// Bytes of one window token of `n` values per token (kv_heads * head_dim):
// n keys and n values, 2 bytes each (bf16).
inline int64_t WindowBytesPerToken(int n) {
  return 4 * static_cast<int64_t>(n);
}

// RESOURCE_EXHAUSTED in the one form every quota uses: `tenant "a" quota
// max_pages 8: it holds 7 pages and this call needs 2 more; REMEDY`
// (`holds` "7 pages", `needs` "2 more").
// `tenant` "" is the one anonymous tenant of a server without tokens.
absl::Status QuotaExhausted(const std::string& tenant, absl::string_view quota, uint64_t limit, absl::string_view holds,
                            absl::string_view needs, absl::string_view remedy);

// What one tenant holds. Counters are atomic: charged before pages are
// reserved or windows grow (so concurrent appends cannot overshoot a
// quota) and refunded when they are freed or a reservation is given back.
class TenantUsage {
 public:
  using QuotaFn = std::function<TenantQuota(const std::string& tenant)>;
  // Quotas fixed for the usage's life, or looked up at every charge in
  // `quota_of` (which must outlive the usage), so that a reload of the
  // tokens file applies to tenants already seen.
  TenantUsage(std::string name, TenantQuota quota) : name_(std::move(name)), fixed_(quota) {}
  TenantUsage(std::string name, const QuotaFn* quota_of) : name_(std::move(name)), quota_of_(quota_of) {}
  const std::string& name() const { return name_; }
  TenantQuota quota() const { return quota_of_ != nullptr ? (*quota_of_)(name_) : fixed_; }
  int64_t pages() const { return pages_.load(); }
  int64_t sequences() const { return sequences_.load(); }
  int64_t bytes() const { return bytes_.load(); }
  HeldBytes held_bytes() const { return {cold_bytes_.load(), hot_bytes_.load(), window_bytes_.load()}; }
  // Sequences of the tenant freed by Release and by idle expiry (Stats).
  uint64_t released() const { return released_.load(); }
  uint64_t expired() const { return expired_.load(); }
  void CountRelease() { ++released_; }
  void CountExpiry() { ++expired_; }
  // Sequences of the tenant restored from the snapshot at start (Info).
  uint64_t restored() const { return restored_.load(); }
  void CountRestore() { ++restored_; }

  // RESOURCE_EXHAUSTED naming the quota ("tenant \"a\" quota max_pages 8:
  // it holds 7 pages and this call needs 2 more") when `count` more pages would
  // exceed it; nothing is charged then.
  absl::Status ChargePages(int64_t count);
  void RefundPages(int64_t count) { pages_ -= count; }
  // The same for one new sequence. REQUIRES: the caller serialises
  // creations (SequenceTable's lock).
  absl::Status ChargeSequence();
  // ChargeSequence's error, without charging: whether one more sequence
  // would fit now (a request's early check; the charge decides).
  absl::Status CheckSequence() const;
  void RefundSequence() { --sequences_; }
  // Adds `delta`; when its total is positive and would take the tenant
  // over max_bytes, RESOURCE_EXHAUSTED naming what it holds and what the
  // call needs, and nothing is charged. Callers go through ByteCharge.
  absl::Status ChargeBytes(const HeldBytes& delta);
  // Adds `delta` without the quota's check: refunds, and changes the
  // server makes on its own that must not fail (a demotion).
  void AddBytes(const HeldBytes& delta);
  void RefundBytes(const HeldBytes& delta) { AddBytes(-delta); }

 private:
  const std::string name_;
  const TenantQuota fixed_;
  const QuotaFn* const quota_of_ = nullptr;
  std::atomic<int64_t> pages_{0};
  std::atomic<int64_t> sequences_{0};
  std::atomic<int64_t> bytes_{0};  // the total the quota checks
  std::atomic<int64_t> cold_bytes_{0}, hot_bytes_{0}, window_bytes_{0};
  std::atomic<uint64_t> released_{0};
  std::atomic<uint64_t> expired_{0};
  std::atomic<uint64_t> restored_{0};
};

// Bytes charged to a tenant for memory about to be taken. Take it before
// taking the memory, Keep() once the memory is taken and held (its holder
// refunds the bytes when it frees it); destroyed without Keep(), nothing
// stays charged. A change that shrinks what the tenant holds (total <= 0:
// a page that replaces window tokens) is applied only by Keep(), so a call
// that fails never leaves the tenant charged less than it holds. Memory
// held for as long as some object lives (a future pin) can keep the
// ByteCharge itself and let its destructor refund it: call Keep() only to
// hand the bytes over.
class ByteCharge {
 public:
  ByteCharge() = default;
  // Charges `bytes` to `usage` (not null) when their total is positive;
  // the quota's error otherwise.
  static absl::StatusOr<ByteCharge> Take(TenantUsage* usage, const HeldBytes& bytes);
  ByteCharge(ByteCharge&& o) noexcept { *this = std::move(o); }
  ByteCharge& operator=(ByteCharge&& o) noexcept;
  ByteCharge(const ByteCharge&) = delete;
  ByteCharge& operator=(const ByteCharge&) = delete;
  ~ByteCharge() { Release(); }
  void Keep();

 private:
  void Release();
  TenantUsage* usage_ = nullptr;  // null: nothing outstanding
  HeldBytes bytes_;
  bool applied_ = false;  // bytes_ already added to usage_
};

// Every tenant's usage, created on first use with its quota. Entries live
// as long as the ledger (sequences keep raw pointers to them).
class TenantLedger {
 public:
  using QuotaFn = TenantUsage::QuotaFn;
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
