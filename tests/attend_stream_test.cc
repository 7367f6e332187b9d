// The AttendStream (service/attend_stream.h): first ServeAttendStream alone,
// over a fake FrameStream and a fake AttendFn with a clock the test moves
// (order, exactly-once, per-frame deadlines, cancel frames, half-close, a
// client that goes away); then over a real in-process server with two
// tenants through client/attend_stream.h (answers bit-identical to the
// unary Attend, tenants kept apart, errors per frame, a client cancelled
// mid-stream).
#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/attend_stream.h"
#include "gtest/gtest.h"
#include "service/attend_stream.h"
#include "tests/tenant_server.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;

// The client's end, driven by the test. Read blocks until a frame is pushed
// or the client half-closes; after a Write fails (the client went away),
// Read returns false, as grpc::ServerReaderWriter's does once the call is
// cancelled.
class FakeStream : public FrameStream {
 public:
  void Push(v1::AttendFrame frame) {
    absl::MutexLock lock(&mu_);
    in_.push_back(std::move(frame));
  }
  void Frame(uint64_t id, uint32_t timeout_us = 0) {
    v1::AttendFrame f;
    f.set_frame_id(id);
    f.set_timeout_us(timeout_us);
    f.mutable_request()->add_items()->set_sequence_id(absl::StrCat("seq", id));
    Push(std::move(f));
  }
  void CancelFrame(uint64_t id) {
    v1::AttendFrame f;
    f.set_frame_id(id);
    f.set_cancel(true);
    Push(std::move(f));
  }
  void HalfClose() {
    absl::MutexLock lock(&mu_);
    half_closed_ = true;
  }
  void FailWritesFrom(int n) {
    absl::MutexLock lock(&mu_);
    fail_from_ = n;
  }
  // Waits until the server has taken `n` frames off the stream.
  void AwaitRead(int n) {
    absl::MutexLock lock(&mu_);
    while (read_ < n) changed_.Wait(&mu_);
  }
  // Waits until `n` answers were written.
  void AwaitWritten(int n) {
    absl::MutexLock lock(&mu_);
    while (static_cast<int>(out_.size()) < n) changed_.Wait(&mu_);
  }
  std::vector<v1::AttendFrameResult> results() {
    absl::MutexLock lock(&mu_);
    return out_;
  }
  int writes_tried() {
    absl::MutexLock lock(&mu_);
    return writes_;
  }

  bool Read(v1::AttendFrame* frame) override {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](FakeStream* s)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->in_.empty() || s->half_closed_ || s->gone_; },
        this));
    if (gone_ || in_.empty()) return false;
    *frame = std::move(in_.front());
    in_.pop_front();
    ++read_;
    changed_.SignalAll();
    return true;
  }
  bool Write(const v1::AttendFrameResult& result) override {
    absl::MutexLock lock(&mu_);
    if (gone_ || (fail_from_ >= 0 && writes_ >= fail_from_)) {
      ++writes_;
      gone_ = true;
      return false;
    }
    ++writes_;
    out_.push_back(result);
    changed_.SignalAll();
    return true;
  }
  bool Cancelled() override {
    absl::MutexLock lock(&mu_);
    return gone_;
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::AttendFrame> in_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::AttendFrameResult> out_ ABSL_GUARDED_BY(mu_);
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int fail_from_ ABSL_GUARDED_BY(mu_) = -1;
  int read_ ABSL_GUARDED_BY(mu_) = 0;
  int writes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::CondVar changed_;  // read_ or out_ grew
};

// A clock that moves only when the test says.
class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  std::function<absl::Time()> fn() {
    return [this] { return Now(); };
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

// An AttendFn that records which frames it ran (by the sequence id the fake
// stream put in) and answers one result whose tokens say which; "hold..."
// sequences block until Release; "fail..." sequences answer an error.
class FakeAttend {
 public:
  AttendFn fn() {
    return [this](const v1::AttendRequest& request, v1::AttendResponse* response, const std::string& tenant) {
      const std::string seq = request.items(0).sequence_id();
      {
        absl::MutexLock lock(&mu_);
        ran_.push_back(seq);
        tenants_.push_back(tenant);
        ran_grew_.SignalAll();
        if (seq.rfind("hold", 0) == 0) {
          mu_.Await(absl::Condition(&released_));
          released_ = false;
        }
      }
      if (seq.rfind("fail", 0) == 0) return absl::FailedPreconditionError(absl::StrCat(seq, " failed"));
      response->add_results()->set_tokens(TokensOf(seq));
      return absl::OkStatus();
    };
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  void AwaitRan(size_t n) {
    absl::MutexLock lock(&mu_);
    while (ran_.size() < n) ran_grew_.Wait(&mu_);
  }
  std::vector<std::string> ran() {
    absl::MutexLock lock(&mu_);
    return ran_;
  }
  std::vector<std::string> tenants() {
    absl::MutexLock lock(&mu_);
    return tenants_;
  }
  static uint64_t TokensOf(const std::string& seq) { return seq.size() * 1000 + std::hash<std::string>()(seq) % 1000; }

 private:
  absl::Mutex mu_;
  std::vector<std::string> ran_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> tenants_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar ran_grew_;
};

// Runs ServeAttendStream on a thread; Wait gives its status, or fails the
// test (and aborts: a hung server thread cannot be joined) after 20 s.
class Serving {
 public:
  Serving(FakeStream* stream, FakeAttend* attend, FakeClock* clock)
      : done_(std::async(std::launch::async, [=] {
          return ServeAttendStream(stream, attend->fn(), "tenant-a", clock != nullptr ? clock->fn() : nullptr);
        })) {}
  absl::Status Wait() {
    if (done_.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      ADD_FAILURE() << "ServeAttendStream did not return";
      std::abort();
    }
    return done_.get();
  }

 private:
  std::future<absl::Status> done_;
};

TEST(ServeAttendStreamTest, AnswersEveryFrameOnceInOrderThenEndsOkAfterHalfClose) {
  FakeStream stream;
  FakeAttend attend;
  // More frames than may queue: the reader waits for room meanwhile.
  constexpr int kFrames = 3 * kMaxQueuedFrames + 5;
  for (int i = 1; i <= kFrames; ++i) stream.Frame(1000 + i);
  stream.HalfClose();
  Serving serving(&stream, &attend, nullptr);
  ASSERT_TRUE(serving.Wait().ok());
  const std::vector<v1::AttendFrameResult> out = stream.results();
  ASSERT_EQ(out.size(), static_cast<size_t>(kFrames));
  const std::vector<std::string> ran = attend.ran();
  ASSERT_EQ(ran.size(), static_cast<size_t>(kFrames));
  for (int i = 0; i < kFrames; ++i) {
    const std::string seq = absl::StrCat("seq", 1001 + i);
    EXPECT_EQ(out[i].frame_id(), static_cast<uint64_t>(1001 + i));
    EXPECT_EQ(out[i].code(), 0);
    ASSERT_EQ(out[i].response().results_size(), 1);
    EXPECT_EQ(out[i].response().results(0).tokens(), FakeAttend::TokensOf(seq));
    EXPECT_EQ(ran[i], seq);
  }
  for (const std::string& t : attend.tenants()) EXPECT_EQ(t, "tenant-a");
}

TEST(ServeAttendStreamTest, HalfCloseWithoutFramesEndsOk) {
  FakeStream stream;
  FakeAttend attend;
  stream.HalfClose();
  Serving serving(&stream, &attend, nullptr);
  EXPECT_TRUE(serving.Wait().ok());
  EXPECT_TRUE(stream.results().empty());
}

TEST(ServeAttendStreamTest, AFrameWhoseTimeoutPassedBeforeItStartedIsNotRun) {
  FakeStream stream;
  FakeAttend attend;
  FakeClock clock;
  Serving serving(&stream, &attend, &clock);
  v1::AttendFrame hold;
  hold.set_frame_id(1);
  hold.mutable_request()->add_items()->set_sequence_id("hold1");
  stream.Push(hold);
  attend.AwaitRan(1);  // frame 1 holds the queue
  stream.Frame(2, /*timeout_us=*/1000);
  stream.Frame(3, /*timeout_us=*/5000);
  stream.Frame(4, /*timeout_us=*/0);  // no deadline
  stream.AwaitRead(4);
  clock.Advance(absl::Microseconds(1001));  // past 2's deadline, within 3's
  attend.Release();
  stream.HalfClose();
  ASSERT_TRUE(serving.Wait().ok());
  const std::vector<v1::AttendFrameResult> out = stream.results();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].code(), 0);
  EXPECT_EQ(out[1].frame_id(), 2u);
  EXPECT_EQ(out[1].code(), static_cast<int>(C::kDeadlineExceeded));
  EXPECT_FALSE(out[1].has_response());
  EXPECT_EQ(out[1].message(), "frame 2: timeout_us 1000 passed before it was started");
  EXPECT_EQ(out[2].code(), 0);
  EXPECT_EQ(out[3].code(), 0);
  EXPECT_EQ(attend.ran(), (std::vector<std::string>{"hold1", "seq3", "seq4"}));
}

TEST(ServeAttendStreamTest, ExactlyAtTheDeadlineAFrameStillRuns) {
  FakeStream stream;
  FakeAttend attend;
  FakeClock clock;
  Serving serving(&stream, &attend, &clock);
  v1::AttendFrame hold;
  hold.set_frame_id(1);
  hold.mutable_request()->add_items()->set_sequence_id("hold1");
  stream.Push(hold);
  attend.AwaitRan(1);
  stream.Frame(2, 1000);
  stream.AwaitRead(2);
  clock.Advance(absl::Microseconds(1000));
  attend.Release();
  stream.HalfClose();
  ASSERT_TRUE(serving.Wait().ok());
  ASSERT_EQ(stream.results().size(), 2u);
  EXPECT_EQ(stream.results()[1].code(), 0);
}

TEST(ServeAttendStreamTest, CancelFramesDropQueuedFramesOnlyAndGetNoAnswer) {
  FakeStream stream;
  FakeAttend attend;
  Serving serving(&stream, &attend, nullptr);
  v1::AttendFrame hold;
  hold.set_frame_id(1);
  hold.mutable_request()->add_items()->set_sequence_id("hold1");
  stream.Push(hold);
  attend.AwaitRan(1);  // frame 1 started: its cancel comes too late
  stream.Frame(2);
  stream.Frame(3);
  stream.CancelFrame(2);
  stream.CancelFrame(1);
  stream.CancelFrame(99);  // never sent
  stream.AwaitRead(6);
  attend.Release();
  stream.AwaitWritten(3);
  // Frame 3 answered already: cancelling it now changes nothing, and a
  // later frame with its id runs.
  stream.CancelFrame(3);
  stream.Frame(3);
  stream.HalfClose();
  ASSERT_TRUE(serving.Wait().ok());
  const std::vector<v1::AttendFrameResult> out = stream.results();
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0].frame_id(), 1u);
  EXPECT_EQ(out[0].code(), 0);
  EXPECT_EQ(out[1].frame_id(), 2u);
  EXPECT_EQ(out[1].code(), static_cast<int>(C::kCancelled));
  EXPECT_EQ(out[1].message(), "frame 2 cancelled by the client");
  EXPECT_FALSE(out[1].has_response());
  EXPECT_EQ(out[2].frame_id(), 3u);
  EXPECT_EQ(out[2].code(), 0);
  EXPECT_EQ(out[3].frame_id(), 3u);
  EXPECT_EQ(out[3].code(), 0);
  EXPECT_EQ(attend.ran(), (std::vector<std::string>{"hold1", "seq3", "seq3"}));
}

TEST(ServeAttendStreamTest, AFailingFrameAnswersItsStatusAndTheStreamGoesOn) {
  FakeStream stream;
  FakeAttend attend;
  stream.Frame(1);
  v1::AttendFrame fail;
  fail.set_frame_id(2);
  fail.mutable_request()->add_items()->set_sequence_id("fail2");
  stream.Push(fail);
  stream.Frame(3);
  stream.HalfClose();
  Serving serving(&stream, &attend, nullptr);
  ASSERT_TRUE(serving.Wait().ok());
  const std::vector<v1::AttendFrameResult> out = stream.results();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].code(), static_cast<int>(C::kFailedPrecondition));
  EXPECT_EQ(out[1].message(), "fail2 failed");
  EXPECT_FALSE(out[1].has_response());
  EXPECT_EQ(out[2].code(), 0);
}

TEST(ServeAttendStreamTest, AClientThatGoesAwayEndsTheStreamCancelledWithoutHanging) {
  for (int fail_from : {0, 2}) {
    SCOPED_TRACE(fail_from);
    FakeStream stream;
    FakeAttend attend;
    // Enough frames that the reader waits for room when the write fails;
    // the client never half-closes.
    for (int i = 1; i <= 2 * kMaxQueuedFrames; ++i) stream.Frame(i);
    stream.FailWritesFrom(fail_from);
    Serving serving(&stream, &attend, nullptr);
    const absl::Status st = serving.Wait();
    EXPECT_EQ(st.code(), C::kCancelled) << st;
    EXPECT_EQ(stream.writes_tried(), fail_from + 1);
    EXPECT_EQ(attend.ran().size(), static_cast<size_t>(fail_from + 1));
  }
}

TEST(ServeAttendStreamTest, AClientThatGoesAwayWhileIdleEndsTheStreamCancelled) {
  FakeStream stream;
  FakeAttend attend;
  stream.Frame(1);
  stream.FailWritesFrom(0);
  Serving serving(&stream, &attend, nullptr);
  EXPECT_EQ(serving.Wait().code(), C::kCancelled);
}

// ---- over a real server ----

using AttendStreamE2eTest = testing::TenantServerTest;

TEST_F(AttendStreamE2eTest, AnswersEqualTheUnaryAttendBitForBit) {
  absl::StatusOr<std::unique_ptr<AttendStream>> s = AttendStream::Open(alice_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  for (uint32_t i = 0; i < 20; ++i) {
    const v1::AttendRequest request = Request(i);
    absl::StatusOr<v1::AttendResponse> unary = alice_->Attend(request);
    ASSERT_TRUE(unary.ok()) << unary.status();
    absl::StatusOr<v1::AttendResponse> streamed = (*s)->Attend(request, absl::Seconds(5));
    ASSERT_TRUE(streamed.ok()) << streamed.status();
    ASSERT_EQ(streamed->results_size(), 2);
    EXPECT_EQ(streamed->results(0).tokens(), static_cast<uint64_t>(kTokens));
    EXPECT_EQ(streamed->SerializeAsString(), unary->SerializeAsString()) << i;
  }
  // Pipelined: answers come in the order sent, each the unary one.
  std::vector<uint64_t> ids;
  for (uint32_t i = 0; i < 10; ++i) {
    *(*s)->frame().mutable_request() = Request(100 + i);
    uint64_t id = 0;
    ASSERT_TRUE((*s)->Send(absl::ZeroDuration(), &id).ok());
    ids.push_back(id);
  }
  for (uint32_t i = 0; i < 10; ++i) {
    absl::StatusOr<v1::AttendFrameResult> r = (*s)->Receive();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->frame_id(), ids[i]);
    EXPECT_EQ(r->code(), 0) << r->message();
    absl::StatusOr<v1::AttendResponse> unary = alice_->Attend(Request(100 + i));
    ASSERT_TRUE(unary.ok());
    EXPECT_EQ(r->response().SerializeAsString(), unary->SerializeAsString());
  }
  EXPECT_TRUE((*s)->Close().ok());
}

TEST_F(AttendStreamE2eTest, ErrorsAreAnsweredPerFrameAndTheStreamStaysUsable) {
  absl::StatusOr<std::unique_ptr<AttendStream>> s = AttendStream::Open(bob_.get());
  ASSERT_TRUE(s.ok()) << s.status();
  // Alice's sequence does not exist for bob: exactly what unary says.
  absl::StatusOr<v1::AttendResponse> unary = bob_->Attend(Request(1));
  ASSERT_EQ(unary.status().code(), C::kNotFound);
  absl::StatusOr<v1::AttendResponse> streamed = (*s)->Attend(Request(1));
  EXPECT_EQ(streamed.status().code(), C::kNotFound);
  EXPECT_EQ(streamed.status().message(), unary.status().message());
  // A malformed frame (layer out of range), then a good one of bob's own.
  v1::AttendRequest bad = Request(2);
  bad.mutable_items(1)->set_layer(7);
  absl::StatusOr<v1::AttendResponse> unary_bad = bob_->Attend(bad);
  streamed = (*s)->Attend(bad);
  EXPECT_EQ(streamed.status().code(), unary_bad.status().code());
  EXPECT_NE(streamed.status().code(), C::kOk);
  const testing::Kv kv = testing::SyntheticKv(40, testing::kSmallN, 9);
  const std::vector<v1::AppendChunk> chunks = {testing::ChunkOf("b", 0, 0, 40, kv),
                                               testing::ChunkOf("b", 1, 0, 40, kv)};
  ASSERT_TRUE(bob_->Append(chunks).ok());
  streamed = (*s)->Attend(Request(3, "b"));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->results(0).tokens(), 40u);
  EXPECT_EQ(streamed->SerializeAsString(), bob_->Attend(Request(3, "b"))->SerializeAsString());
  EXPECT_TRUE((*s)->Close().ok());
}

TEST_F(AttendStreamE2eTest, AClientCancelledMidStreamLeavesTheServerHealthy) {
  for (int round = 0; round < 5; ++round) {
    grpc::ClientContext context;
    auto rw = alice_->stub()->AttendStream(&context);
    ASSERT_NE(rw, nullptr);
    for (uint64_t id = 1; id <= 20; ++id) {
      v1::AttendFrame f;
      f.set_frame_id(id);
      *f.mutable_request() = Request(static_cast<uint32_t>(id));
      if (!rw->Write(f)) break;
    }
    v1::AttendFrameResult first;
    EXPECT_TRUE(rw->Read(&first));
    context.TryCancel();  // gone mid-stream: frames still queued, no half-close
    const grpc::Status st = rw->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server still serves streams and unary calls.
  absl::StatusOr<std::unique_ptr<AttendStream>> s = AttendStream::Open(alice_.get());
  ASSERT_TRUE(s.ok());
  absl::StatusOr<v1::AttendResponse> streamed = (*s)->Attend(Request(5));
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(streamed->SerializeAsString(), alice_->Attend(Request(5))->SerializeAsString());
}

}  // namespace
}  // namespace driftkv
