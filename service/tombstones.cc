#include "service/tombstones.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"

namespace driftkv {

void Tombstones::Add(const std::string& key, absl::Time now) {
  if (lifetime_ <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  until_[key] = now + lifetime_;
  // Amortised: the table holds at most about twice the ids released within
  // one lifetime.
  if (until_.size() >= purge_at_) {
    PurgeLocked(now);
    purge_at_ = std::max<size_t>(1024, 2 * until_.size());
  }
}

std::vector<std::pair<std::string, absl::Duration>> Tombstones::Entries(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, absl::Duration>> out;
  for (const auto& [key, until] : until_) {
    if (until > now) out.emplace_back(key, until - now);
  }
  return out;
}

void Tombstones::Restore(const std::string& key, absl::Time now, absl::Duration left) {
  absl::MutexLock lock(&mu_);
  absl::Time& until = until_[key];
  until = std::max(until, now + left);
}

absl::Duration Tombstones::Remaining(const std::string& key, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = until_.find(key);
  if (it == until_.end() || it->second <= now) return absl::ZeroDuration();
  return it->second - now;
}

absl::Status Tombstones::CheckAppend(const std::string& key, absl::string_view id, absl::Time now) const {
  const absl::Duration left = Remaining(key, now);
  if (left <= absl::ZeroDuration()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrFormat("sequence_id \"%s\" was released; its tombstone lasts %.1f s more (tombstone_seconds %g): set "
                      "new_incarnation to start a new sequence under this id",
                      id, absl::ToDoubleSeconds(left), absl::ToDoubleSeconds(lifetime_)));
}

void Tombstones::Erase(const std::string& key) {
  absl::MutexLock lock(&mu_);
  until_.erase(key);
}

size_t Tombstones::Purge(absl::Time now) {
  absl::MutexLock lock(&mu_);
  PurgeLocked(now);
  return until_.size();
}

size_t Tombstones::CountWithPrefix(absl::string_view prefix, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, until] : until_) n += until > now && absl::StartsWith(key, prefix);
  return n;
}

void Tombstones::PurgeLocked(absl::Time now) {
  for (auto it = until_.begin(); it != until_.end();) {
    if (it->second <= now) {
      until_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace driftkv
