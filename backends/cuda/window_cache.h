// The CUDA backend's device cache of bf16 windows.
//
// The bf16 windows live in host memory (the handler's);
// uploading every item's whole window with every launch dominated a
// batched launch (docs/bench_service.md). So windows are kept in a device
// arena of fixed slots of kMaxWindow tokens, keyed by AttendJob::window_id:
// a launch uploads only the tokens a slot lacks (usually the one new
// token; all of them after the window moved past a page, or on a miss).
// Slots are recycled least recently used. If a launch cannot place every
// windowed item (no id, or more items than slots), it stages all its
// windows as before.
#ifndef DRIFTKV_BACKENDS_CUDA_WINDOW_CACHE_H_
#define DRIFTKV_BACKENDS_CUDA_WINDOW_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/device_memory.h"

namespace driftkv {
namespace cuda_backend {

class WindowCache {
 public:
  // Tokens [from, from + count) of item `item`'s window go to slot `slot`.
  struct Upload {
    int item, slot;
    int64_t from;  // first token of the item's window to upload
    int64_t count;
  };

  // Device memory for as many slots of kMaxWindow tokens of n values (keys
  // and values) as `bytes` holds, at most 65536; none: the cache is off.
  absl::Status Init(size_t bytes, int n);

  // Plans slots for every item with a window; false when some item cannot
  // be cached. A slot taken from another window is forgotten at once (that
  // window is no longer found, even later in this launch); the slots'
  // new contents are recorded on success, after every item is placed.
  bool Plan(absl::Span<const AttendJob> jobs, std::vector<int>* slot_of, std::vector<Upload>* uploads);

  // Whether every item with a window still finds it whole in slot
  // slot_of[i] (a plan an earlier launch made: launch_plans.h); if so the
  // slots count as used by this launch. Nothing changes when not.
  bool Keep(absl::Span<const AttendJob> jobs, absl::Span<const int> slot_of);

  // After a failed upload the slots' contents are unknown: forget them all.
  void Invalidate();

  bool enabled() const { return !slots_.empty(); }
  size_t slot_bytes() const { return slot_bytes_; }
  uint8_t* keys_dev() const { return keys_.get<uint8_t>(); }  // [slots][kMaxWindow][n] bf16
  uint8_t* values_dev() const { return values_.get<uint8_t>(); }

 private:
  struct Slot {
    uint64_t id = 0;     // 0: free
    int64_t first = 0;   // absolute index of the slot's token 0
    int64_t tokens = 0;  // valid tokens in the slot
    uint64_t last_use = 0;
  };

  size_t slot_bytes_ = 0;
  Scratch keys_, values_;
  std::vector<Slot> slots_;
  absl::flat_hash_map<uint64_t, int> index_;  // window_id -> slot
  // Slots never used since Init or Invalidate, the lowest last. A slot a
  // failed Plan took from here is empty and found by the scan instead.
  std::vector<int> free_;
  void ResetFree();
  uint64_t launch_ = 0;
  // Plan's scratch, kept between calls for its capacity.
  std::vector<std::pair<int, Slot>> commits_;
  absl::flat_hash_map<uint64_t, size_t> taken_;
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_WINDOW_CACHE_H_
