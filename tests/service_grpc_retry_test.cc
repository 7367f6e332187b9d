// Idempotent retries over gRPC: answers lost on purpose by a server
// interceptor after the handler ran, and what the client does about them.
#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "tests/grpc_test_fixture.h"
#include "tests/service_http.h"

namespace driftkv {
namespace {

using namespace grpc_test;  // NOLINT(build/namespaces)
using testing::QueryItem;
using testing::SyntheticKv;
using testing::SyntheticQuery;

TEST_F(GrpcTest, LostAppendAnswerIsRetriedAndStoredOnce) {
  std::atomic<int> budget{2};
  StartLosingAnswers("/Append", &budget);
  const testing::Kv kv = SyntheticKv(150, kN, 7);
  absl::StatusOr<v1::AppendResponse> a = client_->Append(Chunks("r", 0, kv, 0, 150, 40));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(client_->retries(), 2);
  EXPECT_EQ(a->tokens_stored(), 0u);  // the third attempt found everything stored
  EXPECT_EQ(a->tokens_duplicate(), 150u);
  EXPECT_EQ(Stored(), 150u);
  absl::StatusOr<v1::StatsResponse> s = client_->Stats();
  EXPECT_EQ(s->tokens_ingested(), 150u);
}

TEST_F(GrpcTest, DecodeStepIsRetriedOnlyWithTokenIndex) {
  std::atomic<int> budget{1};
  StartLosingAnswers("/Attend", &budget);
  const testing::Kv kv = SyntheticKv(52, kN, 8);
  ASSERT_TRUE(client_->Append(Chunks("d", 0, kv, 0, 50, 50)).ok());
  const std::vector<float> q = SyntheticQuery(2, kD, 9);
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  *it = QueryItem("d", 0, q, 2);
  FloatToTensor(kv.keys.data() + 50 * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
  FloatToTensor(kv.values.data() + 50 * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
  // No index: a repeat could store the token twice, so the loss is reported.
  absl::Status st = client_->Attend(req).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_->retries(), 0);
  EXPECT_EQ(Stored(), 51u);  // the server did store it once
  // With the index the client retries, and the repeat is acknowledged.
  budget = 1;
  FloatToTensor(kv.keys.data() + 51 * kN, kN, v1::DTYPE_F32, it->mutable_new_key());
  it->mutable_new_key()->erase(0, kN * 4);
  it->mutable_new_value()->clear();
  FloatToTensor(kv.values.data() + 51 * kN, kN, v1::DTYPE_F32, it->mutable_new_value());
  it->set_new_token_index(51);
  absl::StatusOr<v1::AttendResponse> r = client_->Attend(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(client_->retries(), 1);
  EXPECT_EQ(r->results(0).tokens(), 52u);
  EXPECT_EQ(Stored(), 52u);
}

// A decode step by reference (its key and value in a host region) is a
// step too: without new_token_index a lost answer is reported, not
// retried, and the token is stored once.
TEST_F(GrpcTest, DecodeStepByReferenceIsNotRetriedWithoutTokenIndex) {
  std::atomic<int> budget{1};
  ServiceOptions o = testing::SmallOptions();
  // sun_path holds 107 bytes: TEST_TMPDIR may be longer.
  o.region_socket = absl::StrCat("/tmp/driftkv-retry-test-",
                                 absl::Hex(uint64_t{std::random_device()()} << 32 | std::random_device()()), ".sock");
  StartLosingAnswers("/Attend", &budget, o);
  const testing::Kv kv = SyntheticKv(52, kN, 8);
  ASSERT_TRUE(client_->Append(Chunks("d", 0, kv, 0, 50, 50)).ok());
  absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(client_.get(), 2 * kN * sizeof(float));
  ASSERT_TRUE(region.ok()) << region.status();
  std::memcpy((*region)->data(), kv.keys.data() + 50 * kN, kN * sizeof(float));
  std::memcpy(static_cast<char*>((*region)->data()) + kN * sizeof(float), kv.values.data() + 50 * kN,
              kN * sizeof(float));
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  *it = QueryItem("d", 0, SyntheticQuery(2, kD, 9), 2);
  it->mutable_new_key_ref()->set_region_id((*region)->id());
  it->mutable_new_value_ref()->set_region_id((*region)->id());
  it->mutable_new_value_ref()->set_offset(kN * sizeof(float));
  EXPECT_EQ(client_->Attend(req).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_->retries(), 0);
  EXPECT_EQ(Stored(), 51u);
}

// Attend with the query in the caller's memory is retried as Attend: a
// lost answer is asked again and the caller's buffer holds the answer.
TEST_F(GrpcTest, LostAnswerWithTensorsApartIsRetried) {
  std::atomic<int> budget{0};
  StartLosingAnswers("/Attend", &budget);
  const testing::Kv kv = SyntheticKv(50, kN, 10);
  ASSERT_TRUE(client_->Append(Chunks("t", 0, kv, 0, 50, 50)).ok());
  v1::AttendRequest req;
  *req.add_items() = QueryItem("t", 0, SyntheticQuery(2, kD, 11), 2);
  absl::StatusOr<v1::AttendResponse> want = client_->Attend(req);
  ASSERT_TRUE(want.ok()) << want.status();
  std::string query;
  query.swap(*req.mutable_items(0)->mutable_query());
  std::string out(want->results(0).output().size(), '\0');
  std::vector<absl::string_view> queries = {query};
  std::vector<absl::Span<char>> outputs = {absl::Span<char>(out.data(), out.size())};
  budget = 1;
  absl::StatusOr<v1::AttendResponse> r = client_->Attend(req, queries, outputs);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(client_->retries(), 1);
  EXPECT_EQ(out, want->results(0).output());
}

TEST_F(GrpcTest, LostReadAnswerResumesAfterTheLastChunk) {
  std::atomic<int> budget{2};
  StartLosingAnswers("/Read", &budget);
  const testing::Kv kv = SyntheticKv(300, kN, 17);
  ASSERT_TRUE(client_->Append(Chunks("r", 1, kv, 0, 300, 100)).ok());
  absl::StatusOr<Client::Tensors> part = client_->ReadFloat("r", 1, 10, 250);
  ASSERT_TRUE(part.ok()) << part.status();
  EXPECT_EQ(part->tokens, 250u);
  absl::StatusOr<Client::Tensors> all = client_->ReadFloat("r", 1, 0, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->tokens, 300u);
  EXPECT_EQ(client_->retries(), 2);
  // What the resumed reads returned is what one clean read returns.
  EXPECT_TRUE(std::equal(part->keys.begin(), part->keys.end(), all->keys.begin() + 10 * kN));
}

TEST_F(GrpcTest, LostReleaseAnswerIsRetried) {
  std::atomic<int> budget{1};
  StartLosingAnswers("/Release", &budget);
  const testing::Kv kv = SyntheticKv(100, kN, 10);
  ASSERT_TRUE(client_->Append(Chunks("x", 0, kv, 0, 100, 100)).ok());
  EXPECT_TRUE(client_->Release("x").ok());
  EXPECT_EQ(client_->retries(), 1);
  EXPECT_EQ(client_->Stats()->pages_in_use(), 0u);
  EXPECT_EQ(client_->Release("x").status().code(), absl::StatusCode::kNotFound);
}

// Fork over the wire: shares, reads back as its source's prefix, answers
// refusals with their codes, is timed as "Fork", and is never retried (a
// lost answer is UNAVAILABLE; Length of the new id shows it was made).
TEST_F(GrpcTest, ForkOverTheWireIsNotRetried) {
  std::atomic<int> budget{0};
  ServiceOptions o = SmallOptions();
  o.metrics_listen = "127.0.0.1:0";
  StartLosingAnswers("/Fork", &budget, o);
  const testing::Kv kv = SyntheticKv(200, kN, 15);
  std::vector<v1::AppendChunk> chunks = Chunks("src", 0, kv, 0, 200, 100);
  for (const v1::AppendChunk& c : Chunks("src", 1, kv, 0, 200, 100)) chunks.push_back(c);
  ASSERT_TRUE(client_->Append(chunks).ok());
  const uint64_t pages = client_->Stats()->pages_in_use();
  absl::StatusOr<v1::ForkResponse> f = client_->Fork("src", "f", 128);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->pages_shared(), 8u);
  EXPECT_EQ(f->layers(0).tokens(), 128u);
  EXPECT_EQ(client_->Stats()->pages_in_use(), pages);
  absl::StatusOr<Client::Tensors> got = client_->ReadFloat("f", 1, 0, 0);
  absl::StatusOr<Client::Tensors> want = client_->ReadFloat("src", 1, 0, 128);
  ASSERT_TRUE(got.ok() && want.ok());
  EXPECT_EQ(got->tokens, 128u);
  EXPECT_EQ(got->keys, want->keys);
  EXPECT_EQ(got->values, want->values);
  absl::Status st = client_->Fork("ghost", "g", 32).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "source_sequence_id \"ghost\" not found");
  EXPECT_EQ(client_->Fork("src", "f", 32).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(client_->Fork("src", "g", 33).status().code(), absl::StatusCode::kInvalidArgument);
  budget = 1;
  EXPECT_EQ(client_->Fork("src", "lost", 64).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client_->retries(), 0);
  EXPECT_EQ(client_->Length("lost")->layers(1).compressed_tokens(), 64u);
  const std::string metrics = testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_TRUE(absl::StrContains(metrics, "driftkv_rpc_duration_seconds_count{code=\"OK\",method=\"Fork\"} 2"))
      << metrics;
  EXPECT_TRUE(absl::StrContains(metrics, "driftkv_rpc_duration_seconds_count{code=\"NOT_FOUND\",method=\"Fork\"} 1"));
}

}  // namespace
}  // namespace driftkv
