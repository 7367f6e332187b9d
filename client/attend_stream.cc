#include "client/attend_stream.h"

#include "absl/strings/str_cat.h"

namespace driftkv {

absl::StatusOr<std::unique_ptr<AttendStream>> AttendStream::Open(Client* client) {
  auto s = std::unique_ptr<AttendStream>(new AttendStream());
  s->rw_ = client->stub()->AttendStream(&s->context_);
  if (s->rw_ == nullptr) return absl::UnavailableError("AttendStream could not be opened");
  return s;
}

AttendStream::~AttendStream() {
  Close().IgnoreError();
}

absl::Status AttendStream::Broken() {
  broken_ = true;
  const grpc::Status st = rw_->Finish();
  return absl::UnavailableError(
      absl::StrCat("the AttendStream ended: ", st.error_message(), " (code ", static_cast<int>(st.error_code()), ")"));
}

absl::Status AttendStream::Send(absl::Duration timeout, uint64_t* frame_id) {
  if (broken_ || closed_) return absl::UnavailableError("the AttendStream is closed; open another");
  frame_.set_frame_id(next_id_++);
  frame_.set_cancel(false);
  frame_.set_timeout_us(timeout > absl::ZeroDuration() ? static_cast<uint32_t>(absl::ToInt64Microseconds(timeout)) : 0);
  if (frame_id != nullptr) *frame_id = frame_.frame_id();
  if (!rw_->Write(frame_)) return Broken();
  return absl::OkStatus();
}

absl::StatusOr<v1::AttendFrameResult> AttendStream::Receive() {
  if (broken_ || closed_) return absl::UnavailableError("the AttendStream is closed; open another");
  v1::AttendFrameResult r;
  if (!rw_->Read(&r)) return Broken();
  return r;
}

absl::Status AttendStream::Cancel(uint64_t frame_id) {
  if (broken_ || closed_) return absl::UnavailableError("the AttendStream is closed; open another");
  v1::AttendFrame c;
  c.set_frame_id(frame_id);
  c.set_cancel(true);
  if (!rw_->Write(c)) return Broken();
  return absl::OkStatus();
}

absl::Status AttendStream::Call(absl::Duration timeout) {
  uint64_t id = 0;
  absl::Status st = Send(timeout, &id);
  if (!st.ok()) return st;
  if (!rw_->Read(&result_)) return Broken();
  if (result_.frame_id() != id) {
    return absl::InternalError(absl::StrCat("answer for frame ", result_.frame_id(), " while waiting for ", id));
  }
  if (result_.code() != 0) return absl::Status(static_cast<absl::StatusCode>(result_.code()), result_.message());
  return absl::OkStatus();
}

absl::StatusOr<v1::AttendResponse> AttendStream::Attend(const v1::AttendRequest& request, absl::Duration timeout) {
  *frame_.mutable_request() = request;
  absl::Status st = Call(timeout);
  if (!st.ok()) return st;
  return result_.response();
}

absl::Status AttendStream::Close() {
  if (closed_ || broken_) return absl::OkStatus();
  closed_ = true;
  rw_->WritesDone();
  v1::AttendFrameResult r;
  while (rw_->Read(&r)) {
  }
  const grpc::Status st = rw_->Finish();
  if (!st.ok()) return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  return absl::OkStatus();
}

}  // namespace driftkv
