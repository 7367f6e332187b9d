// What a repeated Attend request keeps from one call to the next. A
// doorbell's prepared request names the same sequences, layers and region
// offsets step after step: its items' resolved tensors and its sequences
// (with their lock order) can be kept instead of being looked up and
// checked again on every call. Each use checks what was kept (every
// region still registered to the tenant, its lease extended; no sequence
// released) and takes the full path when something changed; only requests
// without decode steps and without inline tensors are kept.
//
// Opaque here: Handler::Attend fills and reads it (handler_attend.cc).
// Used by one caller at a time; the holder's request must not change
// between uses except for what the handler does not keep.
#ifndef DRIFTKV_SERVICE_ATTEND_REUSE_H_
#define DRIFTKV_SERVICE_ATTEND_REUSE_H_

#include <memory>

namespace driftkv {

class AttendReuse {
 public:
  // Forgets what was kept (the next use takes the full path).
  void Clear() { state_.reset(); }
  bool empty() const { return state_ == nullptr; }

 private:
  friend class Handler;
  std::shared_ptr<void> state_;  // Handler's AttendBatch::Kept
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_REUSE_H_
