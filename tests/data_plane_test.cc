// Attend and Append by reference to registered host regions (the data
// plane: service/attend_io.h, Handler::AppendReferenced) over an
// in-process server on the CPU backend with a region socket.
//
// By reference must answer exactly what inline answers: outputs and lse
// byte for byte, one item per request and batched, with decode steps, and
// under concurrent clients that each own a region. Decode steps change a
// sequence, so every comparison runs on sets of sequences of identical
// content under different prefixes ("ia-s0" inline alone, "ra-s0" by
// reference alone, ...). A bf16 output is the f32 output rounded; an
// Append by reference stores what an inline one stores. Bad references
// are refused with an exact status naming the field and change nothing:
// a region of another tenant answers exactly what an unknown id answers.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "service/regions.h"
#include "service/server.h"
#include "tests/data_plane_items.h"
#include "tests/loopback_server.h"
#include "tests/service_test_util.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;
using testing::Answer;
using testing::ByRef;
using testing::ExpectSame;
using testing::Gaussian;
using testing::HostArena;
using testing::Inline;
using testing::InlineAnswer;
using testing::ItemSpec;
using testing::kD;
using testing::kSmallN;
using testing::OutBytes;
using testing::RefAnswer;

constexpr int kPrefill = 127;  // 2 pages + 63 window tokens: the first decode step encodes a page
constexpr int kRounds = 4;

// The items of decode round `round` over sequences s0 and s1 of kPrefill
// tokens in each layer: GQA (q_heads 2, 4, 8 over 2 KV heads), f32 and bf16
// queries and steps, steps with and without new_token_index, f32 and bf16
// outputs, one item without a step. Distinct (sequence, layer) per item.
std::vector<ItemSpec> RoundSpecs(int round, uint32_t seed) {
  const uint32_t s = seed * 1000 + round * 10;
  std::vector<ItemSpec> v(4);
  v[0].seq = "s0";
  v[0].layer = 0;
  v[0].q_heads = 4;
  v[0].query = Gaussian(4 * kD, s + 1);
  v[0].key = Gaussian(kSmallN, s + 2);
  v[0].value = Gaussian(kSmallN, s + 3);
  v[0].token_index = kPrefill + round;
  v[1].seq = "s0";
  v[1].layer = 1;
  v[1].q_heads = 2;
  v[1].dtype = v1::DTYPE_BF16;
  v[1].query = Gaussian(2 * kD, s + 4);
  v[2].seq = "s1";
  v[2].layer = 0;
  v[2].q_heads = 8;
  v[2].dtype = v1::DTYPE_BF16;
  v[2].query = Gaussian(8 * kD, s + 5);
  v[2].key = Gaussian(kSmallN, s + 6);
  v[2].value = Gaussian(kSmallN, s + 7);
  v[2].token_index = kPrefill + round;
  v[3].seq = "s1";
  v[3].layer = 1;
  v[3].q_heads = 2;
  v[3].out_dtype = v1::DTYPE_BF16;
  v[3].query = Gaussian(2 * kD, s + 8);
  v[3].key = Gaussian(kSmallN, s + 9);
  v[3].value = Gaussian(kSmallN, s + 10);
  return v;
}

// The fields of Stats that any stored token or page moves.
std::string StoredState(Client& c) {
  absl::StatusOr<v1::StatsResponse> s = c.Stats();
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return "";
  return absl::StrCat("sequences ", s->sequences(), " pages ", s->pages_in_use(), " compressed ",
                      s->tokens_compressed(), " window ", s->tokens_window(), " ingested ", s->tokens_ingested(),
                      " bytes ", s->bytes_ingested(), " tenant_pages ", s->tenant_pages());
}

std::string Lengths(Client& c, const std::string& seq) {
  absl::StatusOr<v1::LengthResponse> l = c.Length(seq);
  if (!l.ok()) return l.status().ToString();
  return l->DebugString();
}

// Every message of a Read of one layer: keys then values of each.
std::string ReadBytes(Client& c, const std::string& seq, uint32_t layer) {
  v1::ReadRequest r;
  r.set_sequence_id(seq);
  r.set_layer(layer);
  absl::StatusOr<std::vector<v1::ReadChunk>> chunks = c.Read(r);
  EXPECT_TRUE(chunks.ok()) << chunks.status();
  std::string all;
  if (chunks.ok()) {
    for (const v1::ReadChunk& k : *chunks) absl::StrAppend(&all, k.keys(), k.values());
  }
  return all;
}

class DataPlaneTest : public testing::LoopbackFixture {
 protected:
  void SetUp() override {
    ServiceOptions o = testing::SmallOptions(32u << 20);
    // sun_path holds 107 bytes: TEST_TMPDIR may be longer.
    o.region_socket = absl::StrCat("/tmp/driftkv-data-plane-test-",
                                   absl::Hex(uint64_t{std::random_device()()} << 32 | std::random_device()()), ".sock");
    Start(o);
  }
  std::unique_ptr<HostRegion> NewRegion(Client* c, uint64_t bytes) {
    absl::StatusOr<std::unique_ptr<HostRegion>> r = HostRegion::Create(c, bytes);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  // Sequences s0 and s1 under `prefix`, kPrefill tokens in each layer;
  // the same content for the same seed.
  void Prefill(Client& c, const std::string& prefix, uint32_t seed) {
    std::vector<v1::AppendChunk> chunks;
    for (const char* seq : {"s0", "s1"}) {
      for (uint32_t layer = 0; layer < 2; ++layer) {
        const testing::Kv kv = testing::SyntheticKv(kPrefill, kSmallN, seed * 10 + layer + (seq[1] - '0') * 2);
        chunks.push_back(testing::ChunkOf(prefix + seq, layer, 0, kPrefill, kv));
      }
    }
    absl::StatusOr<v1::AppendResponse> r = c.Append(chunks);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  absl::StatusOr<v1::AttendResponse> Attend(Client& c, std::vector<v1::AttendItem> items) {
    v1::AttendRequest req;
    for (v1::AttendItem& it : items) *req.add_items() = std::move(it);
    return c.Attend(req);
  }
  // A host region of tenant "bob" (the client here is tenant ""),
  // registered in the server's table directly.
  uint64_t ForeignRegion(uint64_t bytes) {
    void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(base, MAP_FAILED);
    absl::StatusOr<std::string> token = server_->regions().AddPending(base, bytes, PeerCredentials{});
    EXPECT_TRUE(token.ok()) << token.status();
    v1::RegisterRegionRequest req;
    req.set_kind(v1::REGION_HOST_SHM);
    req.set_attach_token(token.ok() ? *token : "");
    v1::RegisterRegionResponse resp;
    absl::Status st = server_->regions().Register(req, &resp, "bob");
    EXPECT_TRUE(st.ok()) << st;
    return resp.region_id();
  }
};

TEST_F(DataPlaneTest, ByReferenceAnswersInlineBitForBitAloneAndBatched) {
  // ia: inline, one item per request; ra: by reference, alone; ib, rb: batched.
  for (const char* prefix : {"ia-", "ra-", "ib-", "rb-"}) Prefill(*client_, prefix, 1);
  std::unique_ptr<HostRegion> region = NewRegion(client_.get(), 1 << 20);
  ASSERT_NE(region, nullptr);
  HostArena arena(region.get());
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<ItemSpec> specs = RoundSpecs(round, 1);
    std::vector<Answer> alone;
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string what = absl::StrCat("round ", round, " item ", i);
      absl::StatusOr<v1::AttendResponse> in = Attend(*client_, {Inline(specs[i], "ia-")});
      ASSERT_TRUE(in.ok()) << what << ": " << in.status();
      alone.push_back(InlineAnswer(in->results(0)));
      EXPECT_EQ(alone.back().output.size(), OutBytes(specs[i])) << what;
      arena.Reset();
      const v1::AttendItem ref = ByRef(specs[i], "ra-", arena);
      absl::StatusOr<v1::AttendResponse> by_ref = Attend(*client_, {ref});
      ASSERT_TRUE(by_ref.ok()) << what << ": " << by_ref.status();
      ExpectSame(alone.back(), RefAnswer(specs[i], ref, by_ref->results(0), arena), what + " by reference");
    }
    std::vector<v1::AttendItem> inline_items, ref_items;
    arena.Reset();
    for (const ItemSpec& s : specs) {
      inline_items.push_back(Inline(s, "ib-"));
      ref_items.push_back(ByRef(s, "rb-", arena));
    }
    absl::StatusOr<v1::AttendResponse> in = Attend(*client_, inline_items);
    ASSERT_TRUE(in.ok()) << in.status();
    absl::StatusOr<v1::AttendResponse> by_ref = Attend(*client_, ref_items);
    ASSERT_TRUE(by_ref.ok()) << by_ref.status();
    for (size_t i = 0; i < specs.size(); ++i) {
      const std::string what = absl::StrCat("round ", round, " item ", i, " batched");
      ExpectSame(alone[i], InlineAnswer(in->results(i)), what);
      ExpectSame(alone[i], RefAnswer(specs[i], ref_items[i], by_ref->results(i), arena), what + " by reference");
    }
  }
  // The steps stored the same tokens, whichever way they came.
  for (const char* seq : {"s0", "s1"}) {
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const std::string want = ReadBytes(*client_, std::string("ia-") + seq, layer);
      EXPECT_FALSE(want.empty());
      for (const char* prefix : {"ra-", "ib-", "rb-"}) {
        EXPECT_TRUE(ReadBytes(*client_, prefix + std::string(seq), layer) == want) << prefix << seq << " " << layer;
      }
    }
  }
}

TEST_F(DataPlaneTest, ConcurrentClientsEachGetTheirLoneInlineAnswer) {
  constexpr int kClients = 8;
  // Lone inline answers first, one request at a time, on "c<k>i-".
  std::vector<std::vector<std::vector<Answer>>> want(kClients);
  for (int k = 0; k < kClients; ++k) {
    Prefill(*client_, absl::StrCat("c", k, "i-"), 10 + k);
    Prefill(*client_, absl::StrCat("c", k, "r-"), 10 + k);
    for (int round = 0; round < kRounds; ++round) {
      std::vector<v1::AttendItem> items;
      for (const ItemSpec& s : RoundSpecs(round, 10 + k)) items.push_back(Inline(s, absl::StrCat("c", k, "i-")));
      absl::StatusOr<v1::AttendResponse> in = Attend(*client_, items);
      ASSERT_TRUE(in.ok()) << in.status();
      want[k].emplace_back();
      for (const v1::AttendResult& r : in->results()) want[k].back().push_back(InlineAnswer(r));
    }
  }
  // Then the same rounds by reference on "c<k>r-", every client at once,
  // each with its own connection and region.
  std::vector<std::vector<std::vector<Answer>>> got(kClients);
  std::vector<absl::Status> failed(kClients);
  std::vector<std::thread> threads;
  for (int k = 0; k < kClients; ++k) {
    threads.emplace_back([&, k] {
      ClientOptions co;
      co.target = testing::LoopbackTarget(server_->port());
      Client client(co);
      absl::StatusOr<std::unique_ptr<HostRegion>> region = HostRegion::Create(&client, 1 << 18);
      if (!region.ok()) {
        failed[k] = region.status();
        return;
      }
      HostArena arena(region->get());
      for (int round = 0; round < kRounds; ++round) {
        const std::vector<ItemSpec> specs = RoundSpecs(round, 10 + k);
        std::vector<v1::AttendItem> items;
        arena.Reset();
        for (const ItemSpec& s : specs) items.push_back(ByRef(s, absl::StrCat("c", k, "r-"), arena));
        absl::StatusOr<v1::AttendResponse> r = Attend(client, items);
        if (!r.ok()) {
          failed[k] = r.status();
          return;
        }
        got[k].emplace_back();
        for (size_t i = 0; i < specs.size(); ++i) {
          got[k].back().push_back(RefAnswer(specs[i], items[i], r->results(i), arena));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int k = 0; k < kClients; ++k) {
    ASSERT_TRUE(failed[k].ok()) << "client " << k << ": " << failed[k];
    ASSERT_EQ(got[k].size(), want[k].size());
    for (int round = 0; round < kRounds; ++round) {
      for (size_t i = 0; i < want[k][round].size(); ++i) {
        ExpectSame(want[k][round][i], got[k][round][i], absl::StrCat("client ", k, " round ", round, " item ", i));
      }
    }
  }
}

TEST_F(DataPlaneTest, Bf16OutputIsTheF32OutputRoundedInlineAndByReference) {
  Prefill(*client_, "", 2);
  std::unique_ptr<HostRegion> region = NewRegion(client_.get(), 1 << 16);
  ASSERT_NE(region, nullptr);
  HostArena arena(region.get());
  for (v1::DType query_dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    ItemSpec s;
    s.seq = "s1";
    s.layer = 1;
    s.q_heads = 4;
    s.dtype = query_dtype;
    s.query = Gaussian(4 * kD, 77);
    absl::StatusOr<v1::AttendResponse> f32 = Attend(*client_, {Inline(s, "")});
    s.out_dtype = v1::DTYPE_BF16;
    arena.Reset();
    const v1::AttendItem ref = ByRef(s, "", arena);
    absl::StatusOr<v1::AttendResponse> bf16 = Attend(*client_, {Inline(s, ""), ref});
    ASSERT_TRUE(f32.ok()) << f32.status();
    ASSERT_TRUE(bf16.ok()) << bf16.status();
    const std::vector<float> out = OutputFloats(f32->results(0));
    const std::string& half = bf16->results(0).output();
    ASSERT_EQ(out.size(), 4u * kD);
    ASSERT_EQ(half.size(), out.size() * 2);
    for (size_t e = 0; e < out.size(); ++e) {
      uint16_t h;
      std::memcpy(&h, half.data() + 2 * e, 2);
      ASSERT_EQ(h, FloatToBf16(out[e])) << "element " << e << " of " << out[e];
    }
    // The lse does not depend on the output's dtype.
    ExpectSame(Answer{half, InlineAnswer(f32->results(0)).lse, f32->results(0).tokens()},
               InlineAnswer(bf16->results(0)), "bf16 inline");
    ExpectSame(InlineAnswer(bf16->results(0)), RefAnswer(s, ref, bf16->results(1), arena), "bf16 by reference");
  }
}

TEST_F(DataPlaneTest, AppendByReferenceStoresWhatInlineStores) {
  constexpr int kTokens = 200;
  std::unique_ptr<HostRegion> region = NewRegion(client_.get(), 1 << 20);
  ASSERT_NE(region, nullptr);
  HostArena arena(region.get());
  std::vector<v1::AppendChunk> inline_chunks, ref_chunks;
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    const std::string seq = dtype == v1::DTYPE_F32 ? "f32" : "bf16";
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const testing::Kv kv = testing::SyntheticKv(kTokens, kSmallN, 30 + layer);
      for (const auto& [first, count] : {std::pair<int, int>{0, 97}, {97, 64}, {161, 39}}) {
        v1::AppendChunk c = testing::ChunkOf("i-" + seq, layer, first, count, kv, dtype);
        inline_chunks.push_back(c);
        c.set_sequence_id("r-" + seq);
        *c.mutable_keys_ref() = arena.Put(c.keys());
        *c.mutable_values_ref() = arena.Put(c.values());
        c.clear_keys();
        c.clear_values();
        ref_chunks.push_back(c);
      }
    }
  }
  absl::StatusOr<v1::AppendResponse> in = client_->Append(inline_chunks);
  ASSERT_TRUE(in.ok()) << in.status();
  absl::StatusOr<v1::AppendResponse> by_ref = client_->Append(ref_chunks);
  ASSERT_TRUE(by_ref.ok()) << by_ref.status();
  EXPECT_EQ(by_ref->tokens_stored(), 4u * kTokens);
  EXPECT_EQ(by_ref->tokens_stored(), in->tokens_stored());
  // Sent again: acknowledged, not stored twice.
  absl::StatusOr<v1::AppendResponse> again = client_->Append({ref_chunks[0]});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tokens_stored(), 0u);
  EXPECT_EQ(again->tokens_duplicate(), 97u);

  for (const char* seq : {"f32", "bf16"}) {
    EXPECT_EQ(Lengths(*client_, std::string("i-") + seq), Lengths(*client_, std::string("r-") + seq));
    for (uint32_t layer = 0; layer < 2; ++layer) {
      const std::string want = ReadBytes(*client_, std::string("i-") + seq, layer);
      EXPECT_EQ(want.size(), 2u * kTokens * kSmallN * 4);
      EXPECT_TRUE(ReadBytes(*client_, std::string("r-") + seq, layer) == want) << seq << " layer " << layer;
      ItemSpec s;
      s.seq = seq;
      s.layer = layer;
      s.q_heads = 4;
      s.query = Gaussian(4 * kD, 40 + layer);
      absl::StatusOr<v1::AttendResponse> a = Attend(*client_, {Inline(s, "i-")});
      absl::StatusOr<v1::AttendResponse> b = Attend(*client_, {Inline(s, "r-")});
      ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
      ExpectSame(InlineAnswer(a->results(0)), InlineAnswer(b->results(0)), absl::StrCat(seq, " layer ", layer));
    }
  }
}

TEST_F(DataPlaneTest, BadReferencesAreRefusedByNameAndChangeNothing) {
  Prefill(*client_, "", 3);
  std::unique_ptr<HostRegion> region = NewRegion(client_.get(), 1 << 16);
  std::unique_ptr<HostRegion> small = NewRegion(client_.get(), 4096);
  ASSERT_NE(region, nullptr);
  ASSERT_NE(small, nullptr);
  const uint64_t bob = ForeignRegion(4096);
  uint64_t never = region->id() ^ 0x8000;
  while (never == bob || never == small->id() || never == 0) ++never;
  HostArena arena(region.get());
  const std::string stored = StoredState(*client_);
  const std::string lengths = Lengths(*client_, "s0") + Lengths(*client_, "s1");

  // items[0], valid and with a decode step, must not be stored either.
  ItemSpec good;
  good.seq = "s0";
  good.layer = 1;
  good.query = Gaussian(2 * kD, 5);
  good.key = Gaussian(kSmallN, 6);
  good.value = Gaussian(kSmallN, 7);
  ItemSpec bad = good;
  bad.seq = "s1";
  bad.layer = 0;
  bad.token_index = kPrefill;
  struct Case {
    const char* name;
    std::function<void(v1::AttendItem&)> spoil;
    C code;
    std::string message;  // exact; or, after a leading '*', a prefix
  };
  const auto id = [](uint64_t x) { return absl::StrCat(x); };
  const std::vector<Case> cases = {
      {"unknown region", [&](v1::AttendItem& it) { it.mutable_query_ref()->set_region_id(never); }, C::kNotFound,
       "items[1].query_ref.region_id " + id(never) + " not found"},
      {"another tenant's region", [&](v1::AttendItem& it) { it.mutable_query_ref()->set_region_id(bob); }, C::kNotFound,
       "items[1].query_ref.region_id " + id(bob) + " not found"},
      {"another tenant's output region", [&](v1::AttendItem& it) { it.mutable_output_ref()->set_region_id(bob); },
       C::kNotFound, "items[1].output_ref.region_id " + id(bob) + " not found"},
      {"unknown new_value region", [&](v1::AttendItem& it) { it.mutable_new_value_ref()->set_region_id(never); },
       C::kNotFound, "items[1].new_value_ref.region_id " + id(never) + " not found"},
      {"past the end", [&](v1::AttendItem& it) { it.mutable_query_ref()->set_offset((1 << 16) - 256); }, C::kOutOfRange,
       "items[1].query_ref.offset 65280 + 512 bytes is past the end of region " + id(region->id()) + " (65536 bytes)"},
      {"offset + size past 2^64",
       [&](v1::AttendItem& it) { it.mutable_new_key_ref()->set_offset(std::numeric_limits<uint64_t>::max() - 3); },
       C::kOutOfRange,
       "items[1].new_key_ref.offset 18446744073709551612 + 512 bytes is past the end of region " + id(region->id()) +
           " (65536 bytes)"},
      {"offset past 2^64 in lse_ref",
       [&](v1::AttendItem& it) { it.mutable_lse_ref()->set_offset(std::numeric_limits<uint64_t>::max() - 3); },
       C::kOutOfRange,
       "items[1].lse_ref.offset 18446744073709551612 + 8 bytes is past the end of region " + id(region->id()) +
           " (65536 bytes)"},
      {"misaligned query", [&](v1::AttendItem& it) { it.mutable_query_ref()->set_offset(2); }, C::kInvalidArgument,
       "items[1].query_ref.offset 2 is not a multiple of 4"},
      {"misaligned lse", [&](v1::AttendItem& it) { it.mutable_lse_ref()->set_offset(4098); }, C::kInvalidArgument,
       "items[1].lse_ref.offset 4098 is not a multiple of 4"},
      {"a region smaller than the query",
       [&](v1::AttendItem& it) {
         it.set_q_heads(32);
         *it.mutable_query_ref() = small->Ref(0);
       },
       C::kOutOfRange,
       "items[1].query_ref.offset 0 + 8192 bytes is past the end of region " + id(small->id()) + " (4096 bytes)"},
      {"query and query_ref", [&](v1::AttendItem& it) { it.set_query(std::string(512, '\0')); }, C::kInvalidArgument,
       "items[1].query and query_ref are both set"},
      {"new_key and new_key_ref", [&](v1::AttendItem& it) { it.set_new_key(std::string(512, '\0')); },
       C::kInvalidArgument, "items[1].new_key and new_key_ref are both set"},
      {"output_ref without lse_ref", [&](v1::AttendItem& it) { it.clear_lse_ref(); }, C::kInvalidArgument,
       "items[1].output_ref and lse_ref: set both or neither"},
      {"lse_ref without output_ref", [&](v1::AttendItem& it) { it.clear_output_ref(); }, C::kInvalidArgument,
       "items[1].output_ref and lse_ref: set both or neither"},
      {"output_dtype fp16", [&](v1::AttendItem& it) { it.set_output_dtype(v1::DTYPE_FP16); }, C::kInvalidArgument,
       "items[1].output_dtype fp16 is not f32 or bf16"},
      {"nan in the query",
       [&](v1::AttendItem& it) {
         reinterpret_cast<float*>(arena.At(it.query_ref()))[5] = std::numeric_limits<float>::quiet_NaN();
       },
       C::kInvalidArgument, "items[1].query_ref element 5 is nan; must be finite"},
      {"a query element above the query limit",
       [&](v1::AttendItem& it) { reinterpret_cast<float*>(arena.At(it.query_ref()))[6] = -0x1p100f; },
       C::kInvalidArgument, "items[1].query_ref element 6 is -1.26765e+30; |x| must be <= 7.92282e+28"},
      {"inf in new_key",
       [&](v1::AttendItem& it) {
         reinterpret_cast<float*>(arena.At(it.new_key_ref()))[7] = std::numeric_limits<float>::infinity();
       },
       C::kInvalidArgument, "items[1].new_key_ref element 7 is inf; must be finite"},
      {"new_value above the limit",
       [&](v1::AttendItem& it) { reinterpret_cast<float*>(arena.At(it.new_value_ref()))[3] = 1e6f; },
       C::kInvalidArgument, "*items[1].new_value_ref element 3 is 1e+06; |x| must be <= "},
  };
  std::string unknown_message;
  for (const Case& c : cases) {
    arena.Reset();
    std::vector<v1::AttendItem> items = {ByRef(good, "", arena), ByRef(bad, "", arena)};
    c.spoil(items[1]);
    absl::StatusOr<v1::AttendResponse> r = Attend(*client_, items);
    EXPECT_EQ(r.status().code(), c.code) << c.name << ": " << r.status();
    const std::string got(r.status().message());
    if (c.message.front() == '*') {
      EXPECT_TRUE(absl::StartsWith(got, c.message.substr(1))) << c.name << ": " << got;
    } else {
      EXPECT_EQ(got, c.message) << c.name;
    }
    EXPECT_EQ(StoredState(*client_), stored) << c.name;
    EXPECT_EQ(Lengths(*client_, "s0") + Lengths(*client_, "s1"), lengths) << c.name;
  }

  // Without decode steps the backend checks the queries as it reads them:
  // the same words, by reference and inline, in f32 and bf16, for a
  // non-finite element and for one above kQueryLimit (-2^100, exact in
  // both dtypes).
  for (const v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16}) {
    for (const bool by_ref : {true, false}) {
      for (const bool finite : {false, true}) {
        arena.Reset();
        ItemSpec plain = good;
        plain.dtype = dtype;
        plain.key.clear();
        plain.value.clear();
        plain.token_index.reset();
        ItemSpec spoilt = plain;
        spoilt.seq = "s1";
        spoilt.query[9] = finite ? -0x1p100f : -std::numeric_limits<float>::infinity();
        std::vector<v1::AttendItem> items;
        for (const ItemSpec& s : {plain, spoilt}) items.push_back(by_ref ? ByRef(s, "", arena) : Inline(s, ""));
        absl::StatusOr<v1::AttendResponse> r = Attend(*client_, items);
        EXPECT_EQ(r.status().code(), C::kInvalidArgument) << r.status();
        EXPECT_EQ(r.status().message(),
                  absl::StrCat("items[1].query", by_ref ? "_ref" : "", " element 9 is ",
                               finite ? "-1.26765e+30; |x| must be <= 7.92282e+28" : "-inf; must be finite"))
            << "dtype " << dtype << (by_ref ? " by reference" : " inline");
        EXPECT_EQ(StoredState(*client_), stored);
      }
    }
  }

  // Append by reference: the same words for the chunk's fields.
  v1::AppendChunk chunk;
  chunk.set_sequence_id("s0");
  chunk.set_layer(0);
  chunk.set_first_token(kPrefill);
  chunk.set_token_count(2);
  chunk.set_dtype(v1::DTYPE_F32);
  arena.Reset();
  *chunk.mutable_keys_ref() = arena.Put(std::string(2 * kSmallN * 4, '\0'));
  *chunk.mutable_values_ref() = arena.Put(std::string(2 * kSmallN * 4, '\0'));
  struct AppendCase {
    std::function<void(v1::AppendChunk&)> spoil;
    C code;
    std::string message;
  };
  const std::vector<AppendCase> append_cases = {
      {[&](v1::AppendChunk& c) { c.mutable_keys_ref()->set_region_id(never); }, C::kNotFound,
       "keys_ref.region_id " + id(never) + " not found"},
      {[&](v1::AppendChunk& c) { c.mutable_values_ref()->set_region_id(bob); }, C::kNotFound,
       "values_ref.region_id " + id(bob) + " not found"},
      {[&](v1::AppendChunk& c) { c.mutable_values_ref()->set_offset((1 << 16) - 512); }, C::kOutOfRange,
       "values_ref.offset 65024 + 1024 bytes is past the end of region " + id(region->id()) + " (65536 bytes)"},
      {[&](v1::AppendChunk& c) { c.mutable_keys_ref()->set_offset(6); }, C::kInvalidArgument,
       "keys_ref.offset 6 is not a multiple of 4"},
      {[&](v1::AppendChunk& c) { c.set_keys(std::string(2 * kSmallN * 4, '\0')); }, C::kInvalidArgument,
       "keys/values and keys_ref/values_ref are both set; send one or the other"},
  };
  for (const AppendCase& c : append_cases) {
    v1::AppendChunk spoilt = chunk;
    c.spoil(spoilt);
    absl::StatusOr<v1::AppendResponse> r = client_->Append({spoilt});
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    // The service says which chunk of the stream it refused.
    EXPECT_EQ(r.status().message(), "chunk 0 of the stream (0 accepted before it): " + c.message);
    EXPECT_EQ(StoredState(*client_), stored) << c.message;
    EXPECT_EQ(Lengths(*client_, "s0") + Lengths(*client_, "s1"), lengths) << c.message;
  }
}

TEST_F(DataPlaneTest, AnUnregisteredRegionIsNotFound) {
  Prefill(*client_, "", 4);
  std::unique_ptr<HostRegion> region = NewRegion(client_.get(), 1 << 16);
  ASSERT_NE(region, nullptr);
  HostArena arena(region.get());
  ItemSpec s;
  s.seq = "s0";
  s.query = Gaussian(2 * kD, 9);
  s.key = Gaussian(kSmallN, 10);
  s.value = Gaussian(kSmallN, 11);
  s.token_index = kPrefill;
  const v1::AttendItem item = ByRef(s, "", arena);
  absl::StatusOr<v1::AttendResponse> r = Attend(*client_, {item});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(region->Unregister().ok());
  const std::string stored = StoredState(*client_);
  const std::string lengths = Lengths(*client_, "s0");
  s.token_index = kPrefill + 1;
  arena.Reset();
  r = Attend(*client_, {ByRef(s, "", arena)});
  EXPECT_EQ(r.status().code(), C::kNotFound);
  EXPECT_EQ(r.status().message(), absl::StrCat("items[0].query_ref.region_id ", region->id(), " not found"));
  EXPECT_EQ(StoredState(*client_), stored);
  EXPECT_EQ(Lengths(*client_, "s0"), lengths);
}

}  // namespace
}  // namespace driftkv
