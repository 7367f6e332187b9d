// The persistent channel for decode workers: AttendStream, a bidirectional
// gRPC stream of small frames, each an AttendRequest (usually by reference
// to registered regions) with its own deadline, answered in order.
//
// A reader thread takes frames off the stream as they arrive and stamps
// them; the serving thread answers them one at a time, in arrival order,
// each exactly once:
//   - a frame whose deadline (arrival + timeout_us) passed before it was
//     started: DEADLINE_EXCEEDED, nothing done;
//   - a frame that a later frame with `cancel` set and the same frame_id
//     cancelled before it was started: CANCELLED, nothing done (a cancel
//     frame itself gets no answer);
//   - otherwise Handler::Attend for the stream's tenant: the same checks,
//     quotas and answers as the unary RPC.
// At most kMaxQueuedFrames wait; the reader stops reading while that many
// are queued (flow control passes back to the client). The stream ends OK
// after the client half-closes and every frame is answered; CANCELLED when
// the client goes away.
#ifndef DRIFTKV_SERVICE_ATTEND_STREAM_H_
#define DRIFTKV_SERVICE_ATTEND_STREAM_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/driftkv.pb.h"
#include "service/doorbell.h"

namespace driftkv {

constexpr int kMaxQueuedFrames = 64;

// The stream's two ends (grpc::ServerReaderWriter in the service; fakes in
// tests). Read blocks; false: the client half-closed or went away. Write
// may be called while Read blocks on another thread.
class FrameStream {
 public:
  virtual ~FrameStream() = default;
  virtual bool Read(v1::AttendFrame* frame) = 0;
  virtual bool Write(const v1::AttendFrameResult& result) = 0;
  virtual bool Cancelled() = 0;
};

// Serves `stream` until it ends. `clock` (null: absl::Now) stamps arrivals
// and checks deadlines.
absl::Status ServeAttendStream(FrameStream* stream, const AttendFn& attend, const std::string& tenant,
                               const std::function<absl::Time()>& clock = nullptr);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_STREAM_H_
