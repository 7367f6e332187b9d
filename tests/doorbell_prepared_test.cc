// Prepared requests on a doorbell (wire/doorbell.h, PREPARED REQUESTS):
// first ServeDoorbellRequest on plain memory with a fake AttendFn (what a
// slot keeps, token indexes advanced, every refusal exact and changing
// nothing), then a real server: a decode loop of prepared requests with
// decode steps by reference answers bit for bit what unary inline Attends
// with the same steps answer on a twin sequence.
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/doorbell.h"
#include "client/regions.h"
#include "gtest/gtest.h"
#include "service/doorbell.h"
#include "tests/bell_memory.h"
#include "tests/tenant_server.h"
#include "wire/doorbell.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using C = absl::StatusCode;
using testing_bell::BellMemory;
using testing_bell::ExpectAnswered;

v1::TensorRef Ref(uint64_t region, uint64_t offset) {
  v1::TensorRef r;
  r.set_region_id(region);
  r.set_offset(offset);
  return r;
}

// Two items by reference, the second with a decode step at token 40.
v1::AttendRequest ByReference() {
  v1::AttendRequest r;
  for (int i = 0; i < 2; ++i) {
    v1::AttendItem* it = r.add_items();
    it->set_sequence_id(absl::StrCat("seq", i));
    it->set_layer(1);
    it->set_q_heads(2);
    *it->mutable_query_ref() = Ref(9, 64 * i);
    *it->mutable_output_ref() = Ref(9, 4096 + 64 * i);
  }
  *r.mutable_items(1)->mutable_new_key_ref() = Ref(9, 8192);
  *r.mutable_items(1)->mutable_new_value_ref() = Ref(9, 8192 + 256);
  r.mutable_items(1)->set_new_token_index(40);
  return r;
}

void Prepare(BellMemory& m, uint32_t slot, const v1::AttendRequest& r, int64_t deadline = 0) {
  const std::string bytes = r.SerializeAsString();
  m.Ring(doorbell::kPrepare, slot, 0, bytes, static_cast<uint32_t>(bytes.size()), deadline);
  m.Serve();
}

void RunPrepared(BellMemory& m, uint32_t slot, uint64_t offset) {
  // Garbage in the request area and a claimed size: neither is read.
  m.Ring(doorbell::kAttendPrepared, slot, offset, std::string(32, '\xff'), 0xFFFFFFFFu);
  m.Serve();
}

TEST(DoorbellPreparedTest, ASlotAnswersItsRequestWithTokenIndexesAdvanced) {
  BellMemory m(512, 256);
  m.answer.add_results()->set_tokens(41);
  const v1::AttendRequest r = ByReference();
  Prepare(m, 7, r);
  ExpectAnswered(m, C::kOk);
  EXPECT_EQ(m.server()->response_bytes, 0u);
  EXPECT_EQ(m.calls, 0);  // preparing attends nothing
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{5}, uint64_t{2}}) {
    RunPrepared(m, 7, offset);
    ExpectAnswered(m, C::kOk);
    v1::AttendRequest expected = r;
    expected.mutable_items(1)->set_new_token_index(40 + offset);
    EXPECT_EQ(m.seen.SerializeAsString(), expected.SerializeAsString()) << offset;
    EXPECT_FALSE(m.seen.items(0).has_new_token_index());  // an item without one gets none
    v1::AttendResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(m.Response()));
    EXPECT_EQ(parsed.SerializeAsString(), m.answer.SerializeAsString());
  }
  EXPECT_EQ(m.calls, 4);
  EXPECT_EQ(m.seen_tenant, "alice");
  // Another slot is independent; preparing a slot again replaces it; no
  // bytes empty it.
  v1::AttendRequest other = r;
  other.mutable_items(0)->set_layer(3);
  Prepare(m, 0, other);
  RunPrepared(m, 0, 0);
  EXPECT_EQ(m.seen.items(0).layer(), 3u);
  RunPrepared(m, 7, 0);
  EXPECT_EQ(m.seen.items(0).layer(), 1u);
  Prepare(m, 7, other);
  RunPrepared(m, 7, 0);
  EXPECT_EQ(m.seen.items(0).layer(), 3u);
  m.Ring(doorbell::kPrepare, 7, 0, "", 0);
  m.Serve();
  ExpectAnswered(m, C::kOk);
  RunPrepared(m, 7, 0);
  ExpectAnswered(m, C::kNotFound);
  EXPECT_EQ(m.Response(), "doorbell prepared slot 7 is empty");
  // The plain kind still works beside prepared slots.
  m.Request(r.SerializeAsString(), static_cast<uint32_t>(r.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kOk);
  EXPECT_EQ(m.seen.SerializeAsString(), r.SerializeAsString());
}

TEST(DoorbellPreparedTest, RefusalsAreExactAndChangeNothing) {
  BellMemory m(512, 256);
  const v1::AttendRequest r = ByReference();
  Prepare(m, 3, r);
  ExpectAnswered(m, C::kOk);
  int calls = 0;
  auto still_prepared = [&] {
    RunPrepared(m, 3, 0);
    ExpectAnswered(m, C::kOk);
    EXPECT_EQ(m.seen.SerializeAsString(), r.SerializeAsString());
    EXPECT_EQ(m.calls, ++calls);
  };
  still_prepared();
  // An unknown kind.
  m.Ring(9, 3, 0, r.SerializeAsString(), static_cast<uint32_t>(r.ByteSizeLong()));
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), "doorbell kind 9 is not 0 (attend), 1 (prepare) or 2 (attend prepared)");
  // Slots past the limit, either kind.
  for (uint32_t kind : {uint32_t{doorbell::kPrepare}, uint32_t{doorbell::kAttendPrepared}}) {
    for (uint32_t slot : {doorbell::kMaxPreparedSlots, std::numeric_limits<uint32_t>::max()}) {
      m.Ring(kind, slot, 0, r.SerializeAsString(), static_cast<uint32_t>(r.ByteSizeLong()));
      m.Serve();
      ExpectAnswered(m, C::kInvalidArgument);
      EXPECT_EQ(m.Response(),
                absl::StrCat("doorbell slot ", slot, " is not below kMaxPreparedSlots ", doorbell::kMaxPreparedSlots));
    }
  }
  // Inline tensors, each field: refused, the slot keeps its request.
  for (const char* field : {"query", "new_key", "new_value"}) {
    v1::AttendRequest bad = r;
    v1::AttendItem* it = bad.mutable_items(1);
    if (std::string(field) == "query") it->set_query(std::string(64, 'q'));
    if (std::string(field) == "new_key") it->set_new_key(std::string(8, 'k'));
    if (std::string(field) == "new_value") it->set_new_value(std::string(8, 'v'));
    Prepare(m, 3, bad);
    ExpectAnswered(m, C::kInvalidArgument);
    EXPECT_EQ(m.Response(),
              absl::StrCat("items[1].", field, " is inline; a prepared request names its tensors by reference (", field,
                           "_ref)"));
  }
  // Bytes that are no AttendRequest; bytes past the capacity.
  m.Ring(doorbell::kPrepare, 3, 0, std::string(16, '\xff'), 16);
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), "doorbell prepared request of 16 bytes is not an AttendRequest");
  m.Ring(doorbell::kPrepare, 3, 0, "", 513);
  m.Serve();
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), "doorbell request_bytes 513 exceeds its request capacity 512");
  // A late kPrepare prepares nothing.
  v1::AttendRequest late = r;
  late.mutable_items(0)->set_layer(5);
  Prepare(m, 3, late, MonotonicNs() - 1'000'000);
  ExpectAnswered(m, C::kDeadlineExceeded);
  // An offset that overflows the item's index: nothing attended.
  RunPrepared(m, 3, std::numeric_limits<uint64_t>::max() - 39);
  ExpectAnswered(m, C::kInvalidArgument);
  EXPECT_EQ(m.Response(), absl::StrCat("doorbell token_index_offset ", std::numeric_limits<uint64_t>::max() - 39,
                                       " overflows items[1].new_token_index 40 of prepared slot 3"));
  EXPECT_EQ(m.calls, calls);
  // The largest offset that fits reaches the handler, which judges it.
  RunPrepared(m, 3, std::numeric_limits<uint64_t>::max() - 40);
  ExpectAnswered(m, C::kOk);
  EXPECT_EQ(m.seen.items(1).new_token_index(), std::numeric_limits<uint64_t>::max());
  ++calls;
  still_prepared();
}

TEST(DoorbellPreparedTest, PreparedBytesAreBounded) {
  // Requests of ~1 MiB each (a long sequence id per item) in a doorbell of
  // 2 MiB request capacity: kMaxPreparedBytes / 1 MiB of them fit.
  constexpr uint64_t kCapacity = 2 << 20;
  BellMemory m(kCapacity, 256);
  v1::AttendRequest big = ByReference();
  big.mutable_items(0)->set_sequence_id(std::string(1 << 20, 's'));
  const uint64_t each = big.ByteSizeLong();
  const uint32_t fit = static_cast<uint32_t>(doorbell::kMaxPreparedBytes / each);
  for (uint32_t slot = 0; slot < fit; ++slot) {
    Prepare(m, slot, big);
    ASSERT_EQ(m.server()->code, 0) << slot << ": " << m.Response();
  }
  Prepare(m, fit, big);
  ExpectAnswered(m, C::kResourceExhausted);
  EXPECT_EQ(m.Response(),
            absl::StrCat("doorbell prepared request of ", each, " bytes: the doorbell's prepared requests would hold ",
                         each * (fit + 1), " bytes (kMaxPreparedBytes ", doorbell::kMaxPreparedBytes, ")"));
  RunPrepared(m, fit, 0);
  ExpectAnswered(m, C::kNotFound);
  // Replacing a slot counts its old bytes out; emptying one makes room.
  Prepare(m, 0, big);
  ExpectAnswered(m, C::kOk);
  m.Ring(doorbell::kPrepare, 1, 0, "", 0);
  m.Serve();
  Prepare(m, fit, big);
  ExpectAnswered(m, C::kOk);
}

// ---- over a real server ----

class DoorbellPreparedE2eTest : public testing::TenantServerTest {};

TEST_F(DoorbellPreparedE2eTest, ADecodeLoopOfPreparedRequestsEqualsInlineAttendsBitForBit) {
  constexpr int kD = 64, kSteps = 6;
  // "t": a twin of the fixture's "s" (same tokens, same chunks), attended
  // inline with the same decode steps.
  const testing::Kv kv = testing::SyntheticKv(kTokens, testing::kSmallN, 7);
  std::vector<v1::AppendChunk> chunks;
  for (uint32_t layer = 0; layer < 2; ++layer) chunks.push_back(testing::ChunkOf("t", layer, 0, kTokens, kv));
  ASSERT_TRUE(alice_->Append(chunks).ok());

  // One data region: per layer a query (f32), a step key and value (f32),
  // an output (f32) and lse.
  const size_t qbytes = static_cast<size_t>(kQHeads) * kD * 4, kvbytes = testing::kSmallN * 4;
  const size_t per_layer = 2 * qbytes + 2 * kvbytes + kQHeads * 4;
  absl::StatusOr<std::unique_ptr<HostRegion>> data = HostRegion::Create(alice_.get(), 2 * per_layer);
  ASSERT_TRUE(data.ok()) << data.status();
  auto query_at = [&](int l) { return l * per_layer; };
  auto key_at = [&](int l) { return l * per_layer + qbytes; };
  auto value_at = [&](int l) { return l * per_layer + qbytes + kvbytes; };
  auto out_at = [&](int l) { return l * per_layer + qbytes + 2 * kvbytes; };
  auto lse_at = [&](int l) { return l * per_layer + 2 * qbytes + 2 * kvbytes; };
  absl::StatusOr<std::unique_ptr<HostRegion>> bell_region =
      HostRegion::Create(alice_.get(), DoorbellClient::Bytes(16 << 10, 16 << 10));
  ASSERT_TRUE(bell_region.ok());
  absl::StatusOr<std::unique_ptr<DoorbellClient>> bell =
      DoorbellClient::Open(alice_.get(), bell_region->get(), 0, 16 << 10, 16 << 10);
  ASSERT_TRUE(bell.ok()) << bell.status();
  uint8_t* base = static_cast<uint8_t*>((*data)->data());
  const uint64_t id = (*data)->id();
  for (uint32_t l = 0; l < 2; ++l) {
    v1::AttendRequest r;
    v1::AttendItem* it = r.add_items();
    it->set_sequence_id("s");
    it->set_layer(l);
    it->set_q_heads(kQHeads);
    it->set_dtype(v1::DTYPE_F32);
    *it->mutable_query_ref() = Ref(id, query_at(l));
    *it->mutable_new_key_ref() = Ref(id, key_at(l));
    *it->mutable_new_value_ref() = Ref(id, value_at(l));
    *it->mutable_output_ref() = Ref(id, out_at(l));
    *it->mutable_lse_ref() = Ref(id, lse_at(l));
    it->set_new_token_index(kTokens);
    ASSERT_TRUE((*bell)->Prepare(l, r).ok());
  }
  v1::AttendResponse response;
  for (int s = 0; s < kSteps; ++s) {
    for (uint32_t l = 0; l < 2; ++l) {
      const std::vector<float> q = testing::SyntheticQuery(kQHeads, kD, 100 + s * 2 + l);
      const testing::Kv step = testing::SyntheticKv(1, testing::kSmallN, 200 + s * 2 + l);
      std::memcpy(base + query_at(l), q.data(), qbytes);
      std::memcpy(base + key_at(l), step.keys.data(), kvbytes);
      std::memcpy(base + value_at(l), step.values.data(), kvbytes);
      ASSERT_TRUE((*bell)->AttendPrepared(l, s, &response, absl::Seconds(5)).ok()) << s << " " << l;
      ASSERT_EQ(response.results_size(), 1);
      EXPECT_EQ(response.results(0).tokens(), static_cast<uint64_t>(kTokens + s + 1));
      v1::AttendRequest inline_request;
      v1::AttendItem* it = inline_request.add_items();
      *it = testing::QueryItem("t", l, q, kQHeads);
      it->set_new_key(step.keys.data(), kvbytes);
      it->set_new_value(step.values.data(), kvbytes);
      it->set_new_token_index(kTokens + s);
      absl::StatusOr<v1::AttendResponse> u = alice_->Attend(inline_request);
      ASSERT_TRUE(u.ok()) << u.status();
      ASSERT_EQ(u->results(0).output().size(), qbytes);
      EXPECT_EQ(std::memcmp(base + out_at(l), u->results(0).output().data(), qbytes), 0) << s << " " << l;
      ASSERT_EQ(u->results(0).lse_size(), kQHeads);
      EXPECT_EQ(std::memcmp(base + lse_at(l), u->results(0).lse().data(), kQHeads * 4), 0) << s << " " << l;
    }
  }
  // The steps were stored: both sequences hold kTokens + kSteps tokens.
  for (const char* seq : {"s", "t"}) {
    absl::StatusOr<v1::LengthResponse> len = alice_->Length(seq);
    ASSERT_TRUE(len.ok());
    EXPECT_EQ(len->layers(1).tokens(), static_cast<uint64_t>(kTokens + kSteps)) << seq;
  }
  // Running the first step's requests again repeats tokens already stored
  // with other data: refused by the handler as any such Attend is.
  const absl::Status repeat = (*bell)->AttendPrepared(0, 0, &response, absl::Seconds(5));
  EXPECT_EQ(repeat.code(), C::kAlreadyExists) << repeat;
  // Bob's doorbell knows nothing of alice's slots.
  absl::StatusOr<std::unique_ptr<HostRegion>> bobs = HostRegion::Create(bob_.get(), DoorbellClient::Bytes(4096, 4096));
  ASSERT_TRUE(bobs.ok());
  absl::StatusOr<std::unique_ptr<DoorbellClient>> bob_bell =
      DoorbellClient::Open(bob_.get(), bobs->get(), 0, 4096, 4096);
  ASSERT_TRUE(bob_bell.ok());
  EXPECT_EQ((*bob_bell)->AttendPrepared(0, 0, &response, absl::Seconds(5)).code(), C::kNotFound);
}

}  // namespace
}  // namespace driftkv
