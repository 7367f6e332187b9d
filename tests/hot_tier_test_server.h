// What the hot tier's service tests share (service_hot_tier_test,
// service_cold_copies_test): options for level pages of 128 tokens, a
// handler with the tests' Attend calls, the bytes of a layer's cold pages,
// and answers compared against a handler without a hot tier.
#ifndef DRIFTKV_TESTS_HOT_TIER_TEST_SERVER_H_
#define DRIFTKV_TESTS_HOT_TIER_TEST_SERVER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codec/level_page.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace hot_tier_test {

using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

// 2 layers x 2 KV heads x 64 (n = 128); level pages need P = 128.
constexpr int kN = 128, kD = 64, kP = 128, kR = 128, kQHeads = 4;
// 700 tokens: 4 pages and a 188-token window.
constexpr int kTokens = 700, kPages = 4;

inline uint64_t LevelPageBytes() {
  return MakeLevelPageLayout(2, kD)->page_bytes;
}

inline ServiceOptions HotOptions(int hot_pages) {
  ServiceOptions o = SmallOptions(4u << 20);
  o.codec.mean_window = kP;
  o.window_tokens = kR;
  o.hot_tier_bytes = hot_pages * LevelPageBytes();
  return o;
}

// Cold pages held for sequences: the pool's pages in use less the hot
// tier's cold copies (a cache the pool takes back on demand).
inline uint64_t Resident(const v1::StatsResponse& s) {
  return s.pages_in_use() - s.cold_copy_pages();
}

inline ServiceOptions ColdOptions() {
  ServiceOptions o = HotOptions(0);
  o.hot_tier_bytes = 0;
  return o;
}

// One Attend item's answer, as bytes (compared bit for bit).
struct Answer {
  std::string out;
  std::string lse;
  bool operator==(const Answer& o) const { return out == o.out && lse == o.lse; }
};

// A handler with its metrics and clock, and the Attend calls of these tests.
struct Server : testing::TestHandler {
  using TestHandler::TestHandler;
  // Attends every (sequence, layer) of `items` with query seed `seed`.
  absl::StatusOr<std::vector<Answer>> Attend(const std::vector<std::pair<std::string, uint32_t>>& items,
                                             uint32_t seed) {
    v1::AttendRequest req;
    for (const auto& [seq, layer] : items) {
      *req.add_items() = QueryItem(seq, layer, SyntheticQuery(kQHeads, kD, seed + layer), kQHeads);
    }
    v1::AttendResponse resp;
    absl::Status st = h->Attend(req, &resp);
    if (!st.ok()) return st;
    std::vector<Answer> out;
    for (const v1::AttendResult& r : resp.results()) {
      out.push_back(
          Answer{r.output(), std::string(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * sizeof(float))});
    }
    return out;
  }
  absl::StatusOr<Answer> Attend1(const std::string& seq, uint32_t layer, uint32_t seed = 7) {
    absl::StatusOr<std::vector<Answer>> a = Attend({{seq, layer}}, seed);
    if (!a.ok()) return a.status();
    return (*a)[0];
  }
};

// The bytes of a layer's cold pages, in order; empty when it is hot.
inline std::string ColdBytes(Handler& h, const std::string& seq, uint32_t layer) {
  std::string out;
  h.WithLayerForTest(seq, layer, [&](LayerState& l) {
    if (l.hot) return;
    for (PageId p : l.pages) out.append(reinterpret_cast<const char*>(h.pool().page(p)), h.pool().page_stride());
  });
  return out;
}

// Layers [0, layers) of `id` attended together on both servers: the same
// bits.
inline void ExpectSameAnswer(Server& cold, Server& hot, const std::string& id, uint32_t layers = 1) {
  std::vector<std::pair<std::string, uint32_t>> items;
  for (uint32_t l = 0; l < layers; ++l) items.emplace_back(id, l);
  absl::StatusOr<std::vector<Answer>> want = cold.Attend(items, 7), got = hot.Attend(items, 7);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(*got == *want) << id;
}

// Layers 0 and 1 of `id` pushed to both servers (keys and values of seed
// `seed` and `seed + 1`); *original: the hot server's cold bytes of each.
inline void PushTwoLayers(Server& hot, Server& cold, const std::string& id, uint32_t seed,
                          std::vector<std::string>* original) {
  for (uint32_t layer : {0u, 1u}) {
    const testing::Kv kv = SyntheticKv(kTokens, kN, seed + layer);
    for (Server* s : {&hot, &cold}) ASSERT_TRUE(s->Push(id, layer, kv, 0, kTokens).ok());
    original->push_back(ColdBytes(*hot.h, id, layer));
  }
}

// A cold pool of `pages` pages beside a hot tier of 16.
inline ServiceOptions PoolOf(int pages) {
  ServiceOptions o = HotOptions(16);
  testing::TestHandler probe(o);
  o.pool_bytes = static_cast<uint64_t>(pages) * probe.h->pool().page_stride();
  return o;
}

// Three sequences of one layer pushed to both servers, and the cold
// server's answer for each.
inline void PushThree(const std::vector<std::string>& ids, Server& cold, Server& hot, std::vector<Answer>* want) {
  for (int i = 0; i < 3; ++i) {
    const testing::Kv kv = SyntheticKv(kTokens, kN, 20 + i);
    for (Server* s : {&cold, &hot}) ASSERT_TRUE(s->Push(ids[i], 0, kv, 0, kTokens).ok());
    absl::StatusOr<Answer> a = cold.Attend1(ids[i], 0);
    ASSERT_TRUE(a.ok());
    want->push_back(*a);
  }
}

// Four threads attend the three sequences 12 times each, in turn; every
// call must answer, bit for bit what `want` holds.
inline void AttendFromFourThreads(Server& hot, const std::vector<std::string>& ids, const std::vector<Answer>& want) {
  std::atomic<int> wrong{0}, failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        const int k = (t + i) % 3;
        absl::StatusOr<Answer> got = hot.Attend1(ids[k], 0);
        if (!got.ok()) {
          ++failed;
        } else if (!(*got == want[k])) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace hot_tier_test
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_HOT_TIER_TEST_SERVER_H_
