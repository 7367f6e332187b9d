// A Handler as the service tests drive it, without a network: its Metrics,
// a clock the test moves, and the calls every test makes the same way
// (push tokens in chunks, Stats, read a layer back as bytes).
//
// Two forms of one thing:
//  - TestHandler: a value, for tests that compare several handlers side by
//    side (a cold and a hot one, one device and two);
//  - HandlerFixture: a gtest fixture whose members (h_, metrics_, now_,
//    options_) the TEST_F bodies use directly.
// Both build with Handler::Create; the clock is `now`/`now_` (starting at
// FixtureEpoch()) unless the test asks for the real one, so that TTL and idle
// expiry happen only when a test advances it.
#ifndef DRIFTKV_TESTS_HANDLER_FIXTURE_H_
#define DRIFTKV_TESTS_HANDLER_FIXTURE_H_

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace testing {

// Where the injected clocks start (any fixed instant would do).
inline absl::Time FixtureEpoch() {
  return absl::FromUnixSeconds(1000000);
}

enum class FixtureClock { kInjected, kReal };

// Appends tokens [first, first + count) of `kv` (rows of kSmallN, f32) to
// layer `layer` of `seq` in chunks of `chunk` tokens; the first error stops.
inline absl::Status PushTokens(Handler& h, const std::string& seq, uint32_t layer, const Kv& kv, int first, int count,
                               int chunk = 97) {
  v1::AppendResponse r;
  for (int t = first; t < first + count; t += chunk) {
    absl::Status st = h.Append(ChunkOf(seq, layer, t, std::min(chunk, first + count - t), kv), &r);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

inline v1::StatsResponse StatsOf(Handler& h) {
  v1::StatsResponse s;
  h.Stats(&s);
  return s;
}

// Every token of one layer as Read returns it (f32, the default dtype):
// each message's keys then its values. A failed Read is a test failure.
inline std::string ReadLayerBytes(Handler& h, const std::string& seq, uint32_t layer) {
  v1::ReadRequest req;
  req.set_sequence_id(seq);
  req.set_layer(layer);
  std::string all;
  absl::Status st = h.Read(req, [&](const v1::ReadChunk& c) {
    all += c.keys();
    all += c.values();
    return true;
  });
  EXPECT_TRUE(st.ok()) << st;
  return all;
}

struct TestHandler {
  // A failed Create is a test failure and leaves `h` null.
  explicit TestHandler(const ServiceOptions& o, FixtureClock clock = FixtureClock::kInjected) {
    Handler::Clock c;
    if (clock == FixtureClock::kInjected) c = [this] { return now; };
    absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(o, &metrics, std::move(c));
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) h = *std::move(made);
  }
  absl::Status Push(const std::string& seq, uint32_t layer, const Kv& kv, int first, int count, int chunk = 97) {
    return PushTokens(*h, seq, layer, kv, first, count, chunk);
  }
  v1::StatsResponse Stats() { return StatsOf(*h); }
  std::string Read(const std::string& seq, uint32_t layer) { return ReadLayerBytes(*h, seq, layer); }
  void Advance(double seconds) { now += absl::Seconds(seconds); }

  Metrics metrics;  // must outlive h (declared first, destroyed last)
  absl::Time now = FixtureEpoch();
  std::unique_ptr<Handler> h;
};

class HandlerFixture : public ::testing::Test {
 protected:
  explicit HandlerFixture(FixtureClock clock = FixtureClock::kInjected) : clock_(clock) {}

  // Replaces the handler with one of `o`; the old one is destroyed first.
  void Make(const ServiceOptions& o = SmallOptions()) {
    h_.reset();
    options_ = o;
    Handler::Clock c;
    if (clock_ == FixtureClock::kInjected) c = [this] { return now_; };
    absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, &metrics_, std::move(c));
    ASSERT_TRUE(h.ok()) << h.status();
    h_ = *std::move(h);
  }
  v1::StatsResponse Stats() { return StatsOf(*h_); }

  const FixtureClock clock_;
  ServiceOptions options_;
  Metrics metrics_;  // must outlive h_ (declared first, destroyed last)
  absl::Time now_ = FixtureEpoch();
  std::unique_ptr<Handler> h_;
};

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_HANDLER_FIXTURE_H_
