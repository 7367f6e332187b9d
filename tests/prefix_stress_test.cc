// The prefix cache under 16 clients at once, in process (docs/prefix_cache.md,
// "Stress"): each client in turn looks up a prompt (two shared by all, one
// of its own), forks from the prefix held, appends the rest with ids,
// attends, reads the sequence back and compares it bit for bit with the
// same tokens pushed whole into a reference handler, and releases it; one
// of them pins and unpins the shared prompts now and then. The pool holds
// a fraction of what the clients would hold without sharing, so pages are
// evicted throughout and Appends are refused when nothing can go. After
// the clients stop: every reference count returns to zero and the pool
// holds the pins' pages alone, then nothing.
//
// Runs DRIFTKV_STRESS_SECONDS seconds (5 when unset; tests/BUILD sets 60,
// so `bazel test` and CI run a minute).
#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

using testing::Kv;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::TestHandler;
using C = absl::StatusCode;

constexpr int kN = testing::kSmallN, kLayers = 2, kClients = 16, kTokens = 320;

std::vector<uint32_t> Ids(int count, uint32_t seed) {
  std::vector<uint32_t> ids(count);
  for (int i = 0; i < count; ++i) ids[i] = (seed * 7919u + static_cast<uint32_t>(i) * 104729u) % 50000u;
  return ids;
}

absl::Status Push(Handler& h, const std::string& seq, const Kv& kv, const std::vector<uint32_t>& ids, int from) {
  v1::AppendResponse r;
  for (uint32_t l = 0; l < kLayers; ++l) {
    v1::AppendChunk c = testing::ChunkOf(seq, l, from, kTokens - from, kv);
    for (int i = from; i < kTokens; ++i) c.add_token_ids(ids[i]);
    if (absl::Status st = h.Append(c, &r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string Stored(Handler& h, const std::string& seq) {
  std::string all;
  for (uint32_t l = 0; l < kLayers; ++l) all += testing::ReadLayerBytes(h, seq, l);
  return all;
}

double Seconds() {
  const char* s = std::getenv("DRIFTKV_STRESS_SECONDS");
  return s != nullptr && std::atof(s) > 0 ? std::atof(s) : 5.0;
}

TEST(PrefixStress, SixteenClientsForkAppendAttendAndReleaseUnderPressure) {
  size_t stride = 0;
  {
    TestHandler probe(SmallOptions());
    stride = probe.h->pool().page_stride();
  }
  // 18 pages per sequence; 16 clients at once without sharing hold 288.
  TestHandler t(SmallOptions(160 * stride), testing::FixtureClock::kReal);
  TestHandler ref(SmallOptions(), testing::FixtureClock::kReal);
  constexpr int kShared = 2, kPrompts = kShared + kClients;
  std::vector<Kv> kv;
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::string> expected;
  for (int p = 0; p < kPrompts; ++p) {
    kv.push_back(SyntheticKv(kTokens, kN, 40 + p));
    ids.push_back(Ids(kTokens, 40 + p));
    const std::string id = absl::StrCat("whole", p);
    ASSERT_TRUE(Push(*ref.h, id, kv[p], ids[p], 0).ok());
    expected.push_back(Stored(*ref.h, id));
  }
  const absl::Time end = absl::Now() + absl::Seconds(Seconds());
  std::atomic<int> failures{0};
  std::atomic<int64_t> requests{0}, refused{0}, forked{0};
  std::vector<std::thread> clients;
  for (int w = 0; w < kClients; ++w) {
    clients.emplace_back([&, w] {
      for (int i = 0; absl::Now() < end; ++i) {
        const int p = i % 3 == 2 ? kShared + w : i % kShared;
        const std::string id = absl::StrCat("c", w, "-", i);
        if (w == 0 && i % 4 == 0) {
          v1::PinRequest pin;
          // Pin "sys0" holds shared prompt 0, "sys1" prompt 1; renewed in turn.
          const int shared = i / 4 % kShared;
          pin.set_pin_id(absl::StrCat("sys", shared));
          pin.mutable_prefix_token_ids()->Add(ids[shared].begin(), ids[shared].end());
          pin.set_tokens(128);
          pin.set_ttl_seconds(30);
          v1::PinResponse pr;
          absl::Status st = t.h->Pin(pin, &pr);
          if (!st.ok() && st.code() != C::kNotFound) ++failures;
        }
        v1::ForkRequest f;
        f.set_sequence_id(id);
        f.mutable_prefix_token_ids()->Add(ids[p].begin(), ids[p].end());
        v1::ForkResponse fr;
        const int from = t.h->Fork(f, &fr).ok() ? static_cast<int>(fr.tokens()) : 0;
        if (from > 0) ++forked;
        absl::Status st = Push(*t.h, id, kv[p], ids[p], from);
        if (st.ok()) {
          v1::AttendRequest a;
          *a.add_items() = testing::QueryItem(id, 1, testing::SyntheticQuery(4, 64, 7), 4);
          v1::AttendResponse ar;
          if (!t.h->Attend(a, &ar).ok()) ++failures;
          if (Stored(*t.h, id) != expected[p]) ++failures;
        } else if (st.code() == C::kResourceExhausted) {
          ++refused;
        } else {
          ++failures;
        }
        ++requests;
        v1::ReleaseRequest rel;
        rel.set_sequence_id(id);
        v1::ReleaseResponse rr;
        (void)t.h->Release(rel, &rr);
      }
    });
  }
  for (std::thread& c : clients) c.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(forked.load(), 0);
  EXPECT_GT(t.h->prefix_index().evictions(), 0u);
  std::printf("%lld requests by %d clients, %lld forks, %lld refused for room, %llu evictions\n",
              static_cast<long long>(requests.load()), kClients, static_cast<long long>(forked.load()),
              static_cast<long long>(refused.load()), static_cast<unsigned long long>(t.h->prefix_index().evictions()));
  // Only the pins and the cache are left; evicting the cache leaves the pins.
  EXPECT_EQ(t.Stats().sequences(), 0u);
  t.h->prefix_index().EvictAll();
  EXPECT_EQ(t.Stats().pages_in_use(), static_cast<uint64_t>(t.h->pins().pages()));
  for (const char* pin : {"sys0", "sys1"}) {
    v1::UnpinRequest u;
    u.set_pin_id(pin);
    v1::UnpinResponse ur;
    (void)t.h->Unpin(u, &ur);
  }
  t.h->prefix_index().EvictAll();
  EXPECT_EQ(t.Stats().pages_in_use(), 0u);
  for (PageId q = 0; q < t.h->pool().capacity_pages(); ++q) EXPECT_EQ(t.h->pool().references(q), 0) << q;
}

}  // namespace
}  // namespace driftkv
