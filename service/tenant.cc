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

}  // namespace

absl::Status TenantUsage::ChargePages(int64_t count) {
  if (count <= 0) return absl::OkStatus();
  const int64_t before = pages_.fetch_add(count);
  if (quota_.max_pages > 0 && static_cast<uint64_t>(before + count) > quota_.max_pages) {
    pages_ -= count;
    return absl::ResourceExhaustedError(absl::StrCat(Who(name_), " quota max_pages ", quota_.max_pages, ": it holds ",
                                                     before, " pages and this call needs ", count,
                                                     " more; release sequences or raise the quota"));
  }
  return absl::OkStatus();
}

absl::Status TenantUsage::ChargeSequence() {
  const int64_t before = sequences_.load();
  if (quota_.max_sequences > 0 && static_cast<uint64_t>(before) >= quota_.max_sequences) {
    return absl::ResourceExhaustedError(absl::StrCat(Who(name_), " quota max_sequences ", quota_.max_sequences,
                                                     " reached; release sequences or "
                                                     "raise the quota"));
  }
  ++sequences_;
  return absl::OkStatus();
}

TenantUsage* TenantLedger::Get(const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<TenantUsage>& u = usage_[tenant];
  if (u == nullptr) u = std::make_unique<TenantUsage>(tenant, quota_of_(tenant));
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
