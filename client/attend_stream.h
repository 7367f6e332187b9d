// driftkv::AttendStream: the persistent channel for decode workers
// (service/attend_stream.h): one AttendStream RPC kept open, one small frame
// per Attend, answers in order. A step pays no per-call setup (no new call,
// no deadline propagation, no metadata).
//
//   auto s = AttendStream::Open(&client);
//   v1::AttendFrame& f = (*s)->frame();        // fill f.mutable_request() once,
//   auto r = (*s)->Call(absl::Milliseconds(5)); // then change what moves per layer
//
// Not thread-safe; open one stream per decode thread. A frame that fails
// answers its status; the stream stays usable. When the stream itself
// breaks (the server went away), every call fails UNAVAILABLE: open
// another.
#ifndef DRIFTKV_CLIENT_ATTEND_STREAM_H_
#define DRIFTKV_CLIENT_ATTEND_STREAM_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "proto/driftkv.grpc.pb.h"

namespace driftkv {

class AttendStream {
 public:
  // `client` must outlive the stream.
  static absl::StatusOr<std::unique_ptr<AttendStream>> Open(Client* client);
  ~AttendStream();  // half-closes and waits for the server's end

  // The frame Call sends (its request is kept between calls).
  v1::AttendFrame& frame() { return frame_; }
  // Sends frame() with `timeout` (0: none; the server's per-frame deadline)
  // and waits for its answer, into response().
  absl::Status Call(absl::Duration timeout = absl::ZeroDuration());
  const v1::AttendResponse& response() const { return result_.response(); }
  // A copy of `request` sent and answered.
  absl::StatusOr<v1::AttendResponse> Attend(const v1::AttendRequest& request,
                                            absl::Duration timeout = absl::ZeroDuration());

  // Pipelining: Send frames, then Receive their answers in the same order;
  // Cancel(frame_id) asks the server to drop a frame it has not started.
  absl::Status Send(absl::Duration timeout, uint64_t* frame_id);
  absl::StatusOr<v1::AttendFrameResult> Receive();
  absl::Status Cancel(uint64_t frame_id);
  absl::Status Close();

 private:
  AttendStream() = default;
  absl::Status Broken();

  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AttendFrame, v1::AttendFrameResult>> rw_;
  v1::AttendFrame frame_;
  v1::AttendFrameResult result_;
  uint64_t next_id_ = 1;
  bool broken_ = false, closed_ = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_ATTEND_STREAM_H_
