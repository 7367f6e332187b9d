// Launch plans the CUDA backend keeps on the device between Attend calls.
//
// A decode loop attends the same sequences' same layers through the same
// client tensors call after call (a prepared request on a doorbell). What
// such a launch uploads before its kernels run, its plan (each item's page
// list, token counts, window slot and layer, the gather's list of client
// queries and the answers' targets), is then the bytes the previous call
// of it uploaded. The backend keeps up to `capacity` plans in device memory;
// LaunchPlans remembers what each was made from and finds the one a launch
// can reuse, so that no page table is built or uploaded for it.
//
// Reuse is decided by comparison, never by trust: every field of every job
// that goes into a plan (its layer, page count, window id, first token and
// token count, client tensor addresses and dtypes, query check), and every
// page id, must equal what the plan was made from. A page sealed, a window
// grown, a layer promoted or a tensor moved gives another plan. Whether
// the window slots still hold their windows is the window cache's to say
// (WindowCache::Keep). Host only: no CUDA here.
#ifndef DRIFTKV_BACKENDS_CUDA_LAUNCH_PLANS_H_
#define DRIFTKV_BACKENDS_CUDA_LAUNCH_PLANS_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "backends/backend.h"

namespace driftkv {
namespace cuda_backend {

class LaunchPlans {
 public:
  explicit LaunchPlans(int capacity) : entries_(capacity) {}

  int capacity() const { return static_cast<int>(entries_.size()); }

  // The entry (0 .. capacity - 1) holding the plan of exactly these jobs,
  // or -1. A found entry becomes the most recently used.
  int Find(absl::Span<const AttendJob> jobs);

  // Takes an entry for the plan of these jobs (the one already keyed by
  // them, else the least recently used) and records them in it; the caller
  // then writes the plan into its device memory. -1 when capacity is 0.
  int Record(absl::Span<const AttendJob> jobs);

  // Forgets every plan (their device bytes may not be the plans: a failed
  // launch).
  void Clear();

  // Launches that found their plan, and plans recorded (for tests and
  // benchmarks).
  uint64_t hits() const { return hits_; }
  uint64_t records() const { return records_; }

 private:
  // What of a job goes into a plan, all 8-byte fields (no padding: the
  // struct's bytes are hashed and compared).
  struct Item {
    uint64_t window_id;
    int64_t window_first, window_tokens;
    uint64_t query_dev, out_dev, lse_dev;
    int64_t layer, pages, q_heads;
    int64_t flags;  // query_dtype | out_dtype << 8 | hot << 16 | check_query << 17
  };
  static_assert(sizeof(Item) == 10 * 8, "Item has no padding");
  struct Entry {
    bool used = false;
    uint64_t key = 0;
    uint64_t last_use = 0;
    std::vector<Item> items;
    std::vector<PageId> pages;  // every item's, back to back
  };

  // Describes `jobs` into items_ and returns their key.
  uint64_t Describe(absl::Span<const AttendJob> jobs);
  bool PagesEqual(absl::Span<const AttendJob> jobs, const Entry& e) const;

  std::vector<Entry> entries_;
  absl::flat_hash_map<uint64_t, int> index_;  // key -> entry
  std::vector<Item> items_;                   // Describe's, kept for capacity
  uint64_t clock_ = 0;
  uint64_t hits_ = 0, records_ = 0;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_LAUNCH_PLANS_H_
