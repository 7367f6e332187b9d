// libFuzzer: ServeAttendStream (service/attend_stream.h) over a sequence of
// AttendFrames read from the input, answered by a real Handler
// (fuzz/fuzz_handler.h). The first byte says after how many answers the
// client goes away (0xff: never; it half-closes after the last frame).
// Then records of [flags][length][length bytes]:
//   flags bits 0-2  frame_id (small, so that cancels name queued frames)
//         bit 3     cancel
//         bits 4-5  timeout_us: 0, 1, 100 or 1,000,000
//   the bytes       an AttendRequest (or, if they do not parse, an empty one)
// The clock advances 50 us at every reading, so timeouts pass too. Checks:
// the answers are the non-cancel frames' ids in order (all of them, or a
// prefix when the client went away), each with a valid code, a response
// only when the code is OK, and the stream's status OK or CANCELLED.
#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "fuzz/fuzz_handler.h"
#include "service/attend_stream.h"

using namespace driftkv;

namespace {

// The frames of the input, then a half-close; Write fails from answer
// `fail_from` on (-1: never), after which Read returns false.
class ScriptedStream : public FrameStream {
 public:
  ScriptedStream(std::vector<v1::AttendFrame> frames, int fail_from)
      : frames_(std::move(frames)), fail_from_(fail_from) {}
  bool Read(v1::AttendFrame* frame) override {
    if (gone_.load() || next_ >= frames_.size()) return false;
    *frame = frames_[next_++];
    return true;
  }
  bool Write(const v1::AttendFrameResult& result) override {
    if (fail_from_ >= 0 && static_cast<int>(written_.size()) >= fail_from_) {
      gone_.store(true);
      return false;
    }
    written_.push_back(result);
    return true;
  }
  bool Cancelled() override { return gone_.load(); }
  const std::vector<v1::AttendFrameResult>& written() const { return written_; }

 private:
  const std::vector<v1::AttendFrame> frames_;
  const int fail_from_;
  size_t next_ = 0;                             // the reader thread's only
  std::vector<v1::AttendFrameResult> written_;  // the serving thread's only
  std::atomic<bool> gone_{false};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int fail_from = data[0] == 0xff ? -1 : data[0] % 16;
  size_t at = 1;
  std::vector<v1::AttendFrame> frames;
  std::vector<uint64_t> expected;  // ids of the frames that get an answer
  static constexpr uint32_t kTimeouts[4] = {0, 1, 100, 1000000};
  while (at + 2 <= size && frames.size() < 64) {
    const uint8_t flags = data[at];
    const size_t length = data[at + 1];
    at += 2;
    const size_t take = length < size - at ? length : size - at;
    v1::AttendFrame f;
    f.set_frame_id(flags & 7);
    f.set_cancel((flags & 8) != 0);
    f.set_timeout_us(kTimeouts[(flags >> 4) & 3]);
    if (!f.mutable_request()->ParseFromArray(data + at, static_cast<int>(take))) f.mutable_request()->Clear();
    at += take;
    if (!f.cancel()) expected.push_back(f.frame_id());
    frames.push_back(std::move(f));
  }
  ScriptedStream stream(std::move(frames), fail_from);
  std::atomic<int64_t> ticks{0};
  const absl::Time start = absl::FromUnixSeconds(1700000000);
  const absl::Status st =
      ServeAttendStream(&stream, fuzz::FuzzAttend, "", [&] { return start + absl::Microseconds(50 * ticks++); });
  if (!st.ok() && st.code() != absl::StatusCode::kCancelled) __builtin_trap();
  const std::vector<v1::AttendFrameResult>& out = stream.written();
  if (out.size() > expected.size()) __builtin_trap();
  if (st.ok() && out.size() != expected.size()) __builtin_trap();
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].frame_id() != expected[i]) __builtin_trap();
    if (out[i].code() < 0 || out[i].code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) __builtin_trap();
    if (out[i].code() != 0 && out[i].has_response()) __builtin_trap();
  }
  return 0;
}
