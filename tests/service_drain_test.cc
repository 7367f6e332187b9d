// Graceful drain and warm restart with real driftkv-server processes
// (docs/reliability.md): sequences pushed to a server (one with a hot
// tier, so hot layers are snapshotted in cold form), SIGTERM, health
// NOT_SERVING and new sequences refused with UNAVAILABLE naming the drain
// while existing ones are still served, exit 0, a snapshot in the folder;
// a new server on that folder answers Read and Attend bit-identically. Then
// a page of the snapshot is corrupted: the next start reports it (stderr,
// Stats, /metrics counters) and does not serve that sequence; the others
// are served bit-identically. A snapshot of another codec is refused.
//
//   service_drain_test SERVER
//   DRIFTKV_DRAIN_BACKEND=cuda service_drain_test driftkv-server-cuda   (GPU machine)
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/grpc_health_v1.grpc.pb.h"
#include "tests/server_process.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

std::string g_server;  // argv[1]

using testing::ServerProcess;
using testing::Slurp;

constexpr int kLayers = 2, kKvHeads = 2, kHeadDim = 64, kN = kKvHeads * kHeadDim, kPage = 128, kWindow = 32;

std::string WriteConfig(const std::string& dir, const std::string& extra, uint64_t pool_bytes = 8388608) {
  const std::string path = dir + "/server.textproto";
  std::ofstream(path) << "model { layers: " << kLayers << " kv_heads: " << kKvHeads << " head_dim: " << kHeadDim
                      << " }\ncodec { name: \"dquant\" page_tokens: " << kPage << " }\nwindow_tokens: " << kWindow
                      << "\npool_bytes: " << pool_bytes << "\nhot_tier_fraction: 0.25\nhot_idle_seconds: 0\n"
                      << "snapshot_dir: \"" << dir << "/snap\"\ndrain_timeout_seconds: 10\n"
                      << extra;
  // On a GPU machine: DRIFTKV_DRAIN_BACKEND=cuda with driftkv-server-cuda
  // as SERVER restores the pages into the device mirror too.
  if (const char* backend = std::getenv("DRIFTKV_DRAIN_BACKEND")) {
    std::ofstream(path, std::ios::app) << "backend: \"" << backend << "\"\n";
  }
  mkdir((dir + "/snap").c_str(), 0755);
  return path;
}

ClientOptions Options(int port) {
  ClientOptions o;
  o.target = testing::LoopbackTarget(port);
  o.max_attempts = 1;
  return o;
}

v1::AppendChunk Chunk(const std::string& id, int layer, int first, int count, uint32_t seed) {
  testing::Kv kv = testing::SyntheticKv(count, kN, seed);
  return testing::ChunkOfRows(id, layer, first, count, kv.keys.data(), kv.values.data(), kN);
}

// What a client sees of a sequence: every layer's Read bytes and an
// Attend's output and lse bytes.
std::vector<std::string> Observe(Client& client, const std::string& id, absl::Status* status) {
  std::vector<std::string> out;
  for (int l = 0; l < kLayers; ++l) {
    v1::ReadRequest r;
    r.set_sequence_id(id);
    r.set_layer(l);
    r.set_dtype(v1::DTYPE_F32);
    absl::StatusOr<std::vector<v1::ReadChunk>> chunks = client.Read(r);
    if (!chunks.ok()) {
      *status = chunks.status();
      return out;
    }
    std::string bytes;
    for (const v1::ReadChunk& c : *chunks) bytes += c.keys() + c.values();
    out.push_back(bytes);
  }
  v1::AttendRequest a;
  for (int l = 0; l < kLayers; ++l) {
    if (out[l].empty()) continue;  // an empty layer has nothing to attend to
    *a.add_items() = testing::QueryItem(id, l, testing::SyntheticQuery(4, kHeadDim, 7 + l), 4);
  }
  absl::StatusOr<v1::AttendResponse> r = client.Attend(a);
  if (!r.ok()) {
    *status = r.status();
    return out;
  }
  for (const v1::AttendResult& res : r->results()) {
    out.push_back(res.output() + std::string(reinterpret_cast<const char*>(res.lse().data()), res.lse_size() * 4));
  }
  *status = absl::OkStatus();
  return out;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(int port) {
  auto channel = grpc::CreateChannel(testing::LoopbackTarget(port), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("driftkv.v1.KvCache");
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  return st.ok() ? resp.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

class DrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/drain_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    mkdir(dir_.c_str(), 0755);
  }
  std::string dir_;
};

// Sequences "s0".."s5" of various lengths (pages and windows, some layers
// empty); s0's and s1's layers are made hot by an Attend.
std::vector<std::string> Populate(Client& client) {
  std::vector<std::string> ids;
  const int lengths[] = {kPage + kWindow + 97, 3 * kPage + kWindow, 1, 2 * kPage + kWindow + 5, 400, 700};
  for (int s = 0; s < 6; ++s) {
    const std::string id = absl::StrCat("s", s);
    std::vector<v1::AppendChunk> chunks;
    for (int l = 0; l < kLayers; ++l) {
      if (s == 2 && l == 1) continue;  // an empty layer
      chunks.push_back(Chunk(id, l, 0, lengths[s], 100 * s + l));
    }
    EXPECT_TRUE(client.Append(chunks).ok()) << id;
    ids.push_back(id);
  }
  return ids;
}

TEST_F(DrainTest, SigtermSnapshotsAndRestartServesBitIdentically) {
  const std::string config = WriteConfig(dir_, "drain_notice_seconds: 1.5\n");
  ServerProcess a;
  ASSERT_TRUE(a.Start(g_server, config, dir_ + "/a.log")) << Slurp(dir_ + "/a.log");
  Client client(Options(a.port));
  std::vector<std::string> ids = Populate(client);
  std::map<std::string, std::vector<std::string>> before;
  for (const std::string& id : ids) {
    absl::Status st;
    before[id] = Observe(client, id, &st);
    ASSERT_TRUE(st.ok()) << id << ": " << st;
  }
  absl::StatusOr<v1::StatsResponse> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->hot_layers(), 0u) << "the hot tier must hold layers for the snapshot to demote";

  ASSERT_EQ(kill(a.pid, SIGTERM), 0);
  // The notice period: NOT_SERVING, new sequences refused, old ones served.
  bool not_serving = false;
  for (int i = 0; i < 50 && !not_serving; ++i) {
    not_serving = Health(a.port) == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    if (!not_serving) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(not_serving);
  std::vector<v1::AppendChunk> fresh = {Chunk("new-during-drain", 0, 0, 10, 9)};
  absl::StatusOr<v1::AppendResponse> refused = client.Append(fresh);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "draining")) << refused.status();
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->draining());
  {
    absl::Status st;
    EXPECT_EQ(Observe(client, "s3", &st), before["s3"]);
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(a.Wait(), 0) << Slurp(a.log);
  EXPECT_TRUE(absl::StrContains(Slurp(a.log), "snapshot of 6 sequences")) << Slurp(a.log);

  ServerProcess b;
  ASSERT_TRUE(b.Start(g_server, config, dir_ + "/b.log")) << Slurp(dir_ + "/b.log");
  EXPECT_TRUE(absl::StrContains(Slurp(b.log), "restored 6 sequences")) << Slurp(b.log);
  Client again(Options(b.port));
  info = again.Info();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->restored_sequences(), 6u);
  EXPECT_FALSE(info->draining());
  EXPECT_EQ(Health(b.port), grpc::health::v1::HealthCheckResponse::SERVING);
  for (const std::string& id : ids) {
    absl::Status st;
    EXPECT_EQ(Observe(again, id, &st), before[id]) << id;
    EXPECT_TRUE(st.ok()) << id << ": " << st;
  }
  // Restored sequences take appends where they left off.
  std::vector<v1::AppendChunk> more = {Chunk("s2", 0, 1, 200, 77)};
  EXPECT_TRUE(again.Append(more).ok());
  // The loaded file is set aside: a crash now would not bring it back.
  EXPECT_FALSE(std::ifstream(dir_ + "/snap/snapshot.dkvs").good());
  EXPECT_TRUE(std::ifstream(dir_ + "/snap/snapshot.dkvs.loaded").good());
  kill(b.pid, SIGTERM);
  EXPECT_EQ(b.Wait(), 0) << Slurp(b.log);
}

TEST_F(DrainTest, CorruptSnapshotPageIsReportedAndNotServed) {
  const std::string config = WriteConfig(dir_, "drain_notice_seconds: 0\n");
  ServerProcess a;
  ASSERT_TRUE(a.Start(g_server, config, dir_ + "/a.log")) << Slurp(dir_ + "/a.log");
  Client client(Options(a.port));
  std::vector<std::string> ids = Populate(client);
  std::map<std::string, std::vector<std::string>> before;
  for (const std::string& id : ids) {
    absl::Status st;
    before[id] = Observe(client, id, &st);
  }
  kill(a.pid, SIGTERM);
  ASSERT_EQ(a.Wait(), 0) << Slurp(a.log);

  // The file ends with the last sequence's (s5, 700 tokens: 5 pages and
  // 60 window tokens) last layer's pages, its token digests (count, CRC,
  // 8 bytes per paged token, CRC) and the 24-byte trailer: flip one bit of
  // its last page.
  const std::string path = dir_ + "/snap/snapshot.dkvs";
  std::string bytes = Slurp(path);
  const size_t digests = 12 + 8 * 5 * kPage;
  ASSERT_GT(bytes.size(), digests + 1000u);
  bytes[bytes.size() - 24 - digests - 500] ^= 0x10;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;

  ServerProcess b;
  ASSERT_TRUE(b.Start(g_server, config, dir_ + "/b.log")) << Slurp(dir_ + "/b.log");
  const std::string log = Slurp(b.log);
  EXPECT_TRUE(absl::StrContains(log, "restored 5 sequences")) << log;
  EXPECT_TRUE(absl::StrContains(log, "1 corrupt pages, 1 sequences dropped")) << log;
  EXPECT_TRUE(absl::StrContains(log, "sequence_id \"s5\" not restored: page ")) << log;
  Client again(Options(b.port));
  absl::StatusOr<v1::StatsResponse> stats = again.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->snapshot_corrupt_pages(), 1u);
  EXPECT_EQ(stats->snapshot_dropped_sequences(), 1u);
  EXPECT_EQ(stats->sequences(), 5u);
  for (const std::string& id : ids) {
    absl::Status st;
    std::vector<std::string> now = Observe(again, id, &st);
    if (id == "s5") {
      EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
    } else {
      EXPECT_TRUE(st.ok()) << id << ": " << st;
      EXPECT_EQ(now, before[id]) << id;
    }
  }
  kill(b.pid, SIGTERM);
  EXPECT_EQ(b.Wait(), 0) << Slurp(b.log);
}

TEST_F(DrainTest, SnapshotOfAnotherCodecIsRefused) {
  const std::string config = WriteConfig(dir_, "drain_notice_seconds: 0\n");
  ServerProcess a;
  ASSERT_TRUE(a.Start(g_server, config, dir_ + "/a.log")) << Slurp(dir_ + "/a.log");
  Client client(Options(a.port));
  Populate(client);
  kill(a.pid, SIGTERM);
  ASSERT_EQ(a.Wait(), 0) << Slurp(a.log);
  // Same folder, other key levels: pages of one cannot be read by the other.
  std::string text = Slurp(config);
  text.replace(text.find("page_tokens"), 0, "key_levels: 6 ");
  std::ofstream(config, std::ios::trunc) << text;
  ServerProcess b;
  EXPECT_FALSE(b.Start(g_server, config, dir_ + "/b.log"));
  const std::string log = Slurp(b.log);
  EXPECT_TRUE(absl::StrContains(log, "key_levels: snapshot 8, this server 6")) << log;
  EXPECT_TRUE(std::ifstream(dir_ + "/snap/snapshot.dkvs").good()) << "a refused snapshot stays where it was";
}

// A server with both levels below a pool of a few sequences: `count`
// sequences of 700 tokens (5 pages and 60 window tokens a layer) pushed,
// most of them moved down.
constexpr uint64_t kLevelPoolBytes = 1u << 20;
std::string LevelConfig(const std::string& dir) {
  mkdir((dir + "/disk").c_str(), 0755);
  return WriteConfig(
      dir,
      absl::StrCat("drain_notice_seconds: 0\nmax_sequences: 4096\n", "host_level { budget_bytes: 1048576 }\n",
                   "disk_level { dir: \"", dir, "/disk\" budget_bytes: 67108864 segment_bytes: 1048576 }\n"),
      kLevelPoolBytes);
}

absl::Status PushLevelSequence(Client& client, const std::string& id, uint32_t seed) {
  std::vector<v1::AppendChunk> chunks;
  for (int l = 0; l < kLayers; ++l) chunks.push_back(Chunk(id, l, 0, 700, seed + l));
  return client.Append(chunks).status();
}

int SegmentFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) n += absl::EndsWith(e.path().string(), ".dks");
  return n;
}

// Drain, restart, answers bit-identical; the disk level's records are named
// by the snapshot and reopened from their footers. Then a kill -9 while
// sequences move down: the next start has no snapshot (the last was
// loaded), reports nothing stored, wipes the disk level and serves.
TEST_F(DrainTest, LevelsSurviveADrainAndAKillLosesNothingReported) {
  const std::string config = LevelConfig(dir_);
  constexpr int kCount = 40;
  std::map<std::string, std::vector<std::string>> before;
  {
    ServerProcess a;
    ASSERT_TRUE(a.Start(g_server, config, dir_ + "/a.log")) << Slurp(dir_ + "/a.log");
    Client client(Options(a.port));
    for (int i = 0; i < kCount; ++i) ASSERT_TRUE(PushLevelSequence(client, absl::StrCat("L", i), 31 * i).ok()) << i;
    for (int i = 0; i < kCount; ++i) {
      absl::Status st;
      before[absl::StrCat("L", i)] = Observe(client, absl::StrCat("L", i), &st);
      ASSERT_TRUE(st.ok()) << i << ": " << st;
    }
    ASSERT_EQ(kill(a.pid, SIGTERM), 0);
    ASSERT_EQ(a.Wait(), 0) << Slurp(a.log);
    const std::string log = Slurp(a.log);
    EXPECT_TRUE(absl::StrContains(log, absl::StrCat("snapshot of ", kCount, " sequences"))) << log;
    EXPECT_TRUE(absl::StrContains(log, "stay in the disk level's records")) << log;
  }
  const uint64_t disk_bytes = [&] {
    uint64_t b = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir_ + "/disk")) b += e.file_size();
    return b;
  }();
  ASSERT_GT(disk_bytes, 0u);
  // The snapshot names what is on disk instead of holding it.
  EXPECT_LT(std::filesystem::file_size(dir_ + "/snap/snapshot.dkvs"), disk_bytes);

  ServerProcess b;
  ASSERT_TRUE(b.Start(g_server, config, dir_ + "/b.log")) << Slurp(dir_ + "/b.log");
  {
    const std::string log = Slurp(b.log);
    EXPECT_TRUE(absl::StrContains(log, absl::StrCat("restored ", kCount, " sequences"))) << log;
    EXPECT_TRUE(absl::StrContains(log, "left in the disk level's records")) << log;
    EXPECT_TRUE(absl::StrContains(log, "(0 segments scanned)")) << log;
  }
  Client again(Options(b.port));
  for (int i = kCount - 1; i >= 0; --i) {
    absl::Status st;
    EXPECT_EQ(Observe(again, absl::StrCat("L", i), &st), before[absl::StrCat("L", i)]) << i;
    EXPECT_TRUE(st.ok()) << i << ": " << st;
  }
  // Sequences move down while a kill -9 lands.
  std::atomic<int> acknowledged{0};
  std::thread pusher([&] {
    for (int i = 0; i < 200; ++i) {
      if (!PushLevelSequence(again, absl::StrCat("K", i), 7000 + 13 * i).ok()) return;
      acknowledged.fetch_add(1);
    }
  });
  while (acknowledged.load() < 20) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_EQ(kill(b.pid, SIGKILL), 0);
  pusher.join();
  EXPECT_EQ(b.Wait(), -1);
  EXPECT_GT(SegmentFiles(dir_ + "/disk"), 0);

  ServerProcess c;
  ASSERT_TRUE(c.Start(g_server, config, dir_ + "/c.log")) << Slurp(dir_ + "/c.log");
  EXPECT_TRUE(absl::StrContains(Slurp(c.log), "no snapshot in")) << Slurp(c.log);
  Client third(Options(c.port));
  absl::StatusOr<v1::StatsResponse> stats = third.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->sequences(), 0u) << "after a crash nothing is reported stored";
  EXPECT_EQ(SegmentFiles(dir_ + "/disk"), 0) << "a start without a snapshot wipes the disk level";
  // And it serves, moving sequences down and back as before.
  for (int i = 0; i < kCount; ++i) ASSERT_TRUE(PushLevelSequence(third, absl::StrCat("L", i), 31 * i).ok()) << i;
  for (int i = 0; i < kCount; ++i) {
    absl::Status st;
    EXPECT_EQ(Observe(third, absl::StrCat("L", i), &st), before[absl::StrCat("L", i)]) << i;
    EXPECT_TRUE(st.ok()) << i << ": " << st;
  }
  kill(c.pid, SIGTERM);
  EXPECT_EQ(c.Wait(), 0) << Slurp(c.log);
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: service_drain_test SERVER\n");
    return 2;
  }
  driftkv::g_server = argv[1];
  return RUN_ALL_TESTS();
}
