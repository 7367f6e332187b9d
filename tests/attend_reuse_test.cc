// AttendReuse (service/attend_reuse.h): a request's calls that use what an
// earlier call kept answer what calls without it answer, see every change
// of state between them (new queries in the region, appends, a released
// or recreated sequence, an unregistered region, another tenant), and
// only requests without decode steps or inline tensors are kept. On the
// CPU, with the stand-in for a backend that addresses client memory
// (tests/host_addressing_backend.h), behind a real server's regions.
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/doorbell.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "service/attend_reuse.h"
#include "service/handler.h"
#include "service/server.h"
#include "tests/data_plane_items.h"
#include "tests/host_addressing_backend.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::Answer;
using testing::ByRef;
using testing::ExpectSame;
using testing::Gaussian;
using testing::HostArena;
using testing::ItemSpec;
using testing::kD;
using testing::kSmallN;
using testing::OutBytes;
using testing::RefAnswer;

constexpr int kPrefill = 150;

class AttendReuseTest : public testing::LoopbackFixture {
 protected:
  void SetUp() override {
    ASSERT_TRUE(testing::kHostAddressingRegistered);
    ServiceOptions o = testing::SmallOptions(32u << 20);
    o.backend = "host_addressing";
    o.region_socket = absl::StrCat("/tmp/driftkv-attend-reuse-test-",
                                   absl::Hex(uint64_t{std::random_device()()} << 32 | std::random_device()()), ".sock");
    Start(o);
    for (const char* seq : {"s0", "s1"}) Fill(seq, 1);
    absl::StatusOr<std::unique_ptr<HostRegion>> r = HostRegion::Create(client_.get(), 1 << 20);
    ASSERT_TRUE(r.ok()) << r.status();
    region_ = *std::move(r);
    arena_ = std::make_unique<HostArena>(region_.get());
    // Queries f32 and bf16, outputs f32 and bf16, both layers, GQA 1 and 2.
    for (int k = 0; k < 4; ++k) {
      ItemSpec s;
      s.seq = k < 2 ? "s0" : "s1";
      s.layer = static_cast<uint32_t>(k % 2);
      s.q_heads = 2 * (1 + k % 2);
      s.dtype = k % 2 == 0 ? v1::DTYPE_F32 : v1::DTYPE_BF16;
      s.out_dtype = k < 2 ? v1::DTYPE_BF16 : v1::DTYPE_F32;
      s.query = Gaussian(static_cast<size_t>(s.q_heads) * kD, 20 + k);
      specs_.push_back(s);
      *request_.add_items() = ByRef(s, "", *arena_);
    }
  }
  void TearDown() override {
    arena_.reset();
    region_.reset();
    LoopbackFixture::TearDown();
  }
  // kPrefill tokens of `seq` in both layers (content from `seed`);
  // `again`: a new sequence under a released one's id.
  void Fill(const std::string& seq, uint32_t seed, bool again = false) {
    std::vector<v1::AppendChunk> chunks;
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const testing::Kv kv = testing::SyntheticKv(kPrefill, kSmallN, seed * 10 + layer + (seq == "s1" ? 5 : 0));
      chunks.push_back(testing::ChunkOf(seq, layer, 0, kPrefill, kv));
      chunks.back().set_new_incarnation(again);
    }
    absl::StatusOr<v1::AppendResponse> r = client_->Append(chunks);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // New queries in the region, in place (a decode loop's next step).
  void NewQueries(uint32_t seed) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      specs_[i].query = Gaussian(specs_[i].query.size(), seed + i);
      std::string bytes;
      FloatToTensor(specs_[i].query.data(), specs_[i].query.size(), specs_[i].dtype, &bytes);
      std::memcpy(arena_->At(request_.items(i).query_ref()), bytes.data(), bytes.size());
    }
  }
  // One call, outputs cleared first; the answers as bytes.
  absl::StatusOr<std::vector<Answer>> Call(AttendReuse* reuse, const std::string& tenant = "") {
    for (int i = 0; i < request_.items_size(); ++i) {
      std::memset(arena_->At(request_.items(i).output_ref()), 0xa5, OutBytes(specs_[i]));
      std::memset(arena_->At(request_.items(i).lse_ref()), 0xa5, specs_[i].q_heads * 4);
    }
    v1::AttendResponse r;
    absl::Status st = server_->handler().Attend(request_, &r, tenant, nullptr, reuse);
    if (!st.ok()) return st;
    std::vector<Answer> out;
    for (int i = 0; i < request_.items_size(); ++i) {
      out.push_back(RefAnswer(specs_[i], request_.items(i), r.results(i), *arena_));
    }
    return out;
  }
  // A call with `reuse`, then the same call without: the same answers.
  void ExpectReusedAnswersFresh(AttendReuse* reuse, const std::string& what) {
    absl::StatusOr<std::vector<Answer>> kept = Call(reuse);
    ASSERT_TRUE(kept.ok()) << what << ": " << kept.status();
    absl::StatusOr<std::vector<Answer>> fresh = Call(nullptr);
    ASSERT_TRUE(fresh.ok()) << what << ": " << fresh.status();
    for (size_t i = 0; i < kept->size(); ++i) ExpectSame((*fresh)[i], (*kept)[i], absl::StrCat(what, " item ", i));
  }

  std::unique_ptr<HostRegion> region_;
  std::unique_ptr<HostArena> arena_;
  std::vector<ItemSpec> specs_;
  v1::AttendRequest request_;
};

TEST_F(AttendReuseTest, KeptCallsAnswerWhatFreshCallsAnswer) {
  AttendReuse reuse;
  ExpectReusedAnswersFresh(&reuse, "first call (keeps)");
  EXPECT_FALSE(reuse.empty());
  for (uint32_t step = 0; step < 3; ++step) {
    NewQueries(100 + 10 * step);
    ExpectReusedAnswersFresh(&reuse, absl::StrCat("step ", step));
    EXPECT_FALSE(reuse.empty());
  }
}

TEST_F(AttendReuseTest, AppendsBetweenCallsAreAttended) {
  AttendReuse reuse;
  ExpectReusedAnswersFresh(&reuse, "before");
  const testing::Kv more = testing::SyntheticKv(kPrefill + 40, kSmallN, 77);
  absl::StatusOr<v1::AppendResponse> a = client_->Append({testing::ChunkOf("s0", 0, kPrefill, 40, more)});
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::vector<Answer>> kept = Call(&reuse);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)[0].tokens, static_cast<uint64_t>(kPrefill + 40));
  ExpectReusedAnswersFresh(&reuse, "after the append");
}

TEST_F(AttendReuseTest, AReleasedSequenceIsNotFoundAndItsSuccessorIsAttended) {
  AttendReuse reuse;
  ExpectReusedAnswersFresh(&reuse, "before");
  ASSERT_TRUE(client_->Release("s1").ok());
  absl::StatusOr<std::vector<Answer>> kept = Call(&reuse);
  absl::StatusOr<std::vector<Answer>> fresh = Call(nullptr);
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kept.status(), fresh.status());
  EXPECT_TRUE(reuse.empty());
  Fill("s1", 9, true);  // the same id, other tokens
  ExpectReusedAnswersFresh(&reuse, "the new s1 (keeps again)");
  ExpectReusedAnswersFresh(&reuse, "the new s1, kept");
}

TEST_F(AttendReuseTest, AnUnregisteredRegionIsNotFoundAsWithoutReuse) {
  AttendReuse reuse;
  ExpectReusedAnswersFresh(&reuse, "before");
  ASSERT_TRUE(region_->Unregister().ok());
  v1::AttendResponse kept, fresh;
  const absl::Status a = server_->handler().Attend(request_, &kept, "", nullptr, &reuse);
  const absl::Status b = server_->handler().Attend(request_, &fresh, "", nullptr, nullptr);
  EXPECT_EQ(a.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(reuse.empty());
}

TEST_F(AttendReuseTest, AnotherTenantGetsWhatItWouldGetWithoutReuse) {
  AttendReuse reuse;
  ExpectReusedAnswersFresh(&reuse, "before");
  absl::StatusOr<std::vector<Answer>> kept = Call(&reuse, "bob");
  absl::StatusOr<std::vector<Answer>> fresh = Call(nullptr, "bob");
  EXPECT_FALSE(kept.ok());
  EXPECT_EQ(kept.status(), fresh.status());
}

TEST_F(AttendReuseTest, RequestsWithStepsOrInlineTensorsAreNotKept) {
  AttendReuse with_step, with_inline;
  v1::AttendRequest stepping = request_;
  const testing::Kv kv = testing::SyntheticKv(kPrefill + 1, kSmallN, 3);
  v1::AttendItem* it = stepping.mutable_items(0);
  it->set_dtype(v1::DTYPE_F32);
  FloatToTensor(kv.keys.data() + static_cast<size_t>(kPrefill) * kSmallN, kSmallN, v1::DTYPE_F32,
                it->mutable_new_key());
  FloatToTensor(kv.values.data() + static_cast<size_t>(kPrefill) * kSmallN, kSmallN, v1::DTYPE_F32,
                it->mutable_new_value());
  v1::AttendResponse r;
  absl::Status st = server_->handler().Attend(stepping, &r, "", nullptr, &with_step);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(with_step.empty());
  v1::AttendRequest inline_query = request_;
  v1::AttendItem* q = inline_query.mutable_items(1);
  q->clear_query_ref();
  FloatToTensor(specs_[1].query.data(), specs_[1].query.size(), specs_[1].dtype, q->mutable_query());
  st = server_->handler().Attend(inline_query, &r, "", nullptr, &with_inline);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(with_inline.empty());
}

// Through a doorbell: prepared calls (which keep) answer what plain ones
// answer, call after call.
TEST_F(AttendReuseTest, PreparedDoorbellCallsAnswerWhatPlainOnesAnswer) {
  absl::StatusOr<std::unique_ptr<HostRegion>> bell_region =
      HostRegion::Create(client_.get(), DoorbellClient::Bytes(1 << 16, 1 << 16));
  ASSERT_TRUE(bell_region.ok()) << bell_region.status();
  absl::StatusOr<std::unique_ptr<DoorbellClient>> bell =
      DoorbellClient::Open(client_.get(), bell_region->get(), 0, 1 << 16, 1 << 16);
  ASSERT_TRUE(bell.ok()) << bell.status();
  ASSERT_TRUE((*bell)->Prepare(0, request_).ok());
  for (uint32_t step = 0; step < 4; ++step) {
    NewQueries(300 + 10 * step);
    v1::AttendResponse r;
    absl::Status st = (*bell)->AttendPrepared(0, 0, &r);
    ASSERT_TRUE(st.ok()) << st;
    std::vector<Answer> prepared;
    for (int i = 0; i < request_.items_size(); ++i) {
      prepared.push_back(RefAnswer(specs_[i], request_.items(i), r.results(i), *arena_));
    }
    absl::StatusOr<std::vector<Answer>> fresh = Call(nullptr);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    for (size_t i = 0; i < prepared.size(); ++i) {
      ExpectSame((*fresh)[i], prepared[i], absl::StrCat("step ", step, " item ", i));
    }
  }
  bell->reset();
}

}  // namespace
}  // namespace driftkv
