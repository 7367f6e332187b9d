// Shared pages across a snapshot (service/snapshot_pages.h, format version
// 4 of service/snapshot_file.h): the file's shared page entries, and a
// restore that holds a tenant's repeated pages once, never across tenants,
// never from a page that failed its checksum, and still when the first
// sequence that held a page is not restored.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/snapshot_file.h"
#include "service/tokens.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace {

using testing::SmallOptions;
using testing::SyntheticKv;
using testing::SyntheticQuery;
using C = absl::StatusCode;

constexpr int kN = 128, kD = 64;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A version 4 file of one sequence, one layer, pages: full 0, full 1,
// repeat of 0, repeat of 1.
std::string FileWithRepeats(const std::string& dir, size_t page_bytes) {
  absl::StatusOr<std::unique_ptr<SnapshotWriter>> w = SnapshotWriter::Open(dir, "id=test\n", page_bytes);
  EXPECT_TRUE(w.ok()) << w.status();
  std::vector<uint8_t> a(page_bytes, 0x11), b(page_bytes, 0x22);
  EXPECT_TRUE((*w)->BeginSequence("s", 1).ok());
  EXPECT_TRUE((*w)->BeginLayer(4 * 32, 0, 4, {}, {}).ok());
  EXPECT_EQ((*w)->full_pages(), 0u);
  EXPECT_TRUE((*w)->Page(a.data(), Crc32c(a.data(), a.size())).ok());
  EXPECT_TRUE((*w)->Page(b.data(), Crc32c(b.data(), b.size())).ok());
  EXPECT_EQ((*w)->SharedPage(2).code(), C::kInvalidArgument);  // no such full page
  EXPECT_TRUE((*w)->SharedPage(0).ok());
  EXPECT_TRUE((*w)->SharedPage(1).ok());
  EXPECT_TRUE((*w)->Digests(std::vector<uint64_t>(4 * 32, 0)).ok());
  EXPECT_TRUE((*w)->Commit().ok());
  return SnapshotPath(dir);
}

TEST(SnapshotFileTest, SharedPageEntriesReadBackAndCorruptOnesAreDataLoss) {
  constexpr size_t kPage = 96;
  const std::string path = FileWithRepeats(Dir("shared_entries"), kPage);
  {
    absl::StatusOr<std::unique_ptr<SnapshotReader>> r = SnapshotReader::Open(path);
    ASSERT_TRUE(r.ok()) << r.status();
    bool more = false;
    std::string id;
    uint32_t layers = 0;
    ASSERT_TRUE((*r)->NextSequence(&more, &id, &layers).ok());
    SnapshotReader::LayerHeader h;
    std::vector<uint16_t> k, v;
    bool intact = false;
    ASSERT_TRUE((*r)->NextLayer(kN, 64, &h, &k, &v, &intact).ok());
    ASSERT_EQ(h.pages, 4u);
    std::vector<uint8_t> page(kPage);
    PageChecksum stored = 0;
    bool shared = true;
    uint64_t ordinal = 9;
    // A page read before its kind is a caller's error.
    EXPECT_EQ((*r)->Page(kPage, page.data(), &stored, &intact).code(), C::kFailedPrecondition);
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE((*r)->NextPageKind(&shared, &ordinal).ok());
      EXPECT_FALSE(shared);
      ASSERT_TRUE((*r)->Page(kPage, page.data(), &stored, &intact).ok());
      EXPECT_TRUE(intact);
      EXPECT_EQ(page[0], i == 0 ? 0x11 : 0x22);
    }
    for (uint64_t want : {0u, 1u}) {
      ASSERT_TRUE((*r)->NextPageKind(&shared, &ordinal).ok());
      EXPECT_TRUE(shared);
      EXPECT_EQ(ordinal, want);
    }
    std::vector<uint64_t> digests;
    ASSERT_TRUE((*r)->Digests(4 * 32, &digests, &intact).ok());
    ASSERT_TRUE((*r)->NextSequence(&more, &id, &layers).ok());  // the trailer counts 4 pages
    EXPECT_FALSE(more);
  }
  // The first repeat's entry: 'PRF1' | u64 ordinal | CRC, after the two
  // full pages (tag, checksum, bytes each).
  const std::string bytes = FileBytes(path);
  const size_t first_ref = bytes.find("PRF1");
  ASSERT_NE(first_ref, std::string::npos);
  auto read_repeat = [&](const std::string& file_bytes) {
    WriteBytes(path, file_bytes);
    absl::StatusOr<std::unique_ptr<SnapshotReader>> r = SnapshotReader::Open(path);
    EXPECT_TRUE(r.ok()) << r.status();
    bool more = false, intact = false, shared = false;
    std::string id;
    uint32_t layers = 0;
    uint64_t ordinal = 0;
    EXPECT_TRUE((*r)->NextSequence(&more, &id, &layers).ok());
    SnapshotReader::LayerHeader h;
    std::vector<uint16_t> k, v;
    EXPECT_TRUE((*r)->NextLayer(kN, 64, &h, &k, &v, &intact).ok());
    std::vector<uint8_t> page(kPage);
    PageChecksum stored = 0;
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE((*r)->NextPageKind(&shared, &ordinal).ok());
      EXPECT_TRUE((*r)->Page(kPage, page.data(), &stored, &intact).ok());
    }
    return (*r)->NextPageKind(&shared, &ordinal);
  };
  std::string flipped = bytes;
  flipped[first_ref + 4] ^= 0x01;  // the ordinal: the entry's CRC fails
  absl::Status st = read_repeat(flipped);
  EXPECT_EQ(st.code(), C::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "shared page entry checksum mismatch")) << st;
  // An ordinal past the full pages read, with a CRC that vouches for it.
  std::string ahead = bytes;
  const uint64_t far = 7;
  std::memcpy(&ahead[first_ref + 4], &far, 8);
  const uint32_t crc = Crc32c(reinterpret_cast<const uint8_t*>(&ahead[first_ref]), 12);
  std::memcpy(&ahead[first_ref + 12], &crc, 4);
  st = read_repeat(ahead);
  EXPECT_EQ(st.code(), C::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "repeats page 7 of 2 full pages")) << st;
  std::string tag = bytes;
  tag[first_ref] = 'X';
  st = read_repeat(tag);
  EXPECT_EQ(st.code(), C::kDataLoss) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "bad page tag")) << st;
}

TEST(SnapshotFileTest, VersionThreeHasNoSharedEntries) {
  const std::string dir = Dir("v3_no_shared");
  absl::StatusOr<std::unique_ptr<SnapshotWriter>> w = SnapshotWriter::Open(dir, "id=test\n", 96, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<uint8_t> a(96, 0x11);
  ASSERT_TRUE((*w)->BeginSequence("s", 1).ok());
  ASSERT_TRUE((*w)->BeginLayer(32, 0, 1, {}, {}).ok());
  ASSERT_TRUE((*w)->Page(a.data(), Crc32c(a.data(), a.size())).ok());
  EXPECT_EQ((*w)->SharedPage(0).code(), C::kFailedPrecondition);
  ASSERT_TRUE((*w)->Digests(std::vector<uint64_t>(32, 0)).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  absl::StatusOr<std::unique_ptr<SnapshotReader>> r = SnapshotReader::Open(SnapshotPath(dir));
  ASSERT_TRUE(r.ok()) << r.status();
  bool more = false, intact = false, shared = true;
  std::string id;
  uint32_t layers = 0;
  uint64_t ordinal = 0;
  ASSERT_TRUE((*r)->NextSequence(&more, &id, &layers).ok());
  SnapshotReader::LayerHeader h;
  std::vector<uint16_t> k, v;
  ASSERT_TRUE((*r)->NextLayer(kN, 64, &h, &k, &v, &intact).ok());
  ASSERT_TRUE((*r)->NextPageKind(&shared, &ordinal).ok());  // reads nothing
  EXPECT_FALSE(shared);
  std::vector<uint8_t> page(96);
  PageChecksum stored = 0;
  ASSERT_TRUE((*r)->Page(96, page.data(), &stored, &intact).ok());
  EXPECT_TRUE(intact);
  EXPECT_EQ(page[95], 0x11);
}

class SharingTest : public testing::HandlerFixture {
 protected:
  void SetUp() override { Make(); }

  // Other data in each layer: a page repeats only where a fork shares it.
  absl::Status PushBoth(const std::string& seq, const testing::Kv kv[2], int first, int count,
                        const std::string& tenant = "") {
    for (uint32_t l = 0; l < 2; ++l) {
      for (int t = first; t < first + count; t += 50) {
        v1::AppendResponse r;
        absl::Status st = h_->Append(testing::ChunkOf(seq, l, t, std::min(50, first + count - t), kv[l]), &r, tenant);
        if (!st.ok()) return st;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Fork(const std::string& from, const std::string& to, uint64_t tokens) {
    v1::ForkRequest req;
    req.set_source_sequence_id(from);
    req.set_sequence_id(to);
    req.set_tokens(tokens);
    v1::ForkResponse resp;
    return h_->Fork(req, &resp);
  }
  // Both layers read back and attended.
  std::string Answers(const std::string& id, const std::string& tenant = "") {
    std::string all;
    for (uint32_t l = 0; l < 2; ++l) {
      v1::ReadRequest rr;
      rr.set_sequence_id(id);
      rr.set_layer(l);
      all += h_->Read(
                   rr,
                   [&](const v1::ReadChunk& c) {
                     absl::StrAppend(&all, c.keys(), c.values());
                     return true;
                   },
                   tenant)
                 .ToString();
      v1::AttendRequest req;
      *req.add_items() = testing::QueryItem(id, l, SyntheticQuery(2, kD, 3 + l), 2);
      v1::AttendResponse resp;
      all += h_->Attend(req, &resp, tenant).ToString() + resp.SerializeAsString();
    }
    return all;
  }
  // "a-src" (300 tokens: 8 pages a layer) and "b-fork" of its first 128
  // (4 pages a layer, all shared); the file holds a-src first.
  void SourceAndFork() {
    const testing::Kv kv[2] = {SyntheticKv(300, kN, 51), SyntheticKv(300, kN, 52)};
    ASSERT_TRUE(PushBoth("a-src", kv, 0, 300).ok());
    ASSERT_TRUE(Fork("a-src", "b-fork", 128).ok());
  }
};

ServiceOptions WithTenants() {
  ServiceOptions o = SmallOptions();
  absl::StatusOr<TokenTable> t = TokenTable::Parse(
      Sha256Hex("token-of-alice-0123456789") + " alice\n" + Sha256Hex("token-of-bob-0123456789") + " bob\n", "t");
  EXPECT_TRUE(t.ok()) << t.status();
  o.tokens = std::make_shared<const TokenTable>(*std::move(t));
  return o;
}

// Equal bytes in two tenants' sequences stay two copies: tenants never
// share pages, in the file or after it.
TEST_F(SharingTest, TenantsNeverShare) {
  Make(WithTenants());
  const testing::Kv kv[2] = {SyntheticKv(300, kN, 41), SyntheticKv(300, kN, 42)};
  ASSERT_TRUE(PushBoth("a", kv, 0, 300, "alice").ok());
  ASSERT_TRUE(PushBoth("b", kv, 0, 300, "bob").ok());
  const uint64_t pages = Stats().pages_in_use();
  const std::string a = Answers("a", "alice"), b = Answers("b", "bob");
  const std::string dir = Dir("tenants_never_share");
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.shared_pages, 0u);
  EXPECT_EQ(written.pages, pages);
  Make(WithTenants());
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.sequences, 2u);
  EXPECT_EQ(Stats().pages_in_use(), pages);
  EXPECT_EQ(Answers("a", "alice"), a);
  EXPECT_EQ(Answers("b", "bob"), b);
}

// The first sequence that held a page is not restored (here: over its
// tenant's page quota); a later one that repeats the page still is, and
// the pages nothing kept go back to the pool.
TEST_F(SharingTest, ARepeatOutlivesItsFirstHolder) {
  ASSERT_NO_FATAL_FAILURE(SourceAndFork());
  const std::string fork = Answers("b-fork");
  const std::string dir = Dir("repeat_outlives");
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.pages, 2 * (8 + 4u));
  EXPECT_EQ(written.shared_pages, 2 * 4u);
  ServiceOptions o = SmallOptions();
  o.tenant_defaults.max_pages = 10;  // a-src holds 16, b-fork 8
  Make(o);
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(loaded.sequences, 1u);
  EXPECT_EQ(loaded.dropped_sequences, 1u);
  EXPECT_TRUE(absl::StrContains(log, "\"a-src\" not restored")) << log;
  EXPECT_EQ(Stats().pages_in_use(), 8u);
  EXPECT_EQ(Answers("b-fork"), fork);
  v1::ReleaseRequest rel;
  rel.set_sequence_id("b-fork");
  v1::ReleaseResponse rr;
  ASSERT_TRUE(h_->Release(rel, &rr).ok());
  EXPECT_EQ(Stats().pages_in_use(), 0u);
}

// A full page that fails its checksum is never served: not by its own
// sequence, nor by one that repeats it.
TEST_F(SharingTest, ACorruptPageDropsItsRepeatsToo) {
  ASSERT_NO_FATAL_FAILURE(SourceAndFork());
  const std::string dir = Dir("corrupt_repeated");
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  std::string bytes = FileBytes(SnapshotPath(dir));
  const size_t first_page = bytes.find("PGE1");  // a-src's layer 0, page 0
  ASSERT_NE(first_page, std::string::npos);
  bytes[first_page + 8 + 100] ^= 0x10;  // past the tag and the checksum
  WriteBytes(SnapshotPath(dir), bytes);
  Make();
  ::testing::internal::CaptureStderr();
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(loaded.sequences, 0u);
  EXPECT_EQ(loaded.dropped_sequences, 2u);
  EXPECT_EQ(loaded.corrupt_pages, 1u);
  EXPECT_TRUE(absl::StrContains(log, "page 0 (tokens [0, 32)) of layer 0 fails its checksum")) << log;
  EXPECT_TRUE(absl::StrContains(log, "page 0 (tokens [0, 32)) of layer 0 repeats a page that was not restored")) << log;
  EXPECT_EQ(Stats().pages_in_use(), 0u);
}

// Two devices: a restored sequence goes to the least loaded one, so a
// repeat may name a page of the other device's partition; it gets a copy
// of its own there (a page is attended by the device that holds it).
TEST_F(SharingTest, RepeatsAcrossDevicesAreCopies) {
  ServiceOptions o = SmallOptions();
  o.devices = {0, 1};
  Make(o);
  ASSERT_NO_FATAL_FAILURE(SourceAndFork());
  const std::string src = Answers("a-src"), fork = Answers("b-fork");
  const std::string dir = Dir("repeat_devices");
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.shared_pages, 2 * 4u);
  Make(o);
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.sequences, 2u);
  const v1::StatsResponse stats = Stats();
  ASSERT_EQ(stats.devices_size(), 2);
  // a-src fills device 0 first; b-fork goes to the emptier device 1 and
  // copies its 8 pages there.
  EXPECT_EQ(stats.devices(0).pages_in_use(), 16u);
  EXPECT_EQ(stats.devices(1).pages_in_use(), 8u);
  EXPECT_EQ(Answers("a-src"), src);
  EXPECT_EQ(Answers("b-fork"), fork);
}

// The prefix index (pages only it holds, after their sequences were
// released) and the pins come back after a warm restart: Lookup finds the
// same prefixes, a fork from one reads back what a fork before the
// restart did, the pin keeps its pages and its lease, and the pool holds
// as many pages as before.
TEST_F(SharingTest, TheIndexAndThePinsSurviveAWarmRestart) {
  const testing::Kv sys[2] = {SyntheticKv(320, kN, 61), SyntheticKv(320, kN, 62)};
  const testing::Kv other[2] = {SyntheticKv(160, kN, 63), SyntheticKv(160, kN, 64)};
  std::vector<uint32_t> sys_ids(320), other_ids(160);
  for (int i = 0; i < 320; ++i) sys_ids[i] = 100 + i;
  for (int i = 0; i < 160; ++i) other_ids[i] = 9000 + 3 * i;
  auto push_with_ids = [&](const std::string& seq, const testing::Kv kv[2], const std::vector<uint32_t>& ids) {
    for (uint32_t l = 0; l < 2; ++l) {
      v1::AppendChunk c = testing::ChunkOf(seq, l, 0, static_cast<uint32_t>(ids.size()), kv[l]);
      c.mutable_token_ids()->Add(ids.begin(), ids.end());
      v1::AppendResponse r;
      ASSERT_TRUE(h_->Append(c, &r).ok());
    }
  };
  auto release = [&](const std::string& seq) {
    v1::ReleaseRequest rel;
    rel.set_sequence_id(seq);
    v1::ReleaseResponse rr;
    return h_->Release(rel, &rr);
  };
  auto lookup = [&](const std::vector<uint32_t>& ids) {
    v1::LookupRequest req;
    req.mutable_token_ids()->Add(ids.begin(), ids.end());
    v1::LookupResponse resp;
    EXPECT_TRUE(h_->Lookup(req, &resp).ok());
    return resp.ShortDebugString();
  };
  auto fork_prefix = [&](const std::string& seq, const std::vector<uint32_t>& ids) {
    v1::ForkRequest req;
    req.set_sequence_id(seq);
    req.mutable_prefix_token_ids()->Add(ids.begin(), ids.end());
    v1::ForkResponse resp;
    absl::Status st = h_->Fork(req, &resp);
    return st.ToString() + resp.ShortDebugString();
  };
  ASSERT_NO_FATAL_FAILURE(push_with_ids("sys", sys, sys_ids));
  ASSERT_NO_FATAL_FAILURE(push_with_ids("other", other, other_ids));
  v1::PinRequest pin;
  pin.set_pin_id("pin-other");
  pin.mutable_prefix_token_ids()->Add(other_ids.begin(), other_ids.end());
  pin.set_ttl_seconds(600);
  v1::PinResponse pinned;
  ASSERT_TRUE(h_->Pin(pin, &pinned).ok());
  ASSERT_TRUE(release("sys").ok());
  ASSERT_TRUE(release("other").ok());
  const std::string fork_before = fork_prefix("user", sys_ids);
  const std::string user = Answers("user");
  ASSERT_TRUE(release("user").ok());
  const uint64_t pages = Stats().pages_in_use();
  const int64_t entries = h_->prefix_index().entries();
  const std::string sys_found = lookup(sys_ids), other_found = lookup(other_ids);
  EXPECT_TRUE(absl::StrContains(sys_found, "pages: 9")) << sys_found;
  EXPECT_TRUE(absl::StrContains(other_found, "pages: 4")) << other_found;

  const std::string dir = Dir("index_and_pins");
  Handler::SnapshotSummary written, loaded;
  ASSERT_TRUE(h_->WriteSnapshot(dir, &written).ok());
  EXPECT_EQ(written.sequences, 0u);
  EXPECT_EQ(written.index_entries, static_cast<uint64_t>(entries));
  EXPECT_EQ(written.pins, 1u);
  now_ += absl::Seconds(100);  // time down: not counted against the lease
  Make();
  ASSERT_TRUE(h_->LoadSnapshot(dir, &loaded).ok());
  EXPECT_EQ(loaded.index_entries, static_cast<uint64_t>(entries));
  EXPECT_EQ(loaded.pins, 1u);
  EXPECT_EQ(h_->prefix_index().entries(), entries);
  EXPECT_EQ(Stats().pages_in_use(), pages);
  EXPECT_EQ(lookup(sys_ids), sys_found);
  EXPECT_EQ(lookup(other_ids), other_found);
  // ("user" is tombstoned: released before the snapshot.)
  EXPECT_EQ(fork_prefix("user-2", sys_ids), fork_before);
  EXPECT_TRUE(Answers("user-2") == user) << "a fork after the restart answers otherwise";
  ASSERT_TRUE(release("user-2").ok());
  EXPECT_EQ(h_->pins().pins(), 1);
  EXPECT_EQ(h_->pins().pages(), static_cast<int64_t>(pinned.pages_pinned()));
  // The lease came back with what was left of it at the drain (600 s).
  now_ += absl::Seconds(599);
  h_->ExpireIdle();
  EXPECT_EQ(h_->pins().pins(), 1);
  now_ += absl::Seconds(2);
  h_->ExpireIdle();
  EXPECT_EQ(h_->pins().pins(), 0);
  h_->prefix_index().EvictAll();
  EXPECT_EQ(Stats().pages_in_use(), 0u);
}

}  // namespace
}  // namespace driftkv
