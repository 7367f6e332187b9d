// Tombstones of released sequences: for tombstone_seconds after a Release
// an Append to the same (tenant-qualified) key is refused unless it asks
// for a new incarnation, so that a late retry of an Append cannot bring
// back a sequence its owner released. Expiry by TTL leaves no tombstone
// (the owner did not say it was done). A leaf lock: nothing is acquired
// while mu_ is held.
#ifndef DRIFTKV_SERVICE_TOMBSTONES_H_
#define DRIFTKV_SERVICE_TOMBSTONES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace driftkv {

class Tombstones {
 public:
  // `lifetime` zero: Add does nothing.
  explicit Tombstones(absl::Duration lifetime) : lifetime_(lifetime) {}
  absl::Duration lifetime() const { return lifetime_; }

  // Marks `key` released at `now`.
  void Add(const std::string& key, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // How long `key` stays tombstoned after `now`; zero when it is not.
  absl::Duration Remaining(const std::string& key, absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // FAILED_PRECONDITION naming `id` (the request's sequence_id) and the
  // time left while `key` is tombstoned; OK otherwise.
  absl::Status CheckAppend(const std::string& key, absl::string_view id, absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  void Erase(const std::string& key) ABSL_LOCKS_EXCLUDED(mu_);
  // Every live entry with its time left after `now` (for a snapshot).
  std::vector<std::pair<std::string, absl::Duration>> Entries(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);
  // Tombstones `key` until now + `left` (a restored entry; any lifetime).
  void Restore(const std::string& key, absl::Time now, absl::Duration left) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops expired entries; returns how many are left.
  size_t Purge(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // How many keys starting with `prefix` are tombstoned after `now`
  // (a scan of every entry: for Stats, not for a hot path).
  size_t CountWithPrefix(absl::string_view prefix, absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void PurgeLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration lifetime_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, absl::Time> until_ ABSL_GUARDED_BY(mu_);
  size_t purge_at_ ABSL_GUARDED_BY(mu_) = 1024;  // size that triggers the next purge in Add
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_TOMBSTONES_H_
