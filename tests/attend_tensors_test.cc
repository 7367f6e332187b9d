// Client::Attend with the inline tensors in the caller's memory (queries
// sent from where they lie, outputs copied into the caller's buffers;
// client/attend_tensors.h), over loopback gRPC, CPU backend: its answers
// equal Attend(request)'s bit for bit through the sleeping and the polling
// door (f32 and bf16 outputs, batched and alone, items mixing queries in
// the message and apart, outputs into spans and kept in results, decode
// steps, 8 clients at once); the caller's mistakes are refused before
// anything is sent, a span of the wrong size is named after the call, and
// the server's refusals are Attend(request)'s.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::QueryItem;
using testing::SyntheticKv;
using testing::SyntheticQuery;

constexpr int kN = testing::kSmallN, kD = 64, kQHeads = 4, kSequences = 6, kTokens = 150;

using Door = testing::InlineDoor;

// Items over sequences first..first+count-1, layer 1, queries in `qdtype`,
// outputs in `dtype`; with `step` >= 0, each item's decode step.
v1::AttendRequest Request(int first, int count, v1::DType qdtype, v1::DType dtype, const testing::Kv& kv, int step) {
  v1::AttendRequest req;
  for (int s = first; s < first + count; ++s) {
    v1::AttendItem* it = req.add_items();
    *it = QueryItem(absl::StrCat("s", s), 1, SyntheticQuery(kQHeads, kD, 30 + s), kQHeads, qdtype);
    it->set_output_dtype(dtype);
    if (step >= 0) {
      const int pos = kTokens - 10 * s + step;
      FloatToTensor(kv.keys.data() + pos * kN, kN, qdtype, it->mutable_new_key());
      FloatToTensor(kv.values.data() + pos * kN, kN, qdtype, it->mutable_new_value());
      it->set_new_token_index(pos);
    }
  }
  return req;
}

// The same request with the queries of the items `apart` selects moved out
// of the message into caller memory.
struct Apart {
  v1::AttendRequest request;
  std::vector<std::string> memory;  // the queries' bytes, kept apart
  std::vector<absl::string_view> queries;
};
Apart MoveQueriesOut(const v1::AttendRequest& req, const std::vector<bool>& apart) {
  Apart a;
  a.request = req;
  a.memory.resize(static_cast<size_t>(req.items_size()));
  a.queries.resize(a.memory.size());
  for (int i = 0; i < req.items_size(); ++i) {
    if (!apart[static_cast<size_t>(i) % apart.size()]) continue;
    a.memory[i].swap(*a.request.mutable_items(i)->mutable_query());
    a.queries[i] = a.memory[i];
  }
  return a;
}

// Every result's bytes (output, lse, tokens) in order; outputs[i], where
// not empty, stands for result i's output. A failed call fails the test.
std::string Bytes(const absl::StatusOr<v1::AttendResponse>& r, const std::vector<std::string>& outputs = {}) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status();
    return r.status().ToString();
  }
  std::string all;
  for (int i = 0; i < r->results_size(); ++i) {
    const v1::AttendResult& x = r->results(i);
    const bool apart = static_cast<size_t>(i) < outputs.size() && !outputs[i].empty();
    if (apart && !x.output().empty()) return absl::StrCat("result ", i, " has its output twice");
    all += apart ? outputs[i] : x.output();
    all.append(reinterpret_cast<const char*>(x.lse().data()), x.lse_size() * sizeof(float));
    all += absl::StrCat("|", x.tokens(), "|", x.compressed_tokens(), "|");
  }
  return all;
}

size_t OutputBytes(v1::DType dtype) {
  return static_cast<size_t>(kQHeads) * kD * (dtype == v1::DTYPE_F32 ? 4 : 2);
}

// Attend through the tensors' path: outputs into spans for the items
// `into` selects (each filled with 0xee first, to see it written).
std::string ByTensors(Client& c, const v1::AttendRequest& req, const std::vector<bool>& apart,
                      const std::vector<bool>& into, v1::DType dtype) {
  Apart a = MoveQueriesOut(req, apart);
  std::vector<std::string> outputs(static_cast<size_t>(req.items_size()));
  std::vector<absl::Span<char>> spans(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!into[i % into.size()]) continue;
    outputs[i].assign(OutputBytes(dtype), '\xee');
    spans[i] = absl::Span<char>(outputs[i].data(), outputs[i].size());
  }
  return Bytes(c.Attend(a.request, a.queries, spans), outputs);
}

TEST(AttendTensors, AnswersEqualAttendsBitForBitThroughBothDoors) {
  const testing::Kv kv = SyntheticKv(kTokens + 20, kN, 3);
  for (bool polling : {false, true}) {
    Door door(polling);
    door.Fill(kv, kSequences, kTokens);
    for (v1::DType qdtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
      for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
        const v1::AttendRequest all = Request(0, kSequences, qdtype, dtype, kv, -1);
        const std::string want = Bytes(door.client->Attend(all));
        EXPECT_TRUE(ByTensors(*door.client, all, {true}, {true}, dtype) == want);
        EXPECT_TRUE(ByTensors(*door.client, all, {true, false, true}, {false, true}, dtype) == want);
        EXPECT_TRUE(ByTensors(*door.client, all, {false}, {false}, dtype) == want);
        std::string alone;
        for (int s = 0; s < kSequences; ++s) {
          alone += ByTensors(*door.client, Request(s, 1, qdtype, dtype, kv, -1), {true}, {true}, dtype);
        }
        EXPECT_TRUE(alone == want) << polling << " " << qdtype << " " << dtype;
      }
    }
  }
}

TEST(AttendTensors, DecodeStepsAsAttendsOnTwinServers) {
  const testing::Kv kv = SyntheticKv(kTokens + 20, kN, 4);
  Door plain(false), tensors(true);
  plain.Fill(kv, kSequences, kTokens);
  tensors.Fill(kv, kSequences, kTokens);
  for (int step = 0; step < 3; ++step) {
    const v1::AttendRequest req = Request(0, kSequences, v1::DTYPE_BF16, v1::DTYPE_BF16, kv, step);
    EXPECT_TRUE(ByTensors(*tensors.client, req, {true}, {true}, v1::DTYPE_BF16) == Bytes(plain.client->Attend(req)))
        << "step " << step;
  }
  for (int s = 0; s < kSequences; ++s) {
    absl::StatusOr<v1::LengthResponse> a = plain.client->Length(absl::StrCat("s", s));
    absl::StatusOr<v1::LengthResponse> b = tensors.client->Length(absl::StrCat("s", s));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->layers(1).tokens(), b->layers(1).tokens());
  }
}

TEST(AttendTensors, EightClientsAtOnceGetTheAnswersOfOne) {
  const testing::Kv kv = SyntheticKv(kTokens, kN, 5);
  Door door(true);
  door.Fill(kv, kSequences, kTokens);
  std::vector<std::string> want(kSequences);
  for (int s = 0; s < kSequences; ++s) {
    want[s] = Bytes(door.client->Attend(Request(s, 1, v1::DTYPE_BF16, v1::DTYPE_BF16, kv, -1)));
  }
  std::atomic<int> wrong{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      Client c(door.client->options());
      for (int i = 0; i < 25; ++i) {
        const int s = (t + i) % kSequences;
        const v1::AttendRequest req = Request(s, 1, v1::DTYPE_BF16, v1::DTYPE_BF16, kv, -1);
        if (ByTensors(c, req, {true}, {true}, v1::DTYPE_BF16) != want[s]) ++wrong;
      }
    });
  }
  for (std::thread& c : clients) c.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(AttendTensors, MistakesAreNamedAndRefusalsAreAttends) {
  const testing::Kv kv = SyntheticKv(kTokens + 20, kN, 6);
  Door door(false);
  door.Fill(kv, kSequences, kTokens);
  Client& c = *door.client;
  const uint64_t before = c.Length("s0")->layers(1).tokens();

  // A query in the message and apart too: refused before sending (the
  // item's decode step is not stored).
  const v1::AttendRequest step = Request(0, 1, v1::DTYPE_BF16, v1::DTYPE_BF16, kv, 0);
  const std::string q = step.items(0).query();
  std::vector<absl::string_view> twice = {q};
  absl::StatusOr<v1::AttendResponse> r = c.Attend(step, twice, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("items[0].query"), absl::string_view::npos) << r.status();
  EXPECT_EQ(c.Length("s0")->layers(1).tokens(), before);

  // More queries or outputs than items.
  const v1::AttendRequest one = Request(1, 1, v1::DTYPE_F32, v1::DTYPE_F32, kv, -1);
  std::vector<absl::string_view> two_queries(2);
  r = c.Attend(one, two_queries, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("queries: 2 for 1 items"), absl::string_view::npos) << r.status();
  std::string out(OutputBytes(v1::DTYPE_F32), '\0');
  std::vector<absl::Span<char>> two_outputs(2, absl::Span<char>(out.data(), out.size()));
  r = c.Attend(one, {}, two_outputs);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);

  // A span one byte short: named after the call.
  std::vector<absl::Span<char>> short_output = {absl::Span<char>(out.data(), out.size() - 1)};
  r = c.Attend(one, {}, short_output);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("outputs[0]"), absl::string_view::npos) << r.status();

  // The server's refusals come back as Attend(request)'s.
  v1::AttendRequest unknown = one;
  unknown.mutable_items(0)->set_sequence_id("nope");
  v1::AttendRequest bad_layer = one;
  bad_layer.mutable_items(0)->set_layer(9);
  v1::AttendRequest short_query = one;
  short_query.mutable_items(0)->mutable_query()->resize(10);
  for (const v1::AttendRequest& req : {unknown, bad_layer, short_query, v1::AttendRequest()}) {
    const absl::Status want = c.Attend(req).status();
    EXPECT_FALSE(want.ok());
    Apart a = MoveQueriesOut(req, {true});
    EXPECT_EQ(c.Attend(a.request, a.queries, {}).status(), want);
  }
}

}  // namespace
}  // namespace driftkv
