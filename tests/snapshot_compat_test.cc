// Warm restarts across the change of the default containers of small
// shapes (service/snapshot_compat.h). SmallOptions is n = 2 x 64 = 128,
// whose default payloads were 40 and 25 bytes (LegacyDefaultPayloadBytes)
// and are 48 and 36 now. A snapshot of an earlier release's server with the
// sizes unset is the snapshot of a server with 40 and 25 set: the identity
// records the resolved sizes, not whether they were set. So the "old"
// snapshots here are written by a handler of today with those sizes set.
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "service/handler.h"
#include "service/server.h"
#include "service/snapshot_compat.h"
#include "tests/handler_fixture.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

constexpr int kOldKeyBytes = 40, kOldValueBytes = 25;  // n = 128 before
constexpr int kNewKeyBytes = 48, kNewValueBytes = 36;  // n = 128 now

ServiceOptions Options(const std::string& dir, int key_bytes, int value_bytes) {
  ServiceOptions o = testing::SmallOptions();
  o.snapshot_dir = dir;
  o.codec.key_bytes = key_bytes;
  o.codec.value_bytes = value_bytes;
  o.drain_notice_seconds = 0;
  return o;
}

class SnapshotCompatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  // Writes the snapshot of a server with the sizes set (0: unset) holding
  // 300 tokens of one sequence on both layers; *layers gets what Read
  // returned for each layer before the drain.
  void WriteSnapshot(int key_bytes, int value_bytes, std::string layers[2]) {
    testing::TestHandler t(Options(dir_, key_bytes, value_bytes));
    ASSERT_NE(t.h, nullptr);
    const testing::Kv kv = testing::SyntheticKv(300, testing::kSmallN, 11);
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_TRUE(t.Push("chat", l, kv, 0, 300).ok());
      layers[l] = testing::ReadLayerBytes(*t.h, "chat", l);
    }
    Handler::SnapshotSummary written;
    ASSERT_TRUE(t.h->WriteSnapshot(dir_, &written).ok());
    ASSERT_EQ(written.sequences, 1u);
  }

  std::string dir_;
};

TEST_F(SnapshotCompatTest, UnsetSizesKeepTheEarlierDefaultsOfTheSnapshot) {
  std::string before[2];
  WriteSnapshot(kOldKeyBytes, kOldValueBytes, before);
  absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(Options(dir_, 0, 0));
  ASSERT_TRUE(s.ok()) << s.status();
  DriftkvServer& server = **s;
  const std::string& line = server.kept_payloads();
  EXPECT_NE(line.find("key_bytes 40, value_bytes 25"), std::string::npos) << line;
  EXPECT_NE(line.find("they are now key_bytes 48, value_bytes 36"), std::string::npos) << line;
  const KvCodec::Settings c = server.handler().codec().settings();
  EXPECT_EQ(c.key_payload_bytes, kOldKeyBytes);
  EXPECT_EQ(c.value_payload_bytes, kOldValueBytes);
  EXPECT_EQ(server.restored().sequences, 1u);
  EXPECT_EQ(server.restored().dropped_sequences, 0u);
  for (uint32_t l = 0; l < 2; ++l) EXPECT_EQ(testing::ReadLayerBytes(server.handler(), "chat", l), before[l]) << l;
  // Outside the quality envelope, so the start warns.
  EXPECT_NE(QualityWarning(server.handler().options()), "");

  // Its own snapshot keeps them again at the next start.
  Handler::SnapshotSummary written;
  ASSERT_TRUE(server.Drain(&written).ok());
  s->reset();
  s = DriftkvServer::Start(Options(dir_, 0, 0));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE((*s)->kept_payloads(), "");
  EXPECT_EQ((*s)->handler().codec().settings().key_payload_bytes, kOldKeyBytes);
  EXPECT_EQ(testing::ReadLayerBytes((*s)->handler(), "chat", 1), before[1]);
  (*s)->Shutdown(absl::Seconds(1));
}

// A size the config sets is never replaced: the snapshot is refused as before.
TEST_F(SnapshotCompatTest, SetSizesAreNeverChanged) {
  std::string before[2];
  WriteSnapshot(kOldKeyBytes, kOldValueBytes, before);
  absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(Options(dir_, kNewKeyBytes, kNewValueBytes));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  EXPECT_NE(s.status().message().find("key_payload_bytes: snapshot 40, this server 48"), std::string::npos)
      << s.status();
}

// Without a snapshot, and with a snapshot of today's defaults, the defaults
// are today's.
TEST_F(SnapshotCompatTest, TodaysDefaultsOtherwise) {
  absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(Options(dir_, 0, 0));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->kept_payloads(), "");
  EXPECT_EQ((*s)->handler().codec().settings().key_payload_bytes, kNewKeyBytes);
  EXPECT_EQ((*s)->handler().codec().settings().value_payload_bytes, kNewValueBytes);
  EXPECT_EQ(QualityWarning((*s)->handler().options()), "");
  s->reset();

  std::string before[2];
  WriteSnapshot(0, 0, before);
  s = DriftkvServer::Start(Options(dir_, 0, 0));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->kept_payloads(), "");
  EXPECT_EQ((*s)->restored().sequences, 1u);
  EXPECT_EQ(testing::ReadLayerBytes((*s)->handler(), "chat", 0), before[0]);
  (*s)->Shutdown(absl::Seconds(1));
}

// The decision on identities alone: only a stream left unset, of the same
// shape, levels and alpha, whose size is the earlier default and not today's.
TEST(KeepSnapshotPayloadsTest, KeepsOnlyTheEarlierDefaultsOfUnsetStreams) {
  testing::TestHandler old_server(Options("", kOldKeyBytes, kOldValueBytes));
  ASSERT_NE(old_server.h, nullptr);
  const std::string old_identity = old_server.h->SnapshotIdentity();

  ServiceOptions o = Options("", 0, kNewValueBytes);  // values set
  EXPECT_NE(KeepSnapshotPayloads(old_identity, "S", &o), "");
  EXPECT_EQ(o.codec.key_bytes, kOldKeyBytes);
  EXPECT_EQ(o.codec.value_bytes, kNewValueBytes);

  // Sizes that were never a default: left to the load, which refuses them.
  testing::TestHandler other(Options("", 44, 28));
  ASSERT_NE(other.h, nullptr);
  o = Options("", 0, 0);
  EXPECT_EQ(KeepSnapshotPayloads(other.h->SnapshotIdentity(), "S", &o), "");
  EXPECT_EQ(o.codec.key_bytes, 0);
  EXPECT_EQ(o.codec.value_bytes, 0);

  // Another shape or level count: the load names the difference.
  o = Options("", 0, 0);
  o.codec.kv_heads = 4;
  EXPECT_EQ(KeepSnapshotPayloads(old_identity, "S", &o), "");
  o = Options("", 0, 0);
  o.codec.value_levels = 5;
  EXPECT_EQ(KeepSnapshotPayloads(old_identity, "S", &o), "");
  EXPECT_EQ(o.codec.key_bytes, 0);

  // From n = 512 up the earlier defaults are today's: nothing to keep.
  ServiceOptions wide = Options("", 0, 0);
  wide.codec.kv_heads = 4;
  wide.codec.head_dim = 128;
  testing::TestHandler wide_server(wide);
  ASSERT_NE(wide_server.h, nullptr);
  EXPECT_EQ(KeepSnapshotPayloads(wide_server.h->SnapshotIdentity(), "S", &wide), "");
  EXPECT_EQ(wide.codec.key_bytes, 0);

  // Not D-Quant's identity at all.
  o = Options("", 0, 0);
  EXPECT_EQ(KeepSnapshotPayloads(absl::StrReplaceAll(old_identity, {{"codec=dquant", "codec=int"}}), "S", &o), "");
}

}  // namespace
}  // namespace driftkv
