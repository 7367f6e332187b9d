// TensorSlicesBuffer and TensorSlices (wire/tensor_slices.h) on requests
// and answers: a request written with its queries apart parses (protobuf)
// as the request with them inside, each query goes out as a slice of the
// caller's memory, and an answer written with its outputs apart reads
// back, however it is cut, with each output a view of the bytes it came
// in. (The reader against protobuf on cut, truncated and corrupt bytes:
// attend_request_wire_test and fuzz_attend_request_wire.)
#include "wire/tensor_slices.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <random>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/driftkv.pb.h"
#include "tests/byte_buffer_bytes.h"

namespace driftkv {
namespace {

using testing::ByteBufferBytes;

grpc::Slice Borrowed(absl::string_view v) {
  return grpc::Slice(v.data(), v.size(), grpc::Slice::STATIC_SLICE);
}

std::string Random(std::mt19937* rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>((*rng)());
  return s;
}

TEST(TensorSlices, ARequestWithItsQueriesApartParsesAsTheRequest) {
  std::mt19937 rng(1);
  v1::AttendRequest want, apart;
  std::vector<std::string> memory;
  for (int i = 0; i < 9; ++i) {
    v1::AttendItem* it = want.add_items();
    it->set_sequence_id("seq-" + std::to_string(i));
    it->set_layer(3);
    it->set_q_heads(32);
    it->set_dtype(v1::DTYPE_BF16);
    it->set_output_dtype(v1::DTYPE_BF16);
    if (i % 3 == 1) it->set_new_token_index(100 + i);
    if (i % 4 != 2) it->set_query(Random(&rng, i == 5 ? 70 : 8192));  // 1- and 2-byte lengths
    memory.push_back(it->query());
  }
  std::vector<absl::string_view> queries;
  for (int i = 0; i < want.items_size(); ++i) {
    *apart.add_items() = want.items(i);
    apart.mutable_items(i)->clear_query();
    queries.push_back(memory[i]);
  }
  queries.pop_back();  // the last item past the end: no query, as its own
  apart.mutable_items(want.items_size() - 1)->set_query(memory.back());
  const grpc::ByteBuffer buffer =
      TensorSlicesBuffer(TensorSlicesItems(apart.items()), v1::AttendItem::kQueryFieldNumber, queries, Borrowed);
  v1::AttendRequest got;
  ASSERT_TRUE(got.ParseFromString(ByteBufferBytes(buffer)));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(got, want));

  // Each query went out as a slice of the caller's memory, not a copy.
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  int borrowed = 0;
  for (const grpc::Slice& s : slices) {
    for (absl::string_view q : queries) {
      if (!q.empty() && reinterpret_cast<const char*>(s.begin()) == q.data() && s.size() == q.size()) ++borrowed;
    }
  }
  EXPECT_EQ(borrowed, 6);  // items 0, 1, 3, 4, 5, 7 (2 and 6 have none; 8 is inside)
}

TEST(TensorSlices, AnAnswerWithItsOutputsApartReadsBackHoweverItIsCut) {
  std::mt19937 rng(2);
  v1::AttendResponse want, apart;
  std::vector<std::string> outputs;
  for (int i = 0; i < 7; ++i) {
    v1::AttendResult* r = want.add_results();
    r->set_output(Random(&rng, i == 3 ? 0 : 100 + 2000 * i));
    for (int h = 0; h < 4; ++h) r->add_lse(0.25f * h + i);
    r->set_tokens(1000 + i);
    r->set_compressed_tokens(896);
    outputs.push_back(r->output());
    *apart.add_results() = *r;
    apart.mutable_results(i)->clear_output();
  }
  std::vector<absl::string_view> views(outputs.begin(), outputs.end());
  const std::string bytes = ByteBufferBytes(
      TensorSlicesBuffer(TensorSlicesItems(apart.results()), v1::AttendResult::kOutputFieldNumber, views, Borrowed));
  EXPECT_EQ(bytes, want.SerializeAsString());  // output is each result's first field
  for (size_t cut : {bytes.size(), size_t{1}, size_t{5}, size_t{4096}}) {
    std::vector<grpc::Slice> slices;
    for (size_t at = 0; at < bytes.size(); at += cut)
      slices.emplace_back(bytes.data() + at, std::min(cut, bytes.size() - at));
    TensorSlices<v1::AttendResponse, v1::AttendResult::kOutputFieldNumber> read;
    ASSERT_TRUE(read.Parse(std::move(slices))) << cut;
    ASSERT_EQ(read.tensors().size(), outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_EQ(read.tensors()[i], outputs[i]) << cut << " " << i;
      EXPECT_TRUE(read.message().results(static_cast<int>(i)).output().empty());
    }
    v1::AttendResponse back = read.message();
    for (int i = 0; i < back.results_size(); ++i) back.mutable_results(i)->set_output(outputs[i]);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(back, want)) << cut;
  }
}

}  // namespace
}  // namespace driftkv
