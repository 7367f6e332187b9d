// The backend's shared thread pool: every index runs exactly once, many
// callers at once make progress, and destruction joins cleanly.
#include "backends/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsOnceUnderConcurrentCallers) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  constexpr int kCallers = 8, kRounds = 50, kN = 37;
  std::vector<std::atomic<int>> hits(kCallers * kN);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        pool.ParallelFor(kN, [&](int i) { ++hits[c * kN + i]; });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (const std::atomic<int>& h : hits) EXPECT_EQ(h.load(), kRounds);
}

TEST(ThreadPoolTest, EdgeSizes) {
  ThreadPool none(1);  // no workers: runs on the caller
  int sum = 0;
  none.ParallelFor(5, [&](int i) { sum += i; });
  EXPECT_EQ(sum, 10);
  ThreadPool pool(3);
  std::atomic<int> calls{0};
  pool.ParallelFor(0, [&](int) { ++calls; });
  pool.ParallelFor(1, [&](int) { ++calls; });
  pool.ParallelFor(1000, [&](int) { ++calls; });
  EXPECT_EQ(calls.load(), 1001);
}

}  // namespace
}  // namespace driftkv
