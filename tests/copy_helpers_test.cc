// CopyHelpers (service/copy_helpers.h): every byte of every copy lands,
// with helpers or without, whoever takes a copy, however many batches run
// at once, and a helper that a batch abandons before it wakes comes back.
#include "service/copy_helpers.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace driftkv {
namespace {

// `count` copies of random sizes (some odd, some past 16 KiB) into one
// buffer at offsets of every alignment; checked after Finish.
void CopyAndCheck(CopyHelpers* helpers, int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> sources(count);
  std::vector<size_t> at(count);
  size_t total = 0;
  for (int i = 0; i < count; ++i) {
    const size_t n = rng() % 3 == 0 ? rng() % 64 : rng() % 20000;
    sources[i].resize(n);
    for (char& c : sources[i]) c = static_cast<char>(rng());
    total += rng() % 64;  // misaligns the next destination
    at[i] = total;
    total += n;
  }
  std::string dest(total, '\0');
  {
    CopyHelpers::Batch batch = helpers->Begin();
    for (int i = 0; i < count; ++i) batch.Add(&dest[at[i]], sources[i].data(), sources[i].size());
    batch.Finish();
    batch.Finish();  // idempotent
  }
  for (int i = 0; i < count; ++i) {
    ASSERT_EQ(dest.compare(at[i], sources[i].size(), sources[i]), 0) << "copy " << i << " of " << count;
  }
}

TEST(CopyHelpersTest, EveryByteLandsWithoutHelpers) {
  CopyHelpers none(0, absl::ZeroDuration());
  for (int count : {0, 1, 7, 64, 300}) CopyAndCheck(&none, count, count);
  EXPECT_EQ(none.batches_helped(), 0);
}

TEST(CopyHelpersTest, EveryByteLandsWithHelpersPastTheirListToo) {
  CopyHelpers two(2, absl::ZeroDuration());
  // 300 copies: more than a helper's list holds; the caller makes the rest.
  for (int round = 0; round < 20; ++round) {
    for (int count : {0, 1, 7, 64, 300}) CopyAndCheck(&two, count, 1000 * round + count);
  }
}

TEST(CopyHelpersTest, AHelperTakesUpABatchItIsGivenTime) {
  CopyHelpers one(1, absl::ZeroDuration());
  std::vector<std::string> from(64, std::string(8192, 'x')), to(64, std::string(8192, '\0'));
  CopyHelpers::Batch batch = one.Begin();
  for (int i = 0; i < 64; ++i) batch.Add(&to[i][0], from[i].data(), from[i].size());
  // The helper wakes while the caller does other work; bounded generously
  // for a loaded machine.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (one.batches_helped() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  batch.Finish();
  EXPECT_EQ(one.batches_helped(), 1);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(to[i], from[i]) << i;
}

TEST(CopyHelpersTest, AbandonedBatchesGiveTheirHelperBack) {
  CopyHelpers one(1, absl::ZeroDuration());
  // Finished at once: most before the helper looks, so it must find the
  // batch abandoned and go back to idle each time.
  for (int i = 0; i < 2000; ++i) {
    CopyHelpers::Batch batch = one.Begin();
    batch.Finish();
  }
  // The helper is idle again: a later batch gets it.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  const int64_t before = one.batches_helped();
  std::string from(4096, 'y'), to(4096, '\0');
  while (one.batches_helped() == before && std::chrono::steady_clock::now() < until) {
    CopyHelpers::Batch batch = one.Begin();
    batch.Add(&to[0], from.data(), from.size());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    batch.Finish();
    ASSERT_EQ(to, from);
  }
  EXPECT_GT(one.batches_helped(), before);
}

TEST(CopyHelpersTest, MoreCallersThanHelpersSleepingOrPolling) {
  for (absl::Duration spin : {absl::ZeroDuration(), absl::Milliseconds(5)}) {
    CopyHelpers two(2, spin);
    std::vector<std::thread> callers;
    for (int t = 0; t < 6; ++t) {
      callers.emplace_back([&two, t] {
        for (int round = 0; round < 60; ++round) CopyAndCheck(&two, 1 + (round * 7 + t) % 80, 100000 * t + round);
      });
    }
    for (std::thread& c : callers) c.join();
  }
}

TEST(CopyHelpersTest, EveryIdleHelperJoinsABatchAndPollingHelpersStopAtOnce) {
  // Helpers that poll for a minute between batches: the crew's end must
  // not wait for the minute.
  const auto start = std::chrono::steady_clock::now();
  {
    CopyHelpers three(3, absl::Seconds(60));
    std::vector<std::string> from(64, std::string(8192, 'w')), to(64, std::string(8192, '\0'));
    CopyHelpers::Batch batch = three.Begin();
    for (int i = 0; i < 64; ++i) batch.Add(&to[i][0], from[i].data(), from[i].size());
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (three.batches_helped() < 3 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    batch.Finish();
    EXPECT_EQ(three.batches_helped(), 3);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(to[i], from[i]) << i;
    // The helpers poll now; a second batch finds all three again.
    for (std::string& t : to) t.assign(8192, '\0');
    batch = three.Begin();
    for (int i = 0; i < 64; ++i) batch.Add(&to[i][0], from[i].data(), from[i].size());
    while (three.batches_helped() < 6 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    batch.Finish();
    EXPECT_EQ(three.batches_helped(), 6);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(to[i], from[i]) << i;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(CopyHelpersTest, MovedBatchesFinishOnce) {
  CopyHelpers one(1, absl::ZeroDuration());
  std::string from(10000, 'z'), to(10000, '\0');
  CopyHelpers::Batch a = one.Begin();
  a.Add(&to[0], from.data(), 5000);
  CopyHelpers::Batch b = std::move(a);
  b.Add(&to[5000], from.data() + 5000, 5000);
  a.Finish();                // moved from: nothing to do
  b = CopyHelpers::Batch();  // finishes what b held
  EXPECT_EQ(to, from);
}

}  // namespace
}  // namespace driftkv
