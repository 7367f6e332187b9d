// Helpers of the tests of the levels below the pool (host memory, disk)
// through a CPU-backend handler: sequences of two layers of synthetic KV,
// their Attend answers as bytes, a level's metric, and threads that append
// and read back while sequences move.
#ifndef DRIFTKV_TESTS_LEVEL_TEST_UTIL_H_
#define DRIFTKV_TESTS_LEVEL_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace testing {

constexpr int kLevelTokens = 200;  // per layer, P = 32: six pages and a window
constexpr int kLevelQHeads = 4;
constexpr int kLevelD = 64;

inline std::string LevelId(int i) {
  return absl::StrCat("s", i);
}

// Appends sequence i (both layers, kLevelTokens each, data of seed i).
inline absl::Status AddLevelSequence(TestHandler& t, int i) {
  const Kv kv = SyntheticKv(kLevelTokens, kSmallN, 1000 + i);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    if (absl::Status st = t.Push(LevelId(i), layer, kv, 0, kLevelTokens); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// Attend of both layers of sequence i: each answer's output and lse bytes.
inline absl::StatusOr<std::string> LevelAttendBytes(Handler& h, int i) {
  v1::AttendRequest req;
  for (uint32_t layer = 0; layer < 2; ++layer) {
    *req.add_items() = QueryItem(LevelId(i), layer, SyntheticQuery(kLevelQHeads, kLevelD, 7 + i + layer), kLevelQHeads);
  }
  v1::AttendResponse resp;
  if (absl::Status st = h.Attend(req, &resp); !st.ok()) return st;
  std::string out;
  for (const v1::AttendResult& r : resp.results()) {
    out += r.output();
    out += std::string(reinterpret_cast<const char*>(r.lse().data()), r.lse_size() * sizeof(float));
  }
  return out;
}

// How many such sequences a handler without levels holds in `pool_bytes`.
inline int PoolOnlyCapacity(uint64_t pool_bytes) {
  TestHandler t(SmallOptions(pool_bytes));
  int held = 0;
  while (AddLevelSequence(t, held).ok()) ++held;
  return held;
}

// The value of series `name` with label level=`level` (and
// direction=`direction` when given); -1 when there is none.
inline double LevelValue(Metrics& m, const std::string& name, const std::string& level,
                         const std::string& direction = "") {
  for (const auto& family : m.registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      bool level_ok = false, direction_ok = direction.empty();
      for (const auto& label : metric.label) {
        if (label.name == "level" && label.value == level) level_ok = true;
        if (label.name == "direction" && label.value == direction) direction_ok = true;
      }
      if (level_ok && direction_ok) return metric.counter.value + metric.gauge.value;
    }
  }
  return -1;
}

// `threads` threads, thread t appending sequences t * each ... (t + 1) *
// each - 1 to `moved` and, after each, reading layer 1 of every one of
// them so far back: each must equal want[i]. Each thread's first error
// ("" when none).
inline std::vector<std::string> AppendAndReadBack(TestHandler& moved, const std::vector<std::string>& want, int threads,
                                                  int each) {
  std::vector<std::string> errors(threads);
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t) {
    running.emplace_back([&, t] {
      for (int k = 0; k < each && errors[t].empty(); ++k) {
        const int i = t * each + k;
        if (absl::Status st = AddLevelSequence(moved, i); !st.ok()) {
          errors[t] = absl::StrCat("append ", i, ": ", st.ToString());
        }
        for (int j = t * each; j <= i && errors[t].empty(); ++j) {
          v1::ReadRequest req;
          req.set_sequence_id(LevelId(j));
          req.set_layer(1);
          std::string got;
          absl::Status st = moved.h->Read(req, [&](const v1::ReadChunk& c) {
            got += c.keys();
            got += c.values();
            return true;
          });
          if (!st.ok()) {
            errors[t] = absl::StrCat("read ", j, ": ", st.ToString());
          } else if (got != want[j]) {
            errors[t] = absl::StrCat("read ", j, ": bytes differ");
          }
        }
      }
    });
  }
  for (std::thread& th : running) th.join();
  return errors;
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_LEVEL_TEST_UTIL_H_
