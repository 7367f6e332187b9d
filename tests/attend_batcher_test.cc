// BatchingBackend: calls that arrive while a batch runs are merged into the
// next inner Attend, each caller gets back exactly its own jobs' outputs and
// statuses, and an idle backend runs a call at once, alone.
#include "backends/attend_batcher.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace driftkv {
namespace {

// Writes each job's softmax_scale into out[0]; jobs with q_heads == 0 fail.
// The first call blocks until `release` is notified.
class FakeBackend : public Backend {
 public:
  std::string name() const override { return "fake"; }
  absl::Status EncodePages(absl::Span<EncodeJob>) override { return absl::OkStatus(); }
  absl::Status DecodeTokens(PageId, int, int, int, float*, float*) override { return absl::OkStatus(); }
  void Attend(absl::Span<AttendJob> jobs) override {
    {
      absl::MutexLock lock(&mu);
      sizes.push_back(static_cast<int>(jobs.size()));
    }
    if (!started.HasBeenNotified()) {
      started.Notify();
      release.WaitForNotification();
    }
    for (AttendJob& j : jobs) {
      j.out[0] = j.softmax_scale;
      j.status = j.q_heads > 0 ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrCat("job ", j.softmax_scale));
    }
  }
  absl::Mutex mu;
  std::vector<int> sizes;
  absl::Notification started, release;
};

TEST(AttendBatcher, MergesCallsThatArriveWhileABatchRuns) {
  auto fake = std::make_unique<FakeBackend>();
  FakeBackend* f = fake.get();
  std::vector<std::pair<int, int>> observed;
  BatchingBackend b(std::move(fake), [&](int calls, int jobs) { observed.push_back({calls, jobs}); });

  // Call c has c + 1 jobs; job k of call c carries the id 100 c + k. Call 0
  // runs first and holds the backend; calls 1..4 queue behind it.
  constexpr int kCalls = 5;
  std::vector<std::vector<AttendJob>> jobs(kCalls);
  std::vector<std::vector<float>> outs(kCalls);
  for (int c = 0; c < kCalls; ++c) {
    jobs[c].resize(c + 1);
    outs[c].assign(c + 1, -1.0f);
    for (int k = 0; k <= c; ++k) {
      jobs[c][k].softmax_scale = 100.0f * c + k;
      jobs[c][k].q_heads = (c == 3 && k == 1) ? 0 : 4;  // one failing job
      jobs[c][k].out = &outs[c][k];
    }
  }
  std::vector<std::thread> threads;
  threads.emplace_back([&] { b.Attend(absl::MakeSpan(jobs[0])); });
  f->started.WaitForNotification();
  for (int c = 1; c < kCalls; ++c) threads.emplace_back([&, c] { b.Attend(absl::MakeSpan(jobs[c])); });
  while (b.queued() < kCalls - 1) std::this_thread::yield();
  f->release.Notify();
  for (std::thread& t : threads) t.join();

  ASSERT_EQ(f->sizes.size(), 2u) << "calls 1..4 must run as one inner call";
  EXPECT_EQ(f->sizes[0], 1);
  EXPECT_EQ(f->sizes[1], 2 + 3 + 4 + 5);
  ASSERT_EQ(observed.size(), 2u);
  EXPECT_EQ(observed[1], std::make_pair(4, 14));
  for (int c = 0; c < kCalls; ++c) {
    for (int k = 0; k <= c; ++k) {
      EXPECT_EQ(outs[c][k], 100.0f * c + k) << "call " << c << " job " << k;
      EXPECT_EQ(jobs[c][k].status.ok(), !(c == 3 && k == 1)) << "call " << c << " job " << k;
    }
  }
  EXPECT_EQ(jobs[3][1].status.message(), "job 301");
}

TEST(AttendBatcher, IdleCallsRunAloneAndPassThrough) {
  auto fake = std::make_unique<FakeBackend>();
  FakeBackend* f = fake.get();
  f->started.Notify();  // never block
  BatchingBackend b(std::move(fake), nullptr);
  EXPECT_EQ(b.name(), "fake");
  for (int c = 0; c < 3; ++c) {
    std::vector<float> out(2, -1.0f);
    std::vector<AttendJob> js(2);
    for (int k = 0; k < 2; ++k) js[k].softmax_scale = 10.0f * c + k, js[k].q_heads = 1, js[k].out = &out[k];
    b.Attend(absl::MakeSpan(js));
    EXPECT_EQ(out[0], 10.0f * c);
    EXPECT_EQ(out[1], 10.0f * c + 1);
  }
  EXPECT_EQ(f->sizes, std::vector<int>({2, 2, 2}));
}

// Each caller's status is its own: a Status sharing another's reference
// count would let two callers' threads release it where ThreadSanitizer
// cannot see the count (Debian's Abseil is uninstrumented).
TEST(CopyAttendOutcome, CopiesTheStatusUnshared) {
  AttendJob ran;
  ran.status = absl::UnavailableError("the device was lost");
  AttendJob a, b;
  CopyAttendOutcome(ran, &a);
  CopyAttendOutcome(ran, &b);
  EXPECT_EQ(a.status, ran.status);
  EXPECT_EQ(b.status, ran.status);
  EXPECT_NE(a.status.message().data(), ran.status.message().data());
  EXPECT_NE(a.status.message().data(), b.status.message().data());
  ran.status = absl::OkStatus();
  CopyAttendOutcome(ran, &a);
  EXPECT_TRUE(a.status.ok());
}

}  // namespace
}  // namespace driftkv
