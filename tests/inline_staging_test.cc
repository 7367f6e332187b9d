// Inline Attend tensors through pinned staging (service/pinned_staging.h):
// on a backend that addresses client memory, inline queries are read and
// inline outputs written where the device reads and writes a host region.
// Checked on the CPU with a stand-in for such a backend: the CPU backend
// behind the CUDA backend's contract (CLIENT MEMORY in backends/backend.h),
// against the plain CPU backend, whose handler path converts to floats.
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "backends/registry.h"
#include "gtest/gtest.h"
#include "service/attend_io.h"
#include "service/attend_wire.h"
#include "service/handler.h"
#include "service/pinned_staging.h"
#include "tests/byte_buffer_bytes.h"
#include "tests/handler_fixture.h"
#include "tests/host_addressing_backend.h"
#include "tests/service_test_util.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::ByteBufferBytes;

using testing::g_outputs_written_in_place;
using testing::g_pins;
using testing::g_queries_read_in_place;
using testing::Kv;
using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

constexpr int kN = testing::kSmallN, kD = 64;

// A handler on the stand-in and one on the CPU backend, holding the same
// tokens: sequences "a" and "b", both layers, `tokens` each.
struct Pair {
  explicit Pair(bool hot, int tokens = 150) : staged(Options(hot, "host_addressing")), plain(Options(hot, "cpu")) {
    for (const char* s : {"a", "b"}) {
      kv.push_back(SyntheticKv(tokens + 4, kN, s[0]));
      for (uint32_t layer = 0; layer < 2; ++layer) {
        EXPECT_TRUE(staged.Push(s, layer, kv.back(), 0, tokens).ok());
        EXPECT_TRUE(plain.Push(s, layer, kv.back(), 0, tokens).ok());
      }
    }
  }
  static ServiceOptions Options(bool hot, const char* backend) {
    ServiceOptions o = SmallOptions();
    o.backend = backend;
    if (hot) {
      o.codec.mean_window = 128;  // level pages need P = 128
      o.hot_tier_bytes = 2 << 20;
    }
    return o;
  }
  testing::TestHandler staged, plain;
  std::vector<Kv> kv;
};

// Items over both sequences and layers, with every query dtype and output
// dtype; with `step_at` >= 0 each carries that token of its sequence as a
// bf16 decode step.
v1::AttendRequest MixedRequest(const std::vector<Kv>& kv, int step_at) {
  v1::AttendRequest req;
  const v1::DType dtypes[] = {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_FP16};
  int k = 0;
  for (int s = 0; s < 2; ++s) {
    for (uint32_t layer = 0; layer < 2; ++layer, ++k) {
      const int q_heads = 2 * (1 + k % 2);
      v1::AttendItem it =
          QueryItem(s == 0 ? "a" : "b", layer, SyntheticQuery(q_heads, kD, 40 + k), q_heads, dtypes[k % 3]);
      it.set_output_dtype(k % 2 == 0 ? v1::DTYPE_BF16 : v1::DTYPE_F32);
      if (step_at >= 0) {
        const size_t at = static_cast<size_t>(step_at) * kN;
        it.set_dtype(v1::DTYPE_BF16);
        it.mutable_query()->clear();
        FloatToTensor(SyntheticQuery(q_heads, kD, 40 + k).data(), static_cast<size_t>(q_heads) * kD, v1::DTYPE_BF16,
                      it.mutable_query());
        FloatToTensor(kv[s].keys.data() + at, kN, v1::DTYPE_BF16, it.mutable_new_key());
        FloatToTensor(kv[s].values.data() + at, kN, v1::DTYPE_BF16, it.mutable_new_value());
        it.set_new_token_index(step_at);
      }
      *req.add_items() = it;
    }
  }
  return req;
}

void ExpectSameAnswers(const v1::AttendResponse& a, const v1::AttendResponse& b) {
  ASSERT_EQ(a.results_size(), b.results_size());
  for (int i = 0; i < a.results_size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.results(i).output(), b.results(i).output());
    ASSERT_EQ(a.results(i).lse_size(), b.results(i).lse_size());
    for (int h = 0; h < a.results(i).lse_size(); ++h) EXPECT_EQ(a.results(i).lse(h), b.results(i).lse(h));
    EXPECT_EQ(a.results(i).tokens(), b.results(i).tokens());
  }
}

// Inline queries of every dtype and outputs of both, with and without
// decode steps, cold and hot: the staged path answers the host path's
// bytes, reads every query and writes every output in place, and pins its
// staging once for all the calls.
TEST(InlineStagingTest, StagedInlineTensorsAnswerWhatTheHostPathAnswers) {
  for (bool hot : {false, true}) {
    SCOPED_TRACE(hot ? "hot tier" : "cold");
    const int pins = g_pins;
    Pair p(hot);
    for (int step_at : {-1, 150, 151, -1}) {
      SCOPED_TRACE(step_at);
      const v1::AttendRequest req = MixedRequest(p.kv, step_at);
      const int read = g_queries_read_in_place, written = g_outputs_written_in_place;
      v1::AttendResponse staged, plain;
      absl::Status st = p.staged.h->Attend(req, &staged);
      ASSERT_TRUE(st.ok()) << st;
      st = p.plain.h->Attend(req, &plain);
      ASSERT_TRUE(st.ok()) << st;
      ExpectSameAnswers(staged, plain);
      EXPECT_EQ(g_queries_read_in_place - read, req.items_size());
      EXPECT_EQ(g_outputs_written_in_place - written, req.items_size());
    }
    EXPECT_EQ(g_pins - pins, 1);
    EXPECT_EQ(p.staged.Read("a", 1), p.plain.Read("a", 1));
  }
}

// A non-finite inline query is refused with the host path's words, with
// or without a decode step, and a refused step stores nothing.
TEST(InlineStagingTest, NonFiniteInlineQueryIsRefusedByNameAndChangesNothing) {
  for (bool step : {false, true}) {
    SCOPED_TRACE(step ? "with decode steps" : "without");
    Pair p(false);
    v1::AttendRequest req = MixedRequest(p.kv, step ? 150 : -1);
    std::string* q = req.mutable_items(1)->mutable_query();
    const v1::DType dtype = req.items(1).dtype();
    std::vector<float> values(q->size() / DTypeBytes(dtype));
    TensorToFloat(*q, dtype, values.size(), values.data());
    values[5] = std::numeric_limits<float>::quiet_NaN();
    q->clear();
    FloatToTensor(values.data(), values.size(), dtype, q);
    const std::string before = p.staged.Read("a", 0);
    v1::AttendResponse staged, plain;
    const absl::Status a = p.staged.h->Attend(req, &staged), b = p.plain.h->Attend(req, &plain);
    EXPECT_EQ(a.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(a.message(), "items[1].query element 5 is nan; must be finite");
    EXPECT_EQ(a, b);
    EXPECT_EQ(p.staged.Read("a", 0), before);
    // The item after the refused one had its step refused too.
    EXPECT_EQ(p.staged.Read("b", 0), p.plain.Read("b", 0));
  }
}

// Concurrent callers each take their own staging and get the answers they
// get alone.
TEST(InlineStagingTest, ConcurrentCallersGetTheirLoneAnswers) {
  Pair p(true);
  const v1::AttendRequest req = MixedRequest(p.kv, -1);
  v1::AttendResponse alone;
  ASSERT_TRUE(p.plain.h->Attend(req, &alone).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 20; ++k) {
        v1::AttendResponse r;
        if (!p.staged.h->Attend(req, &r).ok() || r.SerializeAsString() != alone.SerializeAsString()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
}

// Outputs left in the staging (what the gRPC edge asks for) go on the wire
// as the bytes of the copied answer; the staging stays leased, and so
// unchanged, while its answer is on its way: the calls made meanwhile take
// other buffers, and the staging comes back to the pool once sent.
TEST(InlineStagingTest, OutputsLeftInStagingGoOutAsTheCopiedAnswer) {
  Pair p(true);
  const v1::AttendRequest first = MixedRequest(p.kv, -1);
  v1::AttendRequest second = first;
  for (v1::AttendItem& it : *second.mutable_items()) {  // other queries: -0.5x
    std::vector<float> q(it.query().size() / DTypeBytes(it.dtype()));
    TensorToFloat(it.query(), it.dtype(), q.size(), q.data());
    for (float& x : q) x *= -0.5f;
    it.clear_query();
    FloatToTensor(q.data(), q.size(), it.dtype(), it.mutable_query());
  }
  v1::AttendResponse want_first, want_second;
  ASSERT_TRUE(p.plain.h->Attend(first, &want_first).ok());
  ASSERT_TRUE(p.plain.h->Attend(second, &want_second).ok());
  ASSERT_NE(want_first.SerializeAsString(), want_second.SerializeAsString());

  v1::AttendResponse r1;
  StagedOutputs s1;
  ASSERT_TRUE(p.staged.h->Attend(first, &r1, "", &s1).ok());
  ASSERT_EQ(s1.outputs.size(), static_cast<size_t>(first.items_size()));
  for (int i = 0; i < r1.results_size(); ++i) EXPECT_TRUE(r1.results(i).output().empty()) << i;
  const int pins = g_pins;
  grpc::ByteBuffer b1 = AttendResponseBuffer(r1, std::move(s1));
  // Calls while b1 is held: each writes its own staging.
  for (int k = 0; k < 3; ++k) {
    v1::AttendResponse r2;
    StagedOutputs s2;
    ASSERT_TRUE(p.staged.h->Attend(second, &r2, "", &s2).ok());
    EXPECT_EQ(ByteBufferBytes(AttendResponseBuffer(r2, std::move(s2))), want_second.SerializeAsString());
  }
  EXPECT_EQ(g_pins - pins, 1);  // one more buffer, reused by the three calls
  EXPECT_EQ(ByteBufferBytes(b1), want_first.SerializeAsString());
  b1.Clear();
  v1::AttendResponse r3;
  StagedOutputs s3;
  ASSERT_TRUE(p.staged.h->Attend(first, &r3, "", &s3).ok());
  EXPECT_EQ(ByteBufferBytes(AttendResponseBuffer(r3, std::move(s3))), want_first.SerializeAsString());
  EXPECT_EQ(g_pins - pins, 1);  // b1's buffer came back: nothing pinned anew
}

// A refused call leaves nothing named in its StagedOutputs.
TEST(InlineStagingTest, ARefusedCallLeavesNoStagedOutputs) {
  Pair p(false);
  v1::AttendRequest req = MixedRequest(p.kv, -1);
  req.mutable_items(3)->set_sequence_id("nobody");
  v1::AttendResponse r;
  StagedOutputs s;
  EXPECT_EQ(p.staged.h->Attend(req, &r, "", &s).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.outputs.empty());
  EXPECT_EQ(s.lease, nullptr);
}

// The pool's own rules, on a backend that counts pins (and may refuse).
class CountingBackend : public Backend {
 public:
  std::string name() const override { return "counting"; }
  absl::Status EncodePages(absl::Span<EncodeJob>) override { return absl::OkStatus(); }
  absl::Status DecodeTokens(PageId, int, int, int, float*, float*) override { return absl::OkStatus(); }
  void Attend(absl::Span<AttendJob>) override {}
  absl::Status PinHostRegion(void*, size_t bytes) override {
    if (refuse) return absl::ResourceExhaustedError("no");
    ++pins;
    pinned_bytes += bytes;
    return absl::OkStatus();
  }
  void UnpinHostRegion(void*) override { ++unpins; }
  bool refuse = false;
  int pins = 0, unpins = 0;
  size_t pinned_bytes = 0;
};

TEST(PinnedStagingPoolTest, BuffersArePinnedOnceReusedGrownAndUnpinnedAtTheEnd) {
  CountingBackend b;
  {
    PinnedStagingPool pool(&b);
    void* first = nullptr;
    {
      PinnedStagingPool::Lease l = pool.Take(1000);
      ASSERT_GE(l.capacity(), 1000u);
      first = l.Claim(10);
      void* second = l.Claim(10);
      ASSERT_NE(first, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
      EXPECT_EQ(static_cast<char*>(second) - static_cast<char*>(first), 64);
      EXPECT_EQ(l.Claim(l.capacity()), nullptr);  // past what is left
    }
    {
      PinnedStagingPool::Lease l = pool.Take(2000);
      EXPECT_EQ(l.Claim(1), first);                      // the same buffer again
      PinnedStagingPool::Lease other = pool.Take(2000);  // taken: a second one
      EXPECT_NE(other.Claim(1), first);
    }
    EXPECT_EQ(b.pins, 2);
    PinnedStagingPool::Lease big = pool.Take(3 << 20);
    EXPECT_GE(big.capacity(), size_t{3} << 20);
    EXPECT_EQ(b.pins, 3);    // one grown
    EXPECT_EQ(b.unpins, 1);  // in place of a small one
    EXPECT_EQ(pool.Take(PinnedStagingPool::kMaxBytes + 1).capacity(), 0u);
    EXPECT_EQ(pool.Take(0).capacity(), 0u);
  }
  EXPECT_EQ(b.unpins, b.pins);
}

TEST(PinnedStagingPoolTest, MemoryThatCannotBePinnedGivesAnEmptyLease) {
  CountingBackend b;
  b.refuse = true;
  PinnedStagingPool pool(&b);
  PinnedStagingPool::Lease l = pool.Take(100);
  EXPECT_EQ(l.capacity(), 0u);
  EXPECT_EQ(l.Claim(1), nullptr);
}

}  // namespace
}  // namespace driftkv
