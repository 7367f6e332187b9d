// Decode steps in Attend batches that fill pages on several layers at
// once (as a batch of sequences of one length does at every page
// boundary): what they store and answer against one Append per token.
#include <algorithm>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/handler.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

constexpr int kN = 128, kD = 64;

// A batch whose decode steps fill a page on several layers stores and
// answers what the same tokens appended one call at a time store and
// answer, cold and hot, and with a layer that has two steps in the batch.
TEST(HandlerBatchTest, StepsFillingPagesOnManyLayersStoreWhatAppendsStore) {
  for (bool hot : {false, true}) {
    SCOPED_TRACE(hot ? "hot tier" : "cold");
    ServiceOptions o = SmallOptions();
    o.backend_threads = 2;
    if (hot) {
      o.codec.mean_window = 128;  // level pages need P = 128
      o.hot_tier_bytes = 2 << 20;
    }
    const int p = o.codec.mean_window, r = o.window_tokens, first = r + p - 1;
    testing::TestHandler batched(o), alone(o);
    ASSERT_NE(batched.h, nullptr);
    ASSERT_NE(alone.h, nullptr);
    const std::vector<std::string> seqs = {"a", "b", "c"};
    std::vector<testing::Kv> kv;
    for (size_t s = 0; s < seqs.size(); ++s) kv.push_back(SyntheticKv(first + 2, kN, 20 + static_cast<int>(s)));
    const std::vector<float> q = SyntheticQuery(2, kD, 30);
    auto step = [&](size_t s, uint32_t layer, int t) {
      v1::AttendItem it = QueryItem(seqs[s], layer, q, 2);
      FloatToTensor(kv[s].keys.data() + static_cast<size_t>(t) * kN, kN, v1::DTYPE_F32, it.mutable_new_key());
      FloatToTensor(kv[s].values.data() + static_cast<size_t>(t) * kN, kN, v1::DTYPE_F32, it.mutable_new_value());
      it.set_new_token_index(t);
      return it;
    };
    // Each step fills a page: "a" and "b" in one batch, four layers; "c" in
    // another, where layer 1 also takes its next token.
    v1::AttendRequest warm, steps_ab, steps_c;
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        ASSERT_TRUE(batched.Push(seqs[s], layer, kv[s], 0, first).ok());
        *warm.add_items() = QueryItem(seqs[s], layer, q, 2);  // promotes, with a hot tier
        *(s < 2 ? &steps_ab : &steps_c)->add_items() = step(s, layer, first);
      }
    }
    *steps_c.add_items() = step(2, 1, first + 1);
    v1::AttendResponse resp;
    ASSERT_TRUE(batched.h->Attend(warm, &resp).ok());
    ASSERT_TRUE(batched.h->Attend(steps_ab, &resp).ok());
    ASSERT_TRUE(batched.h->Attend(steps_c, &resp).ok());
    EXPECT_EQ(batched.Stats().pages_in_use() + batched.Stats().hot_pages_in_use(), 6u);
    if (hot) {
      EXPECT_EQ(batched.Stats().hot_pages_in_use(), 6u);
    }
    // The same tokens, each layer appended alone.
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        const int tokens = first + 1 + (s == 2 && layer == 1);
        ASSERT_TRUE(alone.Push(seqs[s], layer, kv[s], 0, tokens).ok());
      }
    }
    v1::AttendRequest plain;
    for (const v1::AttendRequest* r : {&steps_ab, &steps_c}) {
      for (const v1::AttendItem& it : r->items()) *plain.add_items() = QueryItem(it.sequence_id(), it.layer(), q, 2);
    }
    v1::AttendResponse want, got;
    ASSERT_TRUE(alone.h->Attend(plain, &want).ok());
    ASSERT_TRUE(batched.h->Attend(plain, &got).ok());
    for (int i = 0; i < plain.items_size(); ++i) {
      EXPECT_EQ(got.results(i).output(), want.results(i).output()) << i;
      EXPECT_EQ(got.results(i).tokens(), want.results(i).tokens()) << i;
    }
    for (size_t s = 0; s < seqs.size(); ++s) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        EXPECT_EQ(batched.Read(seqs[s], layer), alone.Read(seqs[s], layer)) << seqs[s] << " layer " << layer;
      }
    }
    EXPECT_EQ(batched.Stats().tokens_compressed(), alone.Stats().tokens_compressed());
    EXPECT_EQ(batched.Stats().tokens_window(), alone.Stats().tokens_window());
  }
}

// Decode steps in each wire dtype store what Appends of the same tokens in
// that dtype store, through a page boundary; a repeated step with the
// stored token is accepted and one with another token refused by name.
TEST(HandlerBatchTest, StepsInEveryDtypeStoreWhatAppendsOfThatDtypeStore) {
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_FP16, v1::DTYPE_F32}) {
    SCOPED_TRACE(DTypeName(dtype));
    const ServiceOptions o = SmallOptions();
    const int start = o.window_tokens + o.codec.mean_window - 3, steps = 6;  // a page fills on the 3rd step
    testing::TestHandler stepped(o), appended(o);
    ASSERT_NE(stepped.h, nullptr);
    ASSERT_NE(appended.h, nullptr);
    const testing::Kv kv = SyntheticKv(start + steps, kN, 7);
    const std::vector<float> q = SyntheticQuery(2, kD, 8);
    v1::AppendResponse r;
    for (int t = 0; t < start + steps; t += 16) {
      const int count = std::min(16, start + steps - t);
      if (t < start) {
        ASSERT_TRUE(stepped.h->Append(testing::ChunkOf("s", 0, t, std::min(count, start - t), kv, dtype), &r).ok());
      }
      ASSERT_TRUE(appended.h->Append(testing::ChunkOf("s", 0, t, count, kv, dtype), &r).ok());
    }
    auto step = [&](int t, const testing::Kv& from) {
      v1::AttendRequest req;
      v1::AttendItem* it = req.add_items();
      *it = QueryItem("s", 0, q, 2, dtype);
      FloatToTensor(from.keys.data() + static_cast<size_t>(t) * kN, kN, dtype, it->mutable_new_key());
      FloatToTensor(from.values.data() + static_cast<size_t>(t) * kN, kN, dtype, it->mutable_new_value());
      it->set_new_token_index(t);
      v1::AttendResponse resp;
      return stepped.h->Attend(req, &resp);
    };
    for (int t = start; t < start + steps; ++t) {
      const absl::Status st = step(t, kv);
      ASSERT_TRUE(st.ok()) << t << " " << st;
    }
    EXPECT_EQ(stepped.Read("s", 0), appended.Read("s", 0));
    EXPECT_TRUE(step(start + 1, kv).ok());  // the stored token again
    const testing::Kv other = SyntheticKv(start + steps, kN, 9);
    const absl::Status st = step(start + 1, other);
    EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
    EXPECT_EQ(stepped.Read("s", 0), appended.Read("s", 0));
  }
}

}  // namespace
}  // namespace driftkv
