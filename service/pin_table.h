// Pins: prefixes kept resident for a lease (docs/prefix_cache.md, "Pins").
//
// HOLDING. A pin holds one reference to each page it pins (taken by
// PrefixIndex::Take for the caller and handed over), so the prefix index's
// eviction, which frees only pages the index alone holds, never frees a
// pinned page. The pin also holds its tenant's charge for the pages:
// `pages` against max_pages and `pages * page_stride` bytes of cold pages
// against max_bytes. Removing a pin (Unpin, expiry, replacement, the
// table's destruction) gives back both.
//
// LEASES. A pin lives until its expiry time; Expire (the server's reaper,
// through Handler::ExpireIdle, about once a second) removes the pins past
// it. A pin past its time and not yet removed is not live: Unpin and Get
// say NOT_FOUND, and Put replaces it as a new pin.
//
// Locks: mu_ is a leaf but for the pool's lock (Free) taken under it.
#ifndef DRIFTKV_SERVICE_PIN_TABLE_H_
#define DRIFTKV_SERVICE_PIN_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "backends/page_pool.h"
#include "service/tenant.h"

namespace driftkv {

class PinTable {
 public:
  // What Put did.
  struct Placed {
    bool replaced = false;       // a live pin of the key was replaced
    int64_t replaced_pages = 0;  // its pages
  };

  // `pool`: the cold pool, which must outlive the table.
  explicit PinTable(PagePool& pool) : pool_(pool) {}
  ~PinTable();  // gives back every reference and charge
  PinTable(const PinTable&) = delete;
  PinTable& operator=(const PinTable&) = delete;

  // Enters pin `key` (TenantKey(tenant, pin_id)) holding `pages`, taking
  // over the caller's one reference to each, charged to `usage` as said
  // above, until `expires`. A live pin of the same key is replaced: its
  // charge is given back before the new one is taken, its references
  // after the new pin holds its own. On a quota's refusal
  // (RESOURCE_EXHAUSTED naming it) the references are given back and the
  // old pin, if any, stays as it was. `pin_id` names the pin in messages.
  absl::Status Put(const std::string& key, const std::string& pin_id, TenantUsage* usage, std::vector<PageId> pages,
                   int64_t page_stride, absl::Time now, absl::Time expires, Placed* placed) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes live pin `key`; returns its pages, or NOT_FOUND naming `pin_id`.
  absl::StatusOr<int64_t> Remove(const std::string& key, const std::string& pin_id, absl::Time now)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Removes every pin whose lease ended at or before `now`; returns how many.
  int Expire(absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t pins() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t pages() const ABSL_LOCKS_EXCLUDED(mu_);  // references held, all pins

  // Every pin live at `now`, by key (a snapshot's warm restart). The pages
  // are the pin's; the caller takes no reference.
  struct Entry {
    std::string key, pin_id;
    std::vector<PageId> pages;
    absl::Time expires;
  };
  std::vector<Entry> Entries(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pin {
    std::string pin_id;
    std::vector<PageId> pages;
    TenantUsage* usage = nullptr;
    HeldBytes bytes;
    absl::Time expires;
  };
  // Gives back the pin's references and charge.
  void Drop(Pin& pin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  PagePool& pool_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Pin> pins_ ABSL_GUARDED_BY(mu_);
  int64_t pages_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PIN_TABLE_H_
