// Integrity and tenants through the handler, without a network: chunk
// checksums (DATA_LOSS), repeated tokens compared with what is stored
// (ALREADY_EXISTS, nothing changed), tombstones of released ids (the
// handler's injectable clock), tenant isolation and quotas; and the pieces
// behind them (CRC-32C, the tokens file).
#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/quoted.h"
#include "service/snapshot_file.h"
#include "service/tokens.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "wire/crc32c.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using testing::ChunkOf;
using testing::QueryItem;
using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;

constexpr int kN = 128, kD = 64;
using C = absl::StatusCode;

class IntegrityTest : public testing::HandlerFixture {
 protected:
  void SetUp() override { Make(); }

  absl::Status Push(const std::string& seq, const testing::Kv& kv, int tokens, const std::string& tenant = "",
                    bool new_incarnation = false) {
    v1::AppendResponse r;
    for (int t = 0; t < tokens; t += 50) {
      v1::AppendChunk c = ChunkOf(seq, 0, t, std::min(50, tokens - t), kv);
      c.set_new_incarnation(new_incarnation);
      absl::Status st = h_->Append(c, &r, tenant);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  absl::Status Append(const v1::AppendChunk& c, const std::string& tenant = "") {
    v1::AppendResponse r;
    return h_->Append(c, &r, tenant);
  }
  v1::StatsResponse Stats(const std::string& tenant = "") {
    v1::StatsResponse s;
    h_->Stats(&s, tenant);
    return s;
  }
  // Every stored value of layer 0, as read back: a rejected call must not
  // change one bit of it.
  std::string ReadAll(const std::string& seq, const std::string& tenant = "") {
    v1::ReadRequest req;
    req.set_sequence_id(seq);
    std::string all;
    absl::Status st = h_->Read(
        req,
        [&](const v1::ReadChunk& c) {
          absl::StrAppend(&all, c.keys(), c.values());
          return true;
        },
        tenant);
    return st.ok() ? all : absl::StrCat("error: ", st.ToString());
  }
  // A warm restart: writes the handler's snapshot into the folder `name`
  // (emptied first), then replaces the handler with one of `o` that loads
  // it; the summary of the load in *loaded.
  void Restart(const std::string& name, const ServiceOptions& o, Handler::SnapshotSummary* loaded) {
    const std::string dir = ::testing::TempDir() + "/" + name;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    Handler::SnapshotSummary written;
    ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
    Make(o);
    ASSERT_TRUE(h_->LoadSnapshot(dir, loaded).ok());
  }
  std::string State() {
    v1::StatsResponse s = Stats();
    return absl::StrCat(s.sequences(), "/", s.pages_in_use(), "/", s.tokens_compressed(), "/", s.tokens_window(), "/",
                        s.tokens_ingested());
  }
};

// Client strings in messages and logs: printable ASCII as given, anything
// that could forge a log line escaped.
TEST(QuotedTest, EscapesEveryByteThatIsNotPrintableAscii) {
  EXPECT_EQ(Quoted("chat-1"), "\"chat-1\"");
  EXPECT_EQ(Quoted(std::string("\0a\nb\"\\\x1b[2J\x7f\xc3\xbc", 13)),
            "\"\\x00a\\x0ab\\\"\\\\\\x1b[2J\\x7f\\xc3\\xbc\"");
  EXPECT_EQ(ForLog("line\nforged \"x\""), "line\\x0aforged \"x\"");
}

TEST(Crc32cTest, KnownVectorsAndExtension) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  const std::string a = "driftkv keys", b = " and values, 8+ bytes";
  EXPECT_EQ(Crc32cExtend(Crc32c(a), b.data(), b.size()), Crc32c(a + b));
}

TEST_F(IntegrityTest, BadChunkChecksumIsDataLossAndStoresNothing) {
  const testing::Kv kv = SyntheticKv(100, kN, 1);
  v1::AppendChunk c = ChunkOf("s", 0, 0, 100, kv, v1::DTYPE_BF16);
  const uint32_t crc = Crc32cExtend(Crc32c(c.keys()), c.values().data(), c.values().size());
  c.set_crc32c(crc ^ 1);
  const std::string before = State();
  absl::Status st = Append(c);
  EXPECT_EQ(st.code(), C::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "crc32c")) << st;
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(absl::StartsWith(ReadAll("s"), "error: NOT_FOUND")) << ReadAll("s");
  // One flipped byte of the values, the checksum of the original.
  c.set_crc32c(crc);
  (*c.mutable_values())[7] ^= 0x10;
  EXPECT_EQ(Append(c).code(), C::kDataLoss);
  EXPECT_EQ(State(), before);
  (*c.mutable_values())[7] ^= 0x10;
  EXPECT_TRUE(Append(c).ok());
  EXPECT_EQ(metrics_.integrity_rejections[kRejectCrc32c]->Value(), 2);
  EXPECT_EQ(Stats().tokens_ingested(), 100u);
}

TEST_F(IntegrityTest, RepeatedWindowTokensWithOtherDataAreRejectedNamingTheRange) {
  const testing::Kv kv = SyntheticKv(60, kN, 2);
  ASSERT_TRUE(Push("w", kv, 40).ok());  // 40 tokens, all in the window (R + P = 64)
  const std::string stored = ReadAll("w"), before = State();
  testing::Kv other = kv;
  for (int j = 0; j < kN; ++j) other.keys[25 * kN + j] += 0.5f;  // token 25 differs
  absl::Status st = Append(ChunkOf("w", 0, 20, 10, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tokens [25, 26) of layer 0 of sequence_id \"w\"")) << st;
  EXPECT_EQ(ReadAll("w"), stored);
  EXPECT_EQ(State(), before);
  // A chunk that overlaps the end: the repeated part differs, so its new
  // tokens are not stored either.
  st = Append(ChunkOf("w", 0, 20, 30, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_EQ(State(), before);
  // The same data, another dtype whose bf16 rounding is the same: a duplicate.
  v1::AppendResponse r;
  ASSERT_TRUE(h_->Append(ChunkOf("w", 0, 0, 40, kv, v1::DTYPE_BF16), &r).ok());
  EXPECT_EQ(r.tokens_duplicate(), 40u);
}

TEST_F(IntegrityTest, RepeatedPagedTokensAreComparedByDigest) {
  const testing::Kv kv = SyntheticKv(200, kN, 3);
  ASSERT_TRUE(Push("p", kv, 200).ok());
  ASSERT_GT(Stats().pages_in_use(), 3u);  // tokens [0, 128) at least are in pages
  const std::string stored = ReadAll("p"), before = State();
  testing::Kv other = kv;
  other.values[70 * kN + 3] = -other.values[70 * kN + 3] + 0.25f;  // one value of token 70
  absl::Status st = Append(ChunkOf("p", 0, 64, 20, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tokens [70, 71)")) << st;
  EXPECT_EQ(ReadAll("p"), stored);
  EXPECT_EQ(State(), before);
  EXPECT_EQ(metrics_.integrity_rejections[kRejectRepeat]->Value(), 1);
  // An exact retry of paged and window tokens is still a duplicate.
  v1::AppendResponse r;
  ASSERT_TRUE(h_->Append(ChunkOf("p", 0, 10, 190, kv), &r).ok());
  EXPECT_EQ(r.tokens_duplicate(), 190u);
  EXPECT_EQ(ReadAll("p"), stored);
}

// Pages appended after a warm restart are compared by digest too (the
// digests stay aligned with token positions after the restored ones).
TEST_F(IntegrityTest, PagesAppendedAfterARestoreAreStillComparedByDigest) {
  const testing::Kv kv = SyntheticKv(600, kN, 5);
  ASSERT_TRUE(Push("r", kv, 300).ok());
  Handler::SnapshotSummary loaded;
  ASSERT_NO_FATAL_FAILURE(Restart("integrity_restore", SmallOptions(), &loaded));
  ASSERT_EQ(loaded.sequences, 1u);
  v1::AppendResponse r;
  for (int t = 300; t < 600; t += 50) ASSERT_TRUE(h_->Append(ChunkOf("r", 0, t, 50, kv), &r).ok());
  v1::LengthRequest lr;
  lr.set_sequence_id("r");
  v1::LengthResponse len;
  ASSERT_TRUE(h_->Length(lr, &len).ok());
  ASSERT_GE(len.layers(0).compressed_tokens(), 340u);  // [300, 340) is in pages
  // Exact retries of restored and of new paged tokens are duplicates.
  ASSERT_TRUE(h_->Append(ChunkOf("r", 0, 0, 40, kv), &r).ok());
  ASSERT_TRUE(h_->Append(ChunkOf("r", 0, 300, 40, kv), &r).ok());
  // Other data for a token paged after the restore is refused.
  const std::string stored = ReadAll("r");
  testing::Kv other = kv;
  other.values[310 * kN + 1] += 0.5f;
  absl::Status st = Append(ChunkOf("r", 0, 300, 40, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tokens [310, 311)")) << st;
  EXPECT_EQ(ReadAll("r"), stored);
}

// The snapshot carries the tombstones and the token digests: after a warm
// restart a released id is still released, and a repeat of a restored
// paged token with other data is still refused.
TEST_F(IntegrityTest, SnapshotsCarryTombstonesAndDigests) {
  ServiceOptions o = SmallOptions();
  o.tombstone_seconds = 600;
  Make(o);
  const testing::Kv kv = SyntheticKv(200, kN, 15);
  ASSERT_TRUE(Push("p", kv, 200).ok());
  ASSERT_TRUE(Push("gone", kv, 30).ok());
  v1::ReleaseRequest rel;
  rel.set_sequence_id("gone");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  Handler::SnapshotSummary loaded;
  ASSERT_NO_FATAL_FAILURE(Restart("tombstones_digests", o, &loaded));
  ASSERT_EQ(loaded.sequences, 1u);
  EXPECT_EQ(Stats().tombstones(), 1u);
  absl::Status st = Push("gone", kv, 30);
  EXPECT_EQ(st.code(), C::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "sequence_id \"gone\" was released")) << st;
  const std::string stored = ReadAll("p");
  testing::Kv other = kv;
  other.values[70 * kN + 3] = -other.values[70 * kN + 3] + 0.25f;  // a restored paged token
  st = Append(ChunkOf("p", 0, 64, 20, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tokens [70, 71)")) << st;
  EXPECT_EQ(ReadAll("p"), stored);
  v1::AppendResponse r;
  ASSERT_TRUE(h_->Append(ChunkOf("p", 0, 0, 200, kv), &r).ok());
  EXPECT_EQ(r.tokens_duplicate(), 200u);
  // A server with tombstones off restores none.
  o.tombstone_seconds = 0;
  ASSERT_NO_FATAL_FAILURE(Restart("tombstones_digests", o, &loaded));
  EXPECT_EQ(Stats().tombstones(), 0u);
}

// Forks share their source's pages (Handler::Fork); a snapshot writes a
// page shared within a tenant once (the others name it), and a warm
// restart restores every sequence bit for bit, its paged tokens still
// compared by digest, the shared pages held once again by reference.
TEST_F(IntegrityTest, ForkedSequencesRestoreBitIdenticallyAndSharedOnce) {
  // Other data in each layer: a page repeats only where forks share it.
  const testing::Kv kv = SyntheticKv(400, kN, 16), other = SyntheticKv(400, kN, 17);
  const testing::Kv kv1 = SyntheticKv(400, kN, 26), other1 = SyntheticKv(400, kN, 27);
  for (uint32_t l = 0; l < 2; ++l) ASSERT_TRUE(testing::PushTokens(*h_, "src", l, l ? kv1 : kv, 0, 300).ok());
  auto fork = [&](const std::string& id, uint64_t tokens) {
    v1::ForkRequest req;
    req.set_source_sequence_id("src");
    req.set_sequence_id(id);
    req.set_tokens(tokens);
    v1::ForkResponse resp;
    return h_->Fork(req, &resp);
  };
  ASSERT_TRUE(fork("f", 128).ok());
  for (uint32_t l = 0; l < 2; ++l) {
    ASSERT_TRUE(testing::PushTokens(*h_, "f", l, l ? other1 : other, 128, 272).ok());
  }
  ASSERT_TRUE(fork("g", 256).ok());
  // What each sequence answers: lengths, both layers' tokens, an Attend.
  auto answers = [&](const std::string& id) {
    v1::LengthRequest lr;
    lr.set_sequence_id(id);
    v1::LengthResponse len;
    std::string all = h_->Length(lr, &len).ToString() + len.ShortDebugString();
    for (uint32_t l = 0; l < 2; ++l) {
      all += testing::ReadLayerBytes(*h_, id, l);
      v1::AttendRequest req;
      *req.add_items() = QueryItem(id, l, SyntheticQuery(2, kD, 3 + l), 2);
      v1::AttendResponse resp;
      all += h_->Attend(req, &resp).ToString() + resp.SerializeAsString();
    }
    return all;
  };
  const std::vector<std::string> ids = {"src", "f", "g"};
  std::vector<std::string> before;
  for (const std::string& id : ids) before.push_back(answers(id));
  const uint64_t pages_before = Stats().pages_in_use();
  Handler::SnapshotSummary loaded;
  ASSERT_NO_FATAL_FAILURE(Restart("forks", SmallOptions(), &loaded));
  EXPECT_EQ(loaded.sequences, 3u);
  EXPECT_EQ(loaded.pages, (8 + 11 + 8) * 2u);  // each sequence's pages, shared ones per holder
  EXPECT_EQ(loaded.pages - loaded.shared_pages, pages_before);
  EXPECT_EQ(Stats().pages_in_use(), pages_before);  // shared once, as before the restart
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(answers(ids[i]), before[i]) << ids[i];
  // The shared prefix's digests came along: other data for it is refused.
  absl::Status st = Append(ChunkOf("g", 0, 64, 20, other));
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tokens [64, ")) << st;
  v1::AppendResponse r;
  ASSERT_TRUE(h_->Append(ChunkOf("g", 0, 0, 256, kv), &r).ok());
  EXPECT_EQ(r.tokens_duplicate(), 256u);
  EXPECT_EQ(answers("g"), before[2]);
  // The restored references count: the source's release keeps what the
  // forks share; the last release frees every page.
  for (size_t i = 0; i < ids.size(); ++i) {
    v1::ReleaseRequest rel;
    rel.set_sequence_id(ids[i]);
    v1::ReleaseResponse rr;
    ASSERT_TRUE(h_->Release(rel, &rr).ok());
    for (size_t j = i + 1; j < ids.size(); ++j) EXPECT_EQ(answers(ids[j]), before[j]) << ids[j];
  }
  EXPECT_EQ(Stats().pages_in_use(), 0u);
}

TEST_F(IntegrityTest, RepeatedDecodeStepWithOtherDataIsRejected) {
  const testing::Kv kv = SyntheticKv(60, kN, 4);
  ASSERT_TRUE(Push("d", kv, 60).ok());
  const std::vector<float> q = SyntheticQuery(2, kD, 5);
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  *it = QueryItem("d", 0, q, 2);
  std::vector<float> k(kv.keys.begin() + 59 * kN, kv.keys.begin() + 60 * kN);
  std::vector<float> v(kv.values.begin() + 59 * kN, kv.values.begin() + 60 * kN);
  FloatToTensor(k.data(), kN, v1::DTYPE_F32, it->mutable_new_key());
  FloatToTensor(v.data(), kN, v1::DTYPE_F32, it->mutable_new_value());
  it->set_new_token_index(59);
  v1::AttendResponse resp;
  ASSERT_TRUE(h_->Attend(req, &resp).ok());  // the same token: acknowledged
  EXPECT_EQ(resp.results(0).tokens(), 60u);
  k[0] += 1.0f;
  it->clear_new_key();
  FloatToTensor(k.data(), kN, v1::DTYPE_F32, it->mutable_new_key());
  const std::string before = State();
  absl::Status st = h_->Attend(req, &resp);
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[0].new_key/new_value of tokens [59, 60)")) << st;
  EXPECT_EQ(State(), before);
}

// Two items of one Attend stepping the same token: the second repeats a
// token the first adds, so it is compared with the first's data, exactly as
// if the two had been sent as two calls; a conflict refuses the whole call.
TEST_F(IntegrityTest, ConflictingDecodeStepsInOneBatchAreRejected) {
  const testing::Kv kv = SyntheticKv(61, kN, 7);
  ASSERT_TRUE(Push("b", kv, 60).ok());
  const std::vector<float> q = SyntheticQuery(2, kD, 8);
  std::vector<float> k(kv.keys.begin() + 60 * kN, kv.keys.begin() + 61 * kN);
  std::vector<float> v(kv.values.begin() + 60 * kN, kv.values.begin() + 61 * kN);
  auto step = [&](const std::vector<float>& key) {
    v1::AttendItem it = QueryItem("b", 0, q, 2);
    FloatToTensor(key.data(), kN, v1::DTYPE_F32, it.mutable_new_key());
    FloatToTensor(v.data(), kN, v1::DTYPE_F32, it.mutable_new_value());
    it.set_new_token_index(60);
    return it;
  };
  std::vector<float> other = k;
  other[3] += 1.0f;
  v1::AttendRequest req;
  *req.add_items() = step(k);
  *req.add_items() = step(other);
  const std::string stored = ReadAll("b"), before = State();
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(req, &resp);
  EXPECT_EQ(st.code(), C::kAlreadyExists) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[1].new_key/new_value of tokens [60, 61)")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[0]")) << st;
  EXPECT_EQ(State(), before);
  EXPECT_EQ(ReadAll("b"), stored);
  EXPECT_EQ(metrics_.integrity_rejections[kRejectRepeat]->Value(), 1);
  // Identical repeats in one batch: one token stored, both answered.
  req.clear_items();
  *req.add_items() = step(k);
  *req.add_items() = step(k);
  ASSERT_TRUE(h_->Attend(req, &resp).ok());
  ASSERT_EQ(resp.results_size(), 2);
  EXPECT_EQ(resp.results(0).tokens(), 61u);
  EXPECT_EQ(resp.results(1).tokens(), 61u);
  // And the token stored is the first item's: a later call with the
  // other data is refused.
  req.clear_items();
  *req.add_items() = step(other);
  EXPECT_EQ(h_->Attend(req, &resp).code(), C::kAlreadyExists);
}

TEST_F(IntegrityTest, ReleasedIdIsTombstonedUntilNewIncarnationOrTime) {
  ServiceOptions o = SmallOptions();
  o.tombstone_seconds = 600;
  Make(o);
  v1::InfoResponse info;
  h_->Info(&info);
  EXPECT_EQ(info.tombstone_seconds(), 600.0);
  const testing::Kv kv = SyntheticKv(80, kN, 6);
  ASSERT_TRUE(Push("r", kv, 80).ok());
  v1::ReleaseRequest rel;
  rel.set_sequence_id("r");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  EXPECT_EQ(rr.tombstone_seconds(), 600.0);
  EXPECT_EQ(Stats().tombstones(), 1u);
  now_ += absl::Seconds(100);
  const std::string before = State();
  absl::Status st = Push("r", kv, 80);  // a late retry of the first chunk
  EXPECT_EQ(st.code(), C::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "sequence_id \"r\" was released")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "500.0 s more")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "new_incarnation")) << st;
  EXPECT_EQ(State(), before);
  EXPECT_EQ(metrics_.integrity_rejections[kRejectTombstone]->Value(), 1);
  // A new incarnation is accepted, and its later chunks need no flag.
  v1::AppendChunk first = ChunkOf("r", 0, 0, 30, kv);
  first.set_new_incarnation(true);
  ASSERT_TRUE(Append(first).ok());
  ASSERT_TRUE(Append(ChunkOf("r", 0, 30, 50, kv)).ok());
  EXPECT_EQ(Stats().tombstones(), 0u);
  // Released again; after the tombstone's time any Append may reuse the id.
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  now_ += absl::Seconds(599);
  EXPECT_EQ(Push("r", kv, 10).code(), C::kFailedPrecondition);
  now_ += absl::Seconds(2);
  EXPECT_TRUE(Push("r", kv, 10).ok());
  // Another id, and another tenant's same id, are not affected.
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  EXPECT_TRUE(Push("other", kv, 10).ok());
  EXPECT_TRUE(Push("r", kv, 10, "tenant-b").ok());
}

// Appends racing a Release never bring the id back: Release tombstones
// the key before it leaves the table, and creation checks the tombstone
// under the same lock.
TEST_F(IntegrityTest, AppendsRacingReleaseNeverResurrectTheId) {
  const testing::Kv kv = SyntheticKv(40, kN, 12);
  for (int round = 0; round < 20; ++round) {
    const std::string id = absl::StrCat("race", round);
    ASSERT_TRUE(Push(id, kv, 40).ok());
    std::atomic<bool> stop{false};
    std::atomic<int> unexpected{0};
    std::vector<std::thread> appenders;
    for (int t = 0; t < 3; ++t) {
      appenders.emplace_back([&] {
        while (!stop) {
          const absl::Status st = Append(ChunkOf(id, 0, 0, 40, kv));
          if (!st.ok() && st.code() != C::kFailedPrecondition) ++unexpected;
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(2));
    v1::ReleaseRequest rel;
    rel.set_sequence_id(id);
    v1::ReleaseResponse rr;
    ASSERT_TRUE(h_->Release(rel, &rr).ok());
    absl::SleepFor(absl::Milliseconds(2));
    stop = true;
    for (std::thread& th : appenders) th.join();
    EXPECT_EQ(unexpected.load(), 0);
    v1::LengthRequest lr;
    lr.set_sequence_id(id);
    v1::LengthResponse len;
    EXPECT_EQ(h_->Length(lr, &len).code(), C::kNotFound) << "round " << round << ": " << id << " came back";
  }
  EXPECT_EQ(Stats().pages_in_use(), 0u);
  EXPECT_EQ(Stats().sequences(), 0u);
}

TEST_F(IntegrityTest, ZeroTombstoneSecondsReusesIdsAtOnce) {
  ServiceOptions o = SmallOptions();
  o.tombstone_seconds = 0;
  Make(o);
  const testing::Kv kv = SyntheticKv(10, kN, 7);
  ASSERT_TRUE(Push("z", kv, 10).ok());
  v1::ReleaseRequest rel;
  rel.set_sequence_id("z");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  EXPECT_EQ(rr.tombstone_seconds(), 0.0);
  EXPECT_TRUE(Push("z", kv, 10).ok());
}

TEST_F(IntegrityTest, TenantsSeeOnlyTheirOwnSequences) {
  const testing::Kv a = SyntheticKv(100, kN, 8), b = SyntheticKv(30, kN, 9);
  ASSERT_TRUE(Push("chat", a, 100, "alice").ok());
  const std::string alices = ReadAll("chat", "alice");
  // Bob cannot read, attend, measure or release Alice's sequence.
  EXPECT_TRUE(absl::StartsWith(ReadAll("chat", "bob"), "error: NOT_FOUND")) << ReadAll("chat", "bob");
  v1::LengthRequest lr;
  lr.set_sequence_id("chat");
  v1::LengthResponse len;
  EXPECT_EQ(h_->Length(lr, &len, "bob").code(), C::kNotFound);
  EXPECT_EQ(h_->Length(lr, &len, "").code(), C::kNotFound);
  v1::AttendRequest req;
  *req.add_items() = QueryItem("chat", 0, SyntheticQuery(2, kD, 10), 2);
  v1::AttendResponse resp;
  absl::Status st = h_->Attend(req, &resp, "bob");
  EXPECT_EQ(st.code(), C::kNotFound) << st;
  v1::ReleaseRequest rel;
  rel.set_sequence_id("chat");
  v1::ReleaseResponse rr;
  EXPECT_EQ(h_->Release(rel, &rr, "bob").code(), C::kNotFound);
  // Bob's Append to the same name makes his own sequence.
  v1::AppendChunk c = ChunkOf("chat", 0, 0, 30, b);
  ASSERT_TRUE(Append(c, "bob").ok());
  EXPECT_EQ(ReadAll("chat", "alice"), alices);
  ASSERT_TRUE(h_->Length(lr, &len, "bob").ok());
  EXPECT_EQ(len.layers(0).tokens(), 30u);
  ASSERT_TRUE(h_->Length(lr, &len, "alice").ok());
  EXPECT_EQ(len.layers(0).tokens(), 100u);
  ASSERT_TRUE(h_->Attend(req, &resp, "alice").ok());
  EXPECT_EQ(resp.results(0).tokens(), 100u);
  // Releases are per tenant too.
  ASSERT_TRUE(h_->Release(rel, &rr, "bob").ok());
  EXPECT_EQ(rr.tokens_freed(), 30u);
  EXPECT_EQ(ReadAll("chat", "alice"), alices);
  EXPECT_EQ(Stats("alice").tenant_sequences(), 1u);
  EXPECT_EQ(Stats("bob").tenant_sequences(), 0u);
  EXPECT_EQ(Stats("alice").tenant(), "alice");
}

// A NUL would let an id of a server without tokens take the form of a
// tenant's key ("\0alice\0planted" is alice's "planted" once tokens are
// on); control bytes have no place in a logged identifier.
TEST_F(IntegrityTest, SequenceIdsWithNulOrControlBytesAreRefused) {
  const testing::Kv kv = SyntheticKv(10, kN, 11);
  const std::string planted("\0alice\0planted", 14);
  absl::Status st = Append(ChunkOf(planted, 0, 0, 10, kv));
  EXPECT_EQ(st.code(), C::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "sequence_id has byte 0x00 at offset 0")) << st;
  st = Append(ChunkOf("tab\there", 0, 0, 10, kv));
  EXPECT_TRUE(absl::StrContains(st.message(), "sequence_id has byte 0x09 at offset 3")) << st;
  st = Append(ChunkOf("del\x7f", 0, 0, 10, kv));
  EXPECT_TRUE(absl::StrContains(st.message(), "sequence_id has byte 0x7f at offset 3")) << st;
  EXPECT_EQ(Stats().sequences(), 0u);
  v1::AttendRequest req;
  *req.add_items() = QueryItem("fine", 0, SyntheticQuery(2, kD, 12), 2);
  *req.add_items() = QueryItem(std::string("x\0", 2), 0, SyntheticQuery(2, kD, 12), 2);
  v1::AttendResponse resp;
  st = h_->Attend(req, &resp);
  EXPECT_EQ(st.code(), C::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "items[1].sequence_id has byte 0x00 at offset 1")) << st;
  v1::LengthRequest lr;
  lr.set_sequence_id(planted);
  v1::LengthResponse len;
  EXPECT_EQ(h_->Length(lr, &len).code(), C::kInvalidArgument);
  // Printable ASCII and UTF-8 are ids as before.
  EXPECT_TRUE(Append(ChunkOf("chat-1/\xc3\xbc ok", 0, 0, 10, kv)).ok());
}

// The table keys of a snapshot carry tenants only when tokens were on: a
// snapshot of the other mode would move ids between tenants.
TEST_F(IntegrityTest, SnapshotOfTheOtherTenancyModeIsRefused) {
  const testing::Kv kv = SyntheticKv(40, kN, 13);
  ServiceOptions with_tokens = SmallOptions();
  absl::StatusOr<TokenTable> t = TokenTable::Parse(Sha256Hex("token-of-alice-0123456789") + " alice\n", "t");
  ASSERT_TRUE(t.ok()) << t.status();
  with_tokens.tokens = std::make_shared<const TokenTable>(*std::move(t));
  for (bool tokens_first : {false, true}) {
    SCOPED_TRACE(tokens_first);
    Make(tokens_first ? with_tokens : SmallOptions());
    ASSERT_TRUE(Push("plain", kv, 40, tokens_first ? "alice" : "").ok());
    const std::string dir = absl::StrCat(::testing::TempDir(), "/tenancy_", tokens_first);
    std::filesystem::create_directories(dir);
    Handler::SnapshotSummary written, loaded;
    ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
    Make(tokens_first ? SmallOptions() : with_tokens);
    absl::Status st = h_->LoadSnapshot(dir, &loaded);
    EXPECT_EQ(st.code(), C::kFailedPrecondition) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), tokens_first ? "tenancy: snapshot tokens, this server none"
                                                             : "tenancy: snapshot none, this server tokens"))
        << st;
    EXPECT_EQ(Stats().sequences(), 0u);
    // The same mode loads it.
    Make(tokens_first ? with_tokens : SmallOptions());
    ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
    EXPECT_EQ(loaded.sequences, 1u);
  }
}

// Info.restored_sequences tells a tenant how many of its own sequences
// came back, not how many every tenant had.
TEST_F(IntegrityTest, RestoredSequencesAreCountedPerTenant) {
  const testing::Kv kv = SyntheticKv(40, kN, 14);
  ServiceOptions o = SmallOptions();
  absl::StatusOr<TokenTable> t = TokenTable::Parse(
      Sha256Hex("token-of-alice-0123456789") + " alice\n" + Sha256Hex("token-of-bob-0123456789") + " bob\n", "t");
  ASSERT_TRUE(t.ok()) << t.status();
  o.tokens = std::make_shared<const TokenTable>(*std::move(t));
  Make(o);
  for (const char* id : {"a1", "a2", "a3"}) ASSERT_TRUE(Push(id, kv, 40, "alice").ok());
  ASSERT_TRUE(Push("b1", kv, 40, "bob").ok());
  Handler::SnapshotSummary loaded;
  ASSERT_NO_FATAL_FAILURE(Restart("restored_per_tenant", o, &loaded));
  EXPECT_EQ(loaded.sequences, 4u);
  v1::InfoResponse info;
  h_->Info(&info, "alice");
  EXPECT_EQ(info.restored_sequences(), 3u);
  h_->Info(&info, "bob");
  EXPECT_EQ(info.restored_sequences(), 1u);
  h_->Info(&info, "carol");
  EXPECT_EQ(info.restored_sequences(), 0u);
}

// A version 1 snapshot does not say whether tokens were on: a key with a
// NUL or control byte may be an id planted on a server without tokens, so
// it is not restored (logged); the others load as before.
TEST_F(IntegrityTest, VersionOneSnapshotsLoadWithoutKeysHoldingControlBytes) {
  ServiceOptions o = SmallOptions();
  absl::StatusOr<TokenTable> t = TokenTable::Parse(Sha256Hex("token-of-alice-0123456789") + " alice\n", "t");
  ASSERT_TRUE(t.ok()) << t.status();
  o.tokens = std::make_shared<const TokenTable>(*std::move(t));
  Make(o);
  std::string identity = h_->SnapshotIdentity();
  const size_t at = identity.find("tenancy=tokens\n");
  ASSERT_NE(at, std::string::npos) << identity;
  identity.erase(at, std::string("tenancy=tokens\n").size());
  const std::string dir = ::testing::TempDir() + "/version1";
  std::filesystem::create_directories(dir);
  {
    absl::StatusOr<std::unique_ptr<SnapshotWriter>> w =
        SnapshotWriter::Open(dir, identity, h_->pool().page_stride(), 1);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const std::string& key : {std::string("\0alice\0planted", 14), std::string("plain")}) {
      ASSERT_TRUE((*w)->BeginSequence(key, static_cast<uint32_t>(options_.layers)).ok());
      for (int l = 0; l < options_.layers; ++l) ASSERT_TRUE((*w)->BeginLayer(0, 0, 0, {}, {}).ok());
    }
    ASSERT_TRUE((*w)->Commit().ok());
  }
  Handler::SnapshotSummary loaded;
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(loaded.sequences, 1u);
  EXPECT_EQ(loaded.dropped_sequences, 1u);
  // The log names the key escaped, never with its raw bytes.
  EXPECT_TRUE(absl::StrContains(log, "sequence_id \"\\x00alice\\x00planted\" not restored")) << log;
  EXPECT_EQ(log.find('\0'), std::string::npos);
  v1::LengthRequest lr;
  lr.set_sequence_id("planted");
  v1::LengthResponse len;
  EXPECT_EQ(h_->Length(lr, &len, "alice").code(), C::kNotFound);
}

// After a kill -9 there is no snapshot, perhaps the temporary file of a
// write that never completed: the start says so, and names that file.
TEST_F(IntegrityTest, RestoreReportSaysWhatWasFound) {
  const std::string dir = ::testing::TempDir() + "/restore_report";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Handler::SnapshotSummary none;
  EXPECT_TRUE(absl::IsNotFound(h_->LoadSnapshot(dir, &none)));
  EXPECT_EQ(Handler::RestoreReport(dir, none), absl::StrCat("no snapshot in ", dir, "; nothing restored"));
  const std::string tmp = dir + "/snapshot.dkvs.tmp";
  std::ofstream(tmp) << "half a snapshot";
  Handler::SnapshotSummary leftover;
  EXPECT_TRUE(absl::IsNotFound(h_->LoadSnapshot(dir, &leftover)));
  EXPECT_FALSE(std::filesystem::exists(tmp));
  EXPECT_EQ(Handler::RestoreReport(dir, leftover),
            absl::StrCat("no snapshot in ", dir, "; nothing restored; removed ", tmp,
                         " (an interrupted snapshot write, never complete)"));
  // A snapshot, loaded: the count and the file; at the next start the file
  // loaded then is named, not loaded again.
  ASSERT_TRUE(Push("s", SyntheticKv(30, kN, 14), 30).ok());
  Handler::SnapshotSummary written, loaded, again;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  Make();
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  EXPECT_TRUE(absl::StartsWith(Handler::RestoreReport(dir, loaded),
                               absl::StrCat("restored 1 sequences (0 pages) from ", dir, "/snapshot.dkvs; ")))
      << Handler::RestoreReport(dir, loaded);
  Make();
  EXPECT_TRUE(absl::IsNotFound(h_->LoadSnapshot(dir, &again)));
  EXPECT_TRUE(absl::StrContains(Handler::RestoreReport(dir, again), "snapshot.dkvs.loaded was loaded at an earlier"))
      << Handler::RestoreReport(dir, again);
}

TEST_F(IntegrityTest, TenantQuotasAreResourceExhaustedNamingTheQuota) {
  ServiceOptions o = SmallOptions();
  o.tenant_defaults.max_sequences = 2;
  o.tenant_defaults.max_pages = 5;
  Make(o);
  const testing::Kv kv = SyntheticKv(200, kN, 11);
  ASSERT_TRUE(Push("1", kv, 10, "t").ok());
  ASSERT_TRUE(Push("2", kv, 10, "t").ok());
  std::string before = State();
  absl::Status st = Push("3", kv, 10, "t");
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tenant \"t\" quota max_sequences 2")) << st;
  EXPECT_EQ(State(), before);
  EXPECT_TRUE(Push("3", kv, 10, "u").ok());  // another tenant has its own quota
  // Pages: 5 at most. 200 tokens need 5 pages (R = P = 32: 200 - 32 = 168 -> 5).
  v1::ReleaseRequest rel;
  rel.set_sequence_id("2");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(h_->Release(rel, &rr, "t").ok());
  ASSERT_TRUE(Push("1", kv, 160, "t").ok());  // 4 pages
  EXPECT_EQ(Stats("t").tenant_pages(), 4u);
  before = State();
  const std::string stored = ReadAll("1", "t");
  v1::AppendResponse r;
  st = h_->Append(ChunkOf("1", 0, 160, 40, kv), &r, "t");  // 200 tokens: 5 pages, fits
  ASSERT_TRUE(st.ok()) << st;
  before = State();
  // 64 more tokens need 2 more pages: over the quota.
  const testing::Kv more = SyntheticKv(264, kN, 11);
  st = h_->Append(ChunkOf("1", 0, 200, 64, more), &r, "t");
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "tenant \"t\" quota max_pages 5: it holds 5 pages")) << st;
  EXPECT_EQ(State(), before);
  EXPECT_EQ(Stats("t").tenant_pages(), 5u);
  EXPECT_EQ(Stats("t").tenant_max_pages(), 5u);
  // Releasing gives the pages back to the tenant.
  rel.set_sequence_id("1");
  ASSERT_TRUE(h_->Release(rel, &rr, "t").ok());
  EXPECT_EQ(Stats("t").tenant_pages(), 0u);
  EXPECT_EQ(Stats("t").tenant_sequences(), 0u);
}

TEST(TenantKeyTest, KeysOfTenantsNeverMeetAndDecode) {
  EXPECT_EQ(TenantKey("", "chat"), "chat");
  EXPECT_NE(TenantKey("a", "b"), TenantKey("", "ab"));
  EXPECT_NE(TenantKey("a", "b/c"), TenantKey("a/b", "c"));
  EXPECT_EQ(TenantOfKey(TenantKey("team-1", "x")), "team-1");
  EXPECT_EQ(TenantOfKey(TenantKey("", "x")), "");
  EXPECT_EQ(TenantOfKey(TenantKey("t", std::string("with\0nul", 8))), "t");
}

TEST_F(IntegrityTest, QuotasWithoutTokensNameTheOneTenant) {
  ServiceOptions o = SmallOptions();
  o.tenant_defaults.max_sequences = 1;
  Make(o);
  const testing::Kv kv = SyntheticKv(10, kN, 13);
  ASSERT_TRUE(Push("a", kv, 10).ok());
  absl::Status st = Push("b", kv, 10);
  EXPECT_EQ(st.code(), C::kResourceExhausted) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "the server's one tenant (no tokens_file): quota max_sequences 1")) << st;
}

TEST(TokenTableTest, ParsesHashesTenantsAndQuotas) {
  const std::string ha = Sha256Hex("token-of-alice-0123456789");
  const std::string hb = Sha256Hex("token-of-bob-0123456789");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  absl::StatusOr<TokenTable> t =
      TokenTable::Parse(absl::StrCat("# comment\n", ha, " alice max_pages=10\n\n", hb, " bob   # trailing\n"), "f");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->size(), 2u);
  EXPECT_EQ(t->TenantOf("token-of-alice-0123456789").value_or("?"), "alice");
  EXPECT_EQ(t->TenantOf("token-of-bob-0123456789").value_or("?"), "bob");
  EXPECT_FALSE(t->TenantOf("token-of-eve").has_value());
  EXPECT_FALSE(t->TenantOf("").has_value());
  EXPECT_FALSE(t->TenantOf(ha).has_value());  // the hash itself is no token
  TenantQuota d;
  d.max_pages = 3;
  d.max_sequences = 7;
  EXPECT_EQ(t->QuotaOf("alice", d).max_pages, 10u);
  EXPECT_EQ(t->QuotaOf("alice", d).max_sequences, 7u);
  EXPECT_EQ(t->QuotaOf("bob", d).max_pages, 3u);
  for (const std::string& bad :
       {std::string("plaintext-token alice\n"), absl::StrCat(ha, "\n"), absl::StrCat(ha, " a\n", ha, " b\n"),
        absl::StrCat(ha, " al/ice\n"), absl::StrCat(ha, " a max_pages=x\n"),
        absl::StrCat(ha, " a max_pages=1\n", hb, " a max_pages=2\n")}) {
    absl::StatusOr<TokenTable> r = TokenTable::Parse(bad, "f");
    EXPECT_EQ(r.status().code(), C::kInvalidArgument) << bad;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "tokens_file f line ")) << r.status();
  }
}

}  // namespace
}  // namespace driftkv
