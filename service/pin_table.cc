#include "service/pin_table.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/quoted.h"

namespace driftkv {

PinTable::~PinTable() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, pin] : pins_) Drop(pin);
  pins_.clear();
}

void PinTable::Drop(Pin& pin) {
  pool_.Free(pin.pages);
  pin.usage->RefundPages(static_cast<int64_t>(pin.pages.size()));
  pin.usage->RefundBytes(pin.bytes);
  pages_ -= static_cast<int64_t>(pin.pages.size());
  pin.pages.clear();
}

absl::Status PinTable::Put(const std::string& key, const std::string& pin_id, TenantUsage* usage,
                           std::vector<PageId> pages, int64_t page_stride, absl::Time now, absl::Time expires,
                           Placed* placed) {
  *placed = Placed{};
  Pin pin;
  pin.pin_id = pin_id;
  pin.usage = usage;
  pin.bytes.cold_pages = static_cast<int64_t>(pages.size()) * page_stride;
  pin.expires = expires;
  absl::MutexLock lock(&mu_);
  auto it = pins_.find(key);
  Pin* old = (it != pins_.end() && it->second.expires > now) ? &it->second : nullptr;
  // The old pin's charge goes first, so that renewing a pin at the quota
  // does not count it twice; it is put back on a refusal.
  if (old != nullptr) {
    old->usage->RefundPages(static_cast<int64_t>(old->pages.size()));
    old->usage->RefundBytes(old->bytes);
  }
  absl::Status st = usage->ChargePages(static_cast<int64_t>(pages.size()));
  if (st.ok()) {
    st = usage->ChargeBytes(pin.bytes);
    if (!st.ok()) usage->RefundPages(static_cast<int64_t>(pages.size()));
  }
  if (!st.ok()) {
    if (old != nullptr) {
      old->usage->RefundPages(-static_cast<int64_t>(old->pages.size()));
      old->usage->AddBytes(old->bytes);
    }
    pool_.Free(pages);
    return absl::ResourceExhaustedError(absl::StrCat("pin_id ", Quoted(pin_id), ": ", st.message()));
  }
  pin.pages = std::move(pages);
  pages_ += static_cast<int64_t>(pin.pages.size());
  if (it != pins_.end()) {
    if (old != nullptr) {
      placed->replaced = true;
      placed->replaced_pages = static_cast<int64_t>(old->pages.size());
      // Charge already given back above: only the references remain.
      pool_.Free(old->pages);
      pages_ -= static_cast<int64_t>(old->pages.size());
    } else {
      Drop(it->second);  // expired, not yet swept
    }
    it->second = std::move(pin);
  } else {
    pins_.emplace(key, std::move(pin));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PinTable::Remove(const std::string& key, const std::string& pin_id, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = pins_.find(key);
  if (it == pins_.end() || it->second.expires <= now) {
    return absl::NotFoundError(absl::StrCat("pin_id ", Quoted(pin_id),
                                            " is not a live pin (never made, removed, "
                                            "or its lease ended)"));
  }
  const int64_t n = static_cast<int64_t>(it->second.pages.size());
  Drop(it->second);
  pins_.erase(it);
  return n;
}

int PinTable::Expire(absl::Time now) {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto it = pins_.begin(); it != pins_.end();) {
    if (it->second.expires <= now) {
      Drop(it->second);
      pins_.erase(it++);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

int64_t PinTable::pins() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(pins_.size());
}

int64_t PinTable::pages() const {
  absl::MutexLock lock(&mu_);
  return pages_;
}

std::vector<PinTable::Entry> PinTable::Entries(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (const auto& [key, pin] : pins_) {
    if (pin.expires > now) out.push_back(Entry{key, pin.pin_id, pin.pages, pin.expires});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) { return a.key < b.key; });
  return out;
}

}  // namespace driftkv
