#include "service/attend_stream.h"

#include <deque>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace driftkv {
namespace {

struct Queued {
  v1::AttendFrame frame;
  absl::Time arrived;
};

// What the reader hands the server thread.
struct Inbox {
  absl::Mutex mu;
  std::deque<Queued> frames ABSL_GUARDED_BY(mu);
  absl::flat_hash_set<uint64_t> cancelled ABSL_GUARDED_BY(mu);  // frame ids, while queued
  bool closed ABSL_GUARDED_BY(mu) = false;                      // no more frames
};

}  // namespace

absl::Status ServeAttendStream(FrameStream* stream, const AttendFn& attend, const std::string& tenant,
                               const std::function<absl::Time()>& clock) {
  auto now = [&clock] { return clock ? clock() : absl::Now(); };
  Inbox inbox;
  std::thread reader([&] {
    v1::AttendFrame frame;
    while (true) {
      {
        absl::MutexLock lock(&inbox.mu);
        inbox.mu.Await(absl::Condition(
            +[](Inbox* in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(in->mu) {
              return static_cast<int>(in->frames.size()) < kMaxQueuedFrames || in->closed;
            },
            &inbox));
        if (inbox.closed) return;
      }
      if (!stream->Read(&frame)) break;
      const absl::Time arrived = now();
      absl::MutexLock lock(&inbox.mu);
      if (frame.cancel()) {
        for (const Queued& q : inbox.frames) {
          if (q.frame.frame_id() == frame.frame_id()) inbox.cancelled.insert(frame.frame_id());
        }
        continue;
      }
      inbox.frames.push_back(Queued{std::move(frame), arrived});
      frame = v1::AttendFrame();
    }
    absl::MutexLock lock(&inbox.mu);
    inbox.closed = true;
  });
  absl::Status st;
  v1::AttendFrameResult result;
  while (true) {
    Queued q;
    bool cancelled = false;
    {
      absl::MutexLock lock(&inbox.mu);
      inbox.mu.Await(absl::Condition(
          +[](Inbox* in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(in->mu) { return !in->frames.empty() || in->closed; }, &inbox));
      if (inbox.frames.empty()) break;  // closed and drained
      q = std::move(inbox.frames.front());
      inbox.frames.pop_front();
      cancelled = inbox.cancelled.erase(q.frame.frame_id()) > 0;
    }
    result.Clear();
    result.set_frame_id(q.frame.frame_id());
    absl::Status fs;
    if (cancelled) {
      fs = absl::CancelledError(absl::StrCat("frame ", q.frame.frame_id(), " cancelled by the client"));
    } else if (q.frame.timeout_us() > 0 && now() > q.arrived + absl::Microseconds(q.frame.timeout_us())) {
      fs = absl::DeadlineExceededError(absl::StrCat("frame ", q.frame.frame_id(), ": timeout_us ", q.frame.timeout_us(),
                                                    " passed before it was started"));
    } else {
      fs = attend(q.frame.request(), result.mutable_response(), tenant);
    }
    if (!fs.ok()) {
      result.clear_response();
      result.set_code(static_cast<int>(fs.code()));
      result.set_message(std::string(fs.message()));
    }
    if (!stream->Write(result)) {
      st = absl::CancelledError("the client went away");
      break;
    }
  }
  {
    absl::MutexLock lock(&inbox.mu);
    inbox.closed = true;  // stops the reader if it waits for room
  }
  // The reader has seen the end of the stream, or Read returns false soon:
  // a write fails only when the call is cancelled, which ends reads too.
  reader.join();
  if (st.ok() && stream->Cancelled()) st = absl::CancelledError("the client went away");
  return st;
}

}  // namespace driftkv
