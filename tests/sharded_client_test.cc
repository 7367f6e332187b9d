// driftkv::ShardedClient over three in-process servers on loopback, the
// scale-out properties of docs/operations.md, "Scale out":
//  - 3000 small sequences spread within +-15% of a third per replica;
//  - sharded, batched Attend (mixed batches, decode steps too, tensors in
//    the caller's memory too) and Read are bit-equal to one server holding
//    every sequence;
//  - one replica killed: exactly its sequences fail, with UNAVAILABLE, and
//    every other sequence keeps working (Attend, Append, Release);
//  - one replica removed from the list: exactly its sequences move;
//  - Length, routed to the owner, equals one server's for sequences of every
//    replica, and a killed replica fails only its own sequences' Length.
// Plus the hash itself: fixed values (the Python client must match them),
// order independence, minimal movement when a replica is added.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/sharded_client.h"
#include "gtest/gtest.h"
#include "service/server.h"
#include "tests/service_test_util.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

constexpr int kSequences = 3000;
constexpr int kN = 128;  // 2 KV heads x 64
constexpr int kD = 64;
constexpr int kQHeads = 4;

// Token count of sequence i: a few tokens (bf16 window only), and every
// tenth long enough for one compressed page (pages of 32, window 32: the
// first page is encoded at 64 tokens).
int TokensOf(int i) {
  return i % 10 == 0 ? 70 : 3 + i % 5;
}
std::string Id(int i) {
  return absl::StrCat("seq-", i);
}

ServiceOptions ReplicaOptions() {
  ServiceOptions o = testing::SmallOptions(16u << 20);
  o.layers = 1;
  o.max_sequences = 4096;
  o.backend_threads = 1;  // four servers share two cores
  return o;
}

class ShardedTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(ReplicaOptions());
      ASSERT_TRUE(s.ok()) << s.status();
      servers_[r] = s->release();
    }
    names_ = {Addr(0), Addr(1), Addr(2)};
    sharded_ = new ShardedClient(names_, Options());
    ClientOptions o = Options();
    o.target = Addr(3);
    single_ = new Client(o);
    // Every sequence through the sharded client, and the same chunks to the
    // single server holding everything.
    std::vector<v1::AppendChunk> batch;
    for (int i = 0; i < kSequences; ++i) {
      const int t = TokensOf(i);
      const testing::Kv kv = testing::SyntheticKv(t + 1, kN, 1000 + i);  // +1: a decode step's token
      batch.push_back(MakeChunk(Id(i), 0, 0, t, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16));
      if (batch.size() == 200 || i + 1 == kSequences) {
        absl::StatusOr<v1::AppendResponse> a = sharded_->Append(batch);
        ASSERT_TRUE(a.ok()) << a.status();
        ASSERT_EQ(a->chunks(), batch.size());
        absl::StatusOr<v1::AppendResponse> b = single_->Append(batch);
        ASSERT_TRUE(b.ok()) << b.status();
        batch.clear();
      }
    }
  }
  static void TearDownTestSuite() {
    delete sharded_;
    delete single_;
    for (DriftkvServer*& s : servers_) {
      if (s != nullptr) s->Shutdown(absl::ZeroDuration());
      delete s;
      s = nullptr;
    }
  }
  static std::string Addr(int r) { return testing::LoopbackTarget(servers_[r]->port()); }
  static ClientOptions Options() {
    ClientOptions o;
    o.timeout = absl::Seconds(20);
    o.max_attempts = 2;  // a dead replica answers UNAVAILABLE after one retry
    return o;
  }
  static v1::AttendItem Item(int i, uint32_t seed) {
    return testing::QueryItem(Id(i), 0, testing::SyntheticQuery(kQHeads, kD, seed), kQHeads);
  }
  // Batches of 64 items over the sequences in a shuffled order, so that
  // every batch mixes the replicas.
  static std::vector<v1::AttendRequest> MixedBatches(const std::vector<int>& sequences, uint32_t seed) {
    std::vector<int> order = sequences;
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<v1::AttendRequest> out;
    for (size_t k = 0; k < order.size(); ++k) {
      if (k % 64 == 0) out.emplace_back();
      *out.back().add_items() = Item(order[k], seed + order[k]);
    }
    return out;
  }
  static void ExpectSameResult(const v1::AttendResult& a, const v1::AttendResult& b, const std::string& what) {
    EXPECT_EQ(a.output(), b.output()) << what;  // bytes: bit-equal floats
    ASSERT_EQ(a.lse_size(), b.lse_size()) << what;
    for (int h = 0; h < a.lse_size(); ++h) {
      const float fa = a.lse(h), fb = b.lse(h);
      uint32_t x, y;
      std::memcpy(&x, &fa, 4);
      std::memcpy(&y, &fb, 4);
      EXPECT_EQ(x, y) << what << " lse " << h;
    }
    EXPECT_EQ(a.tokens(), b.tokens()) << what;
    EXPECT_EQ(a.compressed_tokens(), b.compressed_tokens()) << what;
  }
  static std::vector<int> All() {
    std::vector<int> v(kSequences);
    for (int i = 0; i < kSequences; ++i) v[i] = i;
    return v;
  }

  static DriftkvServer* servers_[4];  // 0..2 the replicas, 3 the single server
  static std::vector<std::string> names_;
  static ShardedClient* sharded_;
  static Client* single_;
};

DriftkvServer* ShardedTest::servers_[4] = {};
std::vector<std::string> ShardedTest::names_;
ShardedClient* ShardedTest::sharded_ = nullptr;
Client* ShardedTest::single_ = nullptr;

TEST(Rendezvous, FixedValuesForOtherImplementations) {
  // FNV-1a 64 test vectors, then the scores other clients must reproduce.
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_EQ(Mix64(0), 0u);
  // docs/operations.md quotes these two; a Python client checks the same.
  EXPECT_EQ(RendezvousScore("a:1", "seq-0"), 12193204044201198253ull);
  EXPECT_EQ(RendezvousScore("driftkv-server-0.driftkv-headless:50051", "req-42"), 2269833343191734746ull);
  EXPECT_EQ(RendezvousScore("a:1", "seq-0"), Mix64(Fnv1a64(std::string("a:1\0seq-0", 9))));
}

// The ids ForkFromPrefix derives: fixed values the Python client's
// Router.sequence_id_on must match.
TEST(Rendezvous, SequenceIdOnFixedValuesForOtherImplementations) {
  ShardedClient names({"a:1", "b:2", "c:3"});  // no call is made
  EXPECT_EQ(names.SequenceIdOn("user-7", 0), "user-7~1");
  EXPECT_EQ(names.SequenceIdOn("user-7", 1), "user-7");
  EXPECT_EQ(names.SequenceIdOn("user-7", 2), "user-7~4");
  for (int r = 0; r < 3; ++r) EXPECT_EQ(names.ReplicaOf(names.SequenceIdOn("user-7", r)), r);
}

TEST(Rendezvous, OwnerIndependentOfListOrderAndMovesMinimallyOnAdd) {
  const std::vector<std::string> abc = {"a:1", "b:1", "c:1"}, cab = {"c:1", "a:1", "b:1"};
  const std::vector<std::string> abcd = {"a:1", "b:1", "c:1", "d:1"};
  int moved = 0;
  for (int i = 0; i < 3000; ++i) {
    const int x = RendezvousOwner(abc, Id(i));
    EXPECT_EQ(abc[x], cab[RendezvousOwner(cab, Id(i))]);
    const int y = RendezvousOwner(abcd, Id(i));
    if (abcd[y] != abc[x]) {
      EXPECT_EQ(abcd[y], "d:1") << "a sequence moved between old replicas";
      ++moved;
    }
  }
  EXPECT_NEAR(moved, 750, 750 * 0.15);  // a quarter moves to the new replica
  EXPECT_EQ(SplitReplicas(" a:1,b:2,, c:3 "), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
}

TEST_F(ShardedTest, SharesWithinFifteenPercent) {
  int expected[3] = {0, 0, 0};
  for (int i = 0; i < kSequences; ++i) ++expected[sharded_->ReplicaOf(Id(i))];
  std::vector<absl::StatusOr<v1::StatsResponse>> stats = sharded_->StatsAll();
  ASSERT_EQ(stats.size(), 3u);
  uint64_t total = 0;
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(stats[r].ok()) << stats[r].status();
    const double share = static_cast<double>(stats[r]->sequences()) / kSequences;
    std::printf("replica %d (%s): %llu sequences, share %.4f (1/3 = 0.3333)\n", r, names_[r].c_str(),
                static_cast<unsigned long long>(stats[r]->sequences()), share);
    EXPECT_EQ(stats[r]->sequences(), static_cast<uint64_t>(expected[r]));
    EXPECT_GE(share, (1.0 / 3) * 0.85);
    EXPECT_LE(share, (1.0 / 3) * 1.15);
    total += stats[r]->sequences();
  }
  EXPECT_EQ(total, static_cast<uint64_t>(kSequences));
}

TEST_F(ShardedTest, BatchedAttendAndReadBitEqualToOneServer) {
  int items = 0;
  for (const v1::AttendRequest& req : MixedBatches(All(), 7)) {
    absl::StatusOr<v1::AttendResponse> a = sharded_->Attend(req);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<v1::AttendResponse> b = single_->Attend(req);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_EQ(a->results_size(), req.items_size());
    for (int k = 0; k < req.items_size(); ++k) {
      ExpectSameResult(a->results(k), b->results(k), req.items(k).sequence_id());
      ++items;
    }
  }
  EXPECT_EQ(items, kSequences);
  std::printf("%d items in mixed batches of 64: bit-equal to one server\n", items);
  // Reads of the long (paged) sequences: the same bytes.
  for (int i = 0; i < kSequences; i += 10 * 37) {
    v1::ReadRequest r;
    r.set_sequence_id(Id(i));
    absl::StatusOr<std::vector<v1::ReadChunk>> a = sharded_->Read(r);
    absl::StatusOr<std::vector<v1::ReadChunk>> b = single_->Read(r);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->size(), b->size());
    for (size_t c = 0; c < a->size(); ++c) {
      EXPECT_EQ((*a)[c].keys(), (*b)[c].keys());
      EXPECT_EQ((*a)[c].values(), (*b)[c].values());
    }
  }
}

// The same batches with every query in caller memory and every other
// item's output copied into a caller buffer (Attend with queries and
// outputs): each replica's sub-batch gets its items' spans, and the
// answers are one server's bit for bit.
TEST_F(ShardedTest, TensorsInCallerMemoryBitEqualToOneServer) {
  int items = 0;
  for (const v1::AttendRequest& req : MixedBatches(All(), 9)) {
    v1::AttendRequest apart = req;
    std::vector<std::string> query_memory(req.items_size()), output_memory(req.items_size());
    std::vector<absl::string_view> queries(req.items_size());
    std::vector<absl::Span<char>> outputs(req.items_size());
    for (int k = 0; k < req.items_size(); ++k) {
      query_memory[k].swap(*apart.mutable_items(k)->mutable_query());
      queries[k] = query_memory[k];
      if (k % 2 == 0) {
        output_memory[k].assign(static_cast<size_t>(kQHeads) * kD * 4, '\xee');
        outputs[k] = absl::Span<char>(output_memory[k].data(), output_memory[k].size());
      }
    }
    absl::StatusOr<v1::AttendResponse> a = sharded_->Attend(apart, queries, outputs);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<v1::AttendResponse> b = single_->Attend(req);
    ASSERT_TRUE(b.ok()) << b.status();
    for (int k = 0; k < req.items_size(); ++k) {
      v1::AttendResult got = a->results(k);
      if (k % 2 == 0) {
        EXPECT_TRUE(got.output().empty());
        got.set_output(output_memory[k]);
      }
      ExpectSameResult(got, b->results(k), req.items(k).sequence_id());
      ++items;
    }
  }
  EXPECT_EQ(items, kSequences);
  // A query given twice fails every item before anything is sent.
  v1::AttendRequest twice = MixedBatches(All(), 9)[0];
  std::vector<absl::string_view> again = {twice.items(0).query()};
  ShardedClient::AttendOutcome out = sharded_->AttendEach(twice, again, {});
  for (const absl::Status& st : out.status) EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST_F(ShardedTest, DecodeStepsInMixedBatchesBitEqual) {
  // One decode step (idempotent, new_token_index set) for 128 sequences, in
  // two mixed batches: both deployments store the token and attend over it.
  std::vector<int> some;
  for (int i = 1; i < kSequences && some.size() < 128; i += 23) some.push_back(i);
  for (v1::AttendRequest req : MixedBatches(some, 11)) {
    for (v1::AttendItem& it : *req.mutable_items()) {
      const int i = std::stoi(it.sequence_id().substr(4));
      const int t = TokensOf(i);
      const testing::Kv kv = testing::SyntheticKv(t + 1, kN, 1000 + i);
      FloatToTensor(kv.keys.data() + t * kN, kN, v1::DTYPE_F32, it.mutable_new_key());
      FloatToTensor(kv.values.data() + t * kN, kN, v1::DTYPE_F32, it.mutable_new_value());
      it.set_new_token_index(t);
    }
    absl::StatusOr<v1::AttendResponse> a = sharded_->Attend(req);
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<v1::AttendResponse> b = single_->Attend(req);
    ASSERT_TRUE(b.ok()) << b.status();
    for (int k = 0; k < req.items_size(); ++k) {
      ExpectSameResult(a->results(k), b->results(k), req.items(k).sequence_id());
      EXPECT_EQ(a->results(k).tokens(),
                static_cast<uint64_t>(TokensOf(std::stoi(req.items(k).sequence_id().substr(4))) + 1));
    }
  }
}

TEST_F(ShardedTest, RemovingAReplicaMovesOnlyItsSequences) {
  // Replica 1 leaves the list: its sequences move to 0 or 2, none other moves.
  const std::vector<std::string> without = {names_[0], names_[2]};
  int moved = 0, owned = 0;
  for (int i = 0; i < kSequences; ++i) {
    const std::string& before = names_[sharded_->ReplicaOf(Id(i))];
    const std::string& after = without[RendezvousOwner(without, Id(i))];
    if (before == names_[1]) {
      ++owned;
      ++moved;
    } else {
      EXPECT_EQ(before, after) << Id(i) << " moved although its replica stays";
    }
  }
  std::printf("replica removed: %d of %d sequences moved, all of them its own (%d)\n", moved, kSequences, owned);
  // The client over the two remaining replicas finds every sequence that
  // did not move where it was.
  ShardedClient two(without, Options());
  std::vector<int> stayed;
  for (int i = 0; i < kSequences; ++i) {
    if (sharded_->ReplicaOf(Id(i)) != 1) stayed.push_back(i);
  }
  for (const v1::AttendRequest& req : MixedBatches(stayed, 5)) {
    absl::StatusOr<v1::AttendResponse> a = two.Attend(req);
    ASSERT_TRUE(a.ok()) << a.status();
  }
}

TEST_F(ShardedTest, LengthRoutedToTheOwnerEqualsOneServer) {
  // Every 7th sequence (paged ones included, and those given a decode step
  // above): the same per-layer counts as the single server's.
  int per_replica[3] = {0, 0, 0};
  for (int i = 0; i < kSequences; i += 7) {
    absl::StatusOr<v1::LengthResponse> a = sharded_->Length(Id(i));
    ASSERT_TRUE(a.ok()) << Id(i) << ": " << a.status();
    absl::StatusOr<v1::LengthResponse> b = single_->Length(Id(i));
    ASSERT_TRUE(b.ok()) << Id(i) << ": " << b.status();
    ASSERT_EQ(a->layers_size(), 1) << Id(i);
    EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString()) << Id(i);
    EXPECT_GE(a->layers(0).tokens(), static_cast<uint64_t>(TokensOf(i))) << Id(i);
    ++per_replica[sharded_->ReplicaOf(Id(i))];
  }
  for (int r = 0; r < 3; ++r) EXPECT_GT(per_replica[r], 0) << "no sequence of replica " << r << " checked";
  // Only the owner holds it: the other replicas answer NOT_FOUND.
  const int owner = sharded_->ReplicaOf(Id(0));
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<v1::LengthResponse> direct = sharded_->replica(r).Length(Id(0));
    EXPECT_EQ(direct.ok(), r == owner) << "replica " << r << ": " << direct.status();
  }
  absl::StatusOr<v1::LengthResponse> unknown = sharded_->Length("never-stored");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("replica " + names_[sharded_->ReplicaOf("never-stored")]),
            std::string::npos)
      << unknown.status();
}

// A prompt stored (with its token ids) on one replica is found there by
// LookupAll, and ForkFromPrefix forks it there under an id that routes to
// that replica; the fork reads back the source's paged tokens. A prompt no
// replica holds is NOT_FOUND, naming each replica's reason.
TEST_F(ShardedTest, ForkFromPrefixFindsTheReplicaThatHoldsIt) {
  constexpr int kPrompt = 320;  // 9 pages of 32 sealed (the window keeps 32)
  std::vector<uint32_t> ids(kPrompt);
  for (int i = 0; i < kPrompt; ++i) ids[i] = 7000 + static_cast<uint32_t>(i) * 13;
  const testing::Kv kv = testing::SyntheticKv(kPrompt, kN, 4242);
  v1::AppendChunk chunk = MakeChunk("prompt-src", 0, 0, kPrompt, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16);
  chunk.mutable_token_ids()->Add(ids.begin(), ids.end());
  ASSERT_TRUE(sharded_->Append({chunk}).ok());
  const int holder = sharded_->ReplicaOf("prompt-src");

  v1::LookupRequest lookup;
  lookup.mutable_token_ids()->Add(ids.begin(), ids.end());
  const std::vector<absl::StatusOr<v1::LookupResponse>> answers = sharded_->LookupAll(lookup);
  ASSERT_EQ(answers.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(answers[r].ok()) << answers[r].status();
    EXPECT_EQ(answers[r]->tokens(), r == holder ? 288u : 0u) << "replica " << r;
  }
  EXPECT_EQ(ShardedClient::LongestPrefix(answers), holder);

  // Every replica has ids of its own from one base, the base itself first.
  for (int r = 0; r < 3; ++r) {
    const std::string id = sharded_->SequenceIdOn("user-7", r);
    EXPECT_EQ(sharded_->ReplicaOf(id), r) << id;
    EXPECT_EQ(id == "user-7", sharded_->ReplicaOf("user-7") == r) << id;
  }

  // The prompt and a suffix of the user's own: the prefix's 9 pages shared.
  std::vector<uint32_t> asked = ids;
  for (int i = 0; i < 40; ++i) asked.push_back(90000 + i);
  absl::StatusOr<ShardedClient::PrefixFork> fork = sharded_->ForkFromPrefix(asked, "user-7");
  ASSERT_TRUE(fork.ok()) << fork.status();
  EXPECT_EQ(fork->replica, holder);
  EXPECT_EQ(sharded_->ReplicaOf(fork->sequence_id), holder);
  EXPECT_EQ(fork->response.tokens(), 288u);
  absl::StatusOr<Client::Tensors> mine = sharded_->ReadFloat(fork->sequence_id, 0, 0, 288);
  absl::StatusOr<Client::Tensors> src = sharded_->ReadFloat("prompt-src", 0, 0, 288);
  ASSERT_TRUE(mine.ok()) << mine.status();
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(mine->keys, src->keys);
  EXPECT_EQ(mine->values, src->values);
  ASSERT_TRUE(sharded_->Release(fork->sequence_id).ok());
  ASSERT_TRUE(sharded_->Release("prompt-src").ok());

  std::vector<uint32_t> unknown(kPrompt, 5);
  absl::StatusOr<ShardedClient::PrefixFork> none = sharded_->ForkFromPrefix(unknown, "user-8");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find("no replica holds a page of the prompt (" + names_[0] + ": "),
            std::string::npos)
      << none.status();
}

// Last (gtest runs the tests of a suite in order): kills replica 1.
TEST_F(ShardedTest, ZKilledReplicaFailsOnlyItsOwnSequences) {
  servers_[1]->Shutdown(absl::ZeroDuration());
  int failed = 0, ok = 0;
  for (const v1::AttendRequest& req : MixedBatches(All(), 9)) {
    ShardedClient::AttendOutcome out = sharded_->AttendEach(req);
    absl::StatusOr<v1::AttendResponse> b = single_->Attend(req);
    ASSERT_TRUE(b.ok()) << b.status();
    for (int k = 0; k < req.items_size(); ++k) {
      const std::string& id = req.items(k).sequence_id();
      if (sharded_->ReplicaOf(id) == 1) {
        EXPECT_EQ(out.status[k].code(), absl::StatusCode::kUnavailable) << id << ": " << out.status[k];
        ++failed;
      } else {
        ASSERT_TRUE(out.status[k].ok()) << id << ": " << out.status[k];
        ExpectSameResult(out.response.results(k), b->results(k), id);
        ++ok;
      }
    }
  }
  std::printf("replica 1 killed: %d items failed (UNAVAILABLE, all its own), %d answered bit-equal\n", failed, ok);
  EXPECT_GT(failed, 0);
  EXPECT_EQ(failed + ok, kSequences);
  // Append, Read, Length and Release still work for a sequence of another replica,
  // and fail with UNAVAILABLE for one of the dead replica.
  int alive = -1, dead = -1;
  for (int i = 0; i < kSequences && (alive < 0 || dead < 0); ++i) {
    (sharded_->ReplicaOf(Id(i)) == 1 ? dead : alive) = i;
  }
  const testing::Kv kv = testing::SyntheticKv(4, kN, 77);
  std::vector<v1::AppendChunk> fresh = {
      MakeChunk("fresh-alive", 0, 0, 4, kv.keys.data(), kv.values.data(), kN, v1::DTYPE_BF16)};
  if (sharded_->ReplicaOf("fresh-alive") != 1) {
    EXPECT_TRUE(sharded_->Append(fresh).ok());
  }
  // Length of every 30th sequence: UNAVAILABLE exactly for the dead
  // replica's, the single server's counts for the others.
  int length_failed = 0, length_ok = 0;
  for (int i = 0; i < kSequences; i += 30) {
    absl::StatusOr<v1::LengthResponse> a = sharded_->Length(Id(i));
    if (sharded_->ReplicaOf(Id(i)) == 1) {
      EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable) << Id(i) << ": " << a.status();
      ++length_failed;
    } else {
      ASSERT_TRUE(a.ok()) << Id(i) << ": " << a.status();
      absl::StatusOr<v1::LengthResponse> b = single_->Length(Id(i));
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->SerializeAsString(), b->SerializeAsString()) << Id(i);
      ++length_ok;
    }
  }
  std::printf("replica 1 killed: Length failed for %d sequences (its own), answered for %d\n", length_failed,
              length_ok);
  EXPECT_GT(length_failed, 0);
  EXPECT_GT(length_ok, 0);
  v1::ReadRequest read;
  read.set_sequence_id(Id(alive));
  EXPECT_TRUE(sharded_->Read(read).ok());
  EXPECT_TRUE(sharded_->Release(Id(alive)).ok());
  read.set_sequence_id(Id(dead));
  EXPECT_EQ(sharded_->Read(read).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sharded_->Release(Id(dead)).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace driftkv
