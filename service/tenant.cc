#include "service/tenant.h"

#include "absl/strings/str_cat.h"

namespace driftkv {

std::string TenantKey(absl::string_view tenant, absl::string_view id) {
  if (tenant.empty()) return std::string(id);
  std::string key;
  key.reserve(tenant.size() + id.size() + 2);
  key.push_back('\0');
  key.append(tenant.data(), tenant.size());
  key.push_back('\0');
  key.append(id.data(), id.size());
  return key;
}

std::string TenantOfKey(absl::string_view key) {
  if (key.empty() || key[0] != '\0') return std::string();
  const size_t end = key.find('\0', 1);
  return std::string(end == absl::string_view::npos ? key.substr(1) : key.substr(1, end - 1));
}

namespace {

// "tenant \"a\"", or, without tokens, the one anonymous tenant.
std::string Who(const std::string& name) {
  return name.empty() ? std::string("the server's one tenant (no tokens_file):")
                      : absl::StrCat("tenant \"", name, "\"");
}

constexpr absl::string_view kReleaseOrRaise = "release sequences or raise the quota";

}  // namespace

std::string HeldBytes::ToString(bool change) const {
  const std::pair<const char*, int64_t> parts[] = {
      {"cold pages", cold_pages}, {"hot pages", hot_pages}, {"windows", windows}};
  std::string out;
  for (const auto& [name, x] : parts) {
    if (change && x == 0) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", name, " ", change && x > 0 ? "+" : "", x);
  }
  return out;
}

absl::Status QuotaExhausted(const std::string& tenant, absl::string_view quota, uint64_t limit, absl::string_view holds,
                            absl::string_view needs, absl::string_view remedy) {
  return absl::ResourceExhaustedError(absl::StrCat(Who(tenant), " quota ", quota, " ", limit, ": it holds ", holds,
                                                   " and this call needs ", needs, "; ", remedy));
}

absl::Status TenantUsage::ChargePages(int64_t count) {
  if (count <= 0) return absl::OkStatus();
  const TenantQuota quota = this->quota();
  const int64_t before = pages_.fetch_add(count);
  if (quota.max_pages > 0 && static_cast<uint64_t>(before + count) > quota.max_pages) {
    pages_ -= count;
    return QuotaExhausted(name_, "max_pages", quota.max_pages, absl::StrCat(before, " pages"),
                          absl::StrCat(count, " more"), kReleaseOrRaise);
  }
  return absl::OkStatus();
}

absl::Status TenantUsage::CheckSequence() const {
  const TenantQuota quota = this->quota();
  const int64_t before = sequences_.load();
  if (quota.max_sequences > 0 && static_cast<uint64_t>(before) >= quota.max_sequences) {
    return QuotaExhausted(name_, "max_sequences", quota.max_sequences, absl::StrCat(before, " sequences"), "1 more",
                          kReleaseOrRaise);
  }
  return absl::OkStatus();
}

absl::Status TenantUsage::ChargeSequence() {
  if (absl::Status st = CheckSequence(); !st.ok()) return st;
  ++sequences_;
  return absl::OkStatus();
}

absl::Status TenantUsage::ChargeBytes(const HeldBytes& delta) {
  const int64_t total = delta.total();
  const TenantQuota quota = total > 0 ? this->quota() : TenantQuota();
  const int64_t before = bytes_.fetch_add(total);
  if (total > 0 && quota.max_bytes > 0 && static_cast<uint64_t>(before + total) > quota.max_bytes) {
    bytes_ -= total;
    return QuotaExhausted(name_, "max_bytes", quota.max_bytes,
                          absl::StrCat(before, " bytes (", held_bytes().ToString(), ")"),
                          absl::StrCat(total, " more (", delta.ToString(/*change=*/true), ")"), kReleaseOrRaise);
  }
  cold_bytes_ += delta.cold_pages;
  hot_bytes_ += delta.hot_pages;
  window_bytes_ += delta.windows;
  return absl::OkStatus();
}

void TenantUsage::AddBytes(const HeldBytes& delta) {
  bytes_ += delta.total();
  cold_bytes_ += delta.cold_pages;
  hot_bytes_ += delta.hot_pages;
  window_bytes_ += delta.windows;
}

absl::StatusOr<ByteCharge> ByteCharge::Take(TenantUsage* usage, const HeldBytes& bytes) {
  ByteCharge c;
  if (bytes.total() > 0) {
    if (absl::Status st = usage->ChargeBytes(bytes); !st.ok()) return st;
    c.applied_ = true;
  }
  c.usage_ = usage;
  c.bytes_ = bytes;
  return c;
}

ByteCharge& ByteCharge::operator=(ByteCharge&& o) noexcept {
  if (this != &o) {
    Release();
    usage_ = o.usage_;
    bytes_ = o.bytes_;
    applied_ = o.applied_;
    o.usage_ = nullptr;
  }
  return *this;
}

void ByteCharge::Keep() {
  if (usage_ != nullptr && !applied_) usage_->AddBytes(bytes_);
  usage_ = nullptr;
}

void ByteCharge::Release() {
  if (usage_ != nullptr && applied_) usage_->RefundBytes(bytes_);
  usage_ = nullptr;
}

TenantUsage* TenantLedger::Get(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<TenantUsage>& u = usage_[tenant];
  if (u == nullptr) u = std::make_unique<TenantUsage>(tenant, &quota_of_);
  return u.get();
}

void TenantLedger::ForEach(const std::function<void(const TenantUsage&)>& f) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, usage] : usage_) f(*usage);
}

const TenantUsage* TenantLedger::Find(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? nullptr : it->second.get();
}

}  // namespace driftkv
