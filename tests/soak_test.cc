// Soak with faults against a real driftkv-server on loopback
// (docs/reliability.md, "Soak"). For SECONDS (default 60), WORKERS client
// threads (default 8) append, attend and read their own sequences while
// faults are injected: Append streams cancelled mid-stream, deadline storms
// (Attend and Read with deadlines of 0.1 - 2 ms), a pool small enough to
// fill (RESOURCE_EXHAUSTED, answered by releasing), oversize messages, and
// releases running concurrently with Attend and Read of the same sequence.
// Afterwards:
//   - every layer holds whole chunks only (a cancelled stream never leaves
//     part of a chunk), and at least every acknowledged token;
//   - every live sequence reads back bit-identically to a reference handler
//     (in process, same config) fed the same tokens in one go;
//   - every released sequence is NOT_FOUND;
//   - health is SERVING; the server's RSS is flat (the peak of the last
//     third of the run within 10% + 16 MiB of the peak of the middle third);
//   - after SIGTERM the server exits 0 (under --config=asan LeakSanitizer
//     makes a leak a non-zero exit).
// Every fault and outcome is counted and printed.
//
//   soak_test SERVER [SECONDS [WORKERS]]   (SOAK_SECONDS in the environment overrides SECONDS)
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "service/config.h"
#include "service/handler.h"
#include "tests/grpc_health_v1.grpc.pb.h"
#include "tests/server_process.h"
#include "tests/service_test_util.h"

namespace driftkv {
namespace {

std::string g_server;
int g_seconds = 60;
int g_workers = 8;

constexpr int kLayers = 2, kN = 128, kChunk = 24;  // 2 KV heads x 64

const char* kConfig = R"(model { layers: 2 kv_heads: 2 head_dim: 64 }
codec { name: "dquant" page_tokens: 128 }
window_tokens: 32
pool_bytes: 1048576
hot_tier_fraction: 0.25
hot_idle_seconds: 0
max_sequences: 48
max_message_bytes: 1048576
drain_notice_seconds: 0
drain_timeout_seconds: 10
)";

// The value of token t, channel j of layer `layer` of the sequence with
// seed `seed`: a function of the position only, so that any retry or
// duplicate sends the same data, and any reader can recompute it.
float Value(uint64_t seed, int layer, int64_t t, int j, bool key) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + (static_cast<uint64_t>(layer) << 56) + (static_cast<uint64_t>(t) << 12) +
               (static_cast<uint64_t>(j) << 1) + (key ? 1 : 0);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  return static_cast<float>(static_cast<int64_t>(x % 4001) - 2000) / 1000.0f + (key && j % 17 == 0 ? 3.0f : 0.0f);
}

v1::AppendChunk Chunk(const std::string& id, uint64_t seed, int layer, int64_t first, int count) {
  std::vector<float> k(static_cast<size_t>(count) * kN), v(k.size());
  for (int t = 0; t < count; ++t) {
    for (int j = 0; j < kN; ++j) {
      k[t * kN + j] = Value(seed, layer, first + t, j, true);
      v[t * kN + j] = Value(seed, layer, first + t, j, false);
    }
  }
  return testing::ChunkOfRows(id, layer, first, count, k.data(), v.data(), kN);
}

v1::AttendRequest AttendAll(const std::string& id, const std::vector<int64_t>& lengths) {
  v1::AttendRequest a;
  for (int l = 0; l < kLayers; ++l) {
    if (lengths[l] == 0) continue;
    *a.add_items() = testing::QueryItem(id, l, std::vector<float>(4 * 64, 0.05f), 4);
  }
  return a;
}

struct Counters {
  std::mutex mu;
  std::map<std::string, int64_t> n;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    ++n[what];
  }
};

struct Seq {
  std::string id;
  uint64_t seed = 0;
  std::vector<int64_t> acked = std::vector<int64_t>(kLayers, 0);  // acknowledged tokens per layer
  std::vector<int64_t> sent = std::vector<int64_t>(kLayers, 0);   // where the next chunk starts
  // The last fault was a cancelled stream: the server may still store its
  // chunks after the client has given up (see Settle).
  bool cancelled = false;
};

// After a cancelled stream the server may still be storing chunks it had
// received: wait until the lengths hold still (two reads 50 ms apart agree;
// at most 2 s).
void Settle(Client& client, const std::string& id) {
  std::string last = "unset";
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<v1::LengthResponse> len = client.Length(id);
    const std::string now = len.ok() ? len->SerializeAsString() : len.status().ToString();
    if (now == last) return;
    last = now;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string Code(const absl::Status& st) {
  return absl::StatusCodeToString(st.code());
}

// Whole chunks only, at least what was acknowledged: then adopt the length.
void Resync(Client& client, Seq* s, Counters* counters, std::atomic<int>* failures) {
  absl::StatusOr<v1::LengthResponse> len = client.Length(s->id);
  if (!len.ok()) {
    if (absl::IsNotFound(len.status())) {  // the cancelled stream created nothing
      for (int l = 0; l < kLayers; ++l) {
        if (s->acked[l] != 0) {
          std::fprintf(stderr, "FAIL: %s NOT_FOUND after %lld acknowledged tokens\n", s->id.c_str(),
                       static_cast<long long>(s->acked[l]));
          ++*failures;
        }
        s->sent[l] = 0;
      }
      return;
    }
    counters->Add("length " + Code(len.status()));
    return;
  }
  for (int l = 0; l < kLayers; ++l) {
    const int64_t stored = static_cast<int64_t>(len->layers(l).tokens());
    if (stored < s->acked[l] || stored % kChunk != 0) {
      std::fprintf(stderr, "FAIL: %s layer %d holds %lld tokens; acknowledged %lld, chunks of %d\n", s->id.c_str(), l,
                   static_cast<long long>(stored), static_cast<long long>(s->acked[l]), kChunk);
      ++*failures;
    }
    s->acked[l] = s->sent[l] = stored;
  }
}

class Soak {
 public:
  Soak(int port) : port_(port) {}

  void Worker(int w) {
    std::mt19937_64 rng(1234 + w);
    ClientOptions o;
    o.target = testing::LoopbackTarget(port_);
    o.max_attempts = 1;
    o.timeout = absl::Seconds(20);
    Client client(o);
    ClientOptions storm_options = o;
    Client storm(storm_options);
    auto channel = grpc::CreateChannel(o.target, grpc::InsecureChannelCredentials());
    auto stub = v1::KvCache::NewStub(channel);
    std::vector<Seq> live;
    int next = 0;
    const absl::Time end = absl::Now() + absl::Seconds(g_seconds);
    while (absl::Now() < end && failures_.load() == 0) {
      if (live.size() < 3) {
        Seq s;
        s.id = absl::StrCat("w", w, "-", next++);
        s.seed = rng();
        live.push_back(s);
      }
      Seq& s = live[rng() % live.size()];
      const int op = static_cast<int>(rng() % 100);
      if (op < 45) {  // append 1-3 chunks to every layer
        std::vector<v1::AppendChunk> chunks;
        const int k = 1 + static_cast<int>(rng() % 3);
        for (int i = 0; i < k; ++i) {
          for (int l = 0; l < kLayers; ++l) chunks.push_back(Chunk(s.id, s.seed, l, s.sent[l] + i * kChunk, kChunk));
        }
        absl::StatusOr<v1::AppendResponse> r = client.Append(chunks);
        counters_.Add("append " + (r.ok() ? std::string("OK") : Code(r.status())));
        if (r.ok()) {
          s.cancelled = false;
          for (int l = 0; l < kLayers; ++l) s.acked[l] = s.sent[l] = s.sent[l] + k * kChunk;
        } else {
          Resync(client, &s, &counters_, &failures_);
          if (absl::IsResourceExhausted(r.status())) Doom(&live, &s, client);  // pool or max_sequences full
        }
      } else if (op < 55) {  // an Append stream cancelled mid-stream
        grpc::ClientContext ctx;
        v1::AppendResponse resp;
        std::unique_ptr<grpc::ClientWriter<v1::AppendChunk>> writer = stub->Append(&ctx, &resp);
        const int k = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < k; ++i) {
          if (!writer->Write(Chunk(s.id, s.seed, static_cast<int>(i % kLayers),
                                   s.sent[i % kLayers] + (i / kLayers) * kChunk, kChunk))) {
            break;
          }
        }
        absl::SleepFor(absl::Microseconds(rng() % 2000));
        ctx.TryCancel();
        (void)writer->Finish();
        counters_.Add("killed stream");
        Settle(client, s.id);
        Resync(client, &s, &counters_, &failures_);
        s.cancelled = true;
      } else if (op < 70) {  // attend
        if (s.acked[0] + s.acked[1] == 0) continue;
        absl::StatusOr<v1::AttendResponse> r = client.Attend(AttendAll(s.id, s.acked));
        counters_.Add("attend " + (r.ok() ? std::string("OK") : Code(r.status())));
        if (!r.ok() && !absl::IsResourceExhausted(r.status())) Fail("attend " + s.id, r.status());
      } else if (op < 80) {  // read a layer
        v1::ReadRequest q;
        q.set_sequence_id(s.id);
        q.set_layer(static_cast<uint32_t>(rng() % kLayers));
        absl::StatusOr<std::vector<v1::ReadChunk>> r = client.Read(q);
        const bool empty = s.acked[q.layer()] == 0;
        counters_.Add("read " + (r.ok() ? std::string("OK") : Code(r.status())));
        if (!r.ok() && !(empty && absl::IsNotFound(r.status()))) Fail("read " + s.id, r.status());
      } else if (op < 88) {  // a deadline storm: 20 calls with 0.1 - 2 ms
        for (int i = 0; i < 20; ++i) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::microseconds(100 + rng() % 1900));
          if (i % 2 == 0 && s.acked[0] + s.acked[1] > 0) {
            v1::AttendResponse resp;
            grpc::Status st = stub->Attend(&ctx, AttendAll(s.id, s.acked), &resp);
            counters_.Add(absl::StrCat("storm attend ", st.error_code()));
          } else {
            v1::ReadRequest q;
            q.set_sequence_id(s.id);
            auto reader = stub->Read(&ctx, q);
            v1::ReadChunk c;
            while (reader->Read(&c)) {
            }
            counters_.Add(absl::StrCat("storm read ", reader->Finish().error_code()));
          }
        }
      } else if (op < 92) {  // oversize: one chunk above max_message_bytes, nothing stored
        std::vector<v1::AppendChunk> big = {Chunk(s.id, s.seed, 0, s.sent[0], 1100)};  // 1100 x 128 x 8 bytes
        absl::StatusOr<v1::AppendResponse> r = client.Append(big);
        counters_.Add("oversize " + (r.ok() ? std::string("OK") : Code(r.status())));
        if (r.ok()) Fail("oversize accepted", absl::OkStatus());
        Resync(client, &s, &counters_, &failures_);
      } else {  // release, concurrently with an Attend and a Read of it
        Doom(&live, &s, client);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (Seq& s : live) survivors_.push_back(s);
  }

  // Releases `s` on another thread while this one attends and reads it
  // (OK or NOT_FOUND, nothing else), then forgets it.
  void Doom(std::vector<Seq>* live, Seq* s, Client& client) {
    const std::string id = s->id;
    const std::vector<int64_t> acked = s->acked;
    std::thread releaser([this, id] {
      ClientOptions o;
      o.target = testing::LoopbackTarget(port_);
      o.max_attempts = 1;
      Client c(o);
      absl::StatusOr<v1::ReleaseResponse> r = c.Release(id);
      counters_.Add("release " + (r.ok() ? std::string("OK") : Code(r.status())));
    });
    if (acked[0] + acked[1] > 0) {
      absl::StatusOr<v1::AttendResponse> a = client.Attend(AttendAll(id, acked));
      counters_.Add("attend during release " + (a.ok() ? std::string("OK") : Code(a.status())));
      if (!a.ok() && !absl::IsNotFound(a.status())) Fail("attend during release " + id, a.status());
    }
    releaser.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_.push_back(id);
      if (s->cancelled) late_.insert(id);
    }
    *s = live->back();
    live->pop_back();
  }

  void Fail(const std::string& what, const absl::Status& st) {
    std::fprintf(stderr, "FAIL: %s: %s\n", what.c_str(), st.ToString().c_str());
    ++failures_;
  }

  int port_;
  Counters counters_;
  std::atomic<int> failures_{0};
  std::mutex mu_;
  std::vector<Seq> survivors_;
  std::vector<std::string> released_;
  // Released right after a cancelled stream: a chunk of that stream still
  // in the server can re-create the sequence after the release (a late
  // write; the server has no tombstones).
  std::set<std::string> late_;
};

TEST(Soak, FaultsLoseNothingAcknowledged) {
  const std::string dir = ::testing::TempDir() + "/soak";
  mkdir(dir.c_str(), 0755);
  const std::string config = dir + "/server.textproto";
  std::ofstream(config) << kConfig;
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(g_server, config, dir + "/server.log")) << testing::Slurp(dir + "/server.log");

  Soak soak(server.port);
  std::vector<long> rss;  // KiB, every 250 ms
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      rss.push_back(server.RssKib());
      absl::SleepFor(absl::Milliseconds(250));
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < g_workers; ++w) workers.emplace_back([&soak, w] { soak.Worker(w); });
  for (std::thread& t : workers) t.join();
  done = true;
  sampler.join();
  EXPECT_EQ(soak.failures_.load(), 0);

  // Counters.
  int64_t ops = 0;
  for (const auto& [what, count] : soak.counters_.n) {
    std::printf("  %-40s %lld\n", what.c_str(), static_cast<long long>(count));
    ops += count;
  }
  std::printf("soak: %d s, %d workers, %lld operations, %zu sequences live, %zu released\n", g_seconds, g_workers,
              static_cast<long long>(ops), soak.survivors_.size(), soak.released_.size());
  EXPECT_GT(soak.counters_.n["killed stream"], 0);
  EXPECT_GT(soak.counters_.n["oversize RESOURCE_EXHAUSTED"], 0);
  EXPECT_GT(soak.counters_.n["release OK"], 0);
  EXPECT_GT(soak.counters_.n["append RESOURCE_EXHAUSTED"], 0) << "the pool never filled";

  // Every live sequence: lengths, then Read against the reference handler.
  absl::StatusOr<v1::ServerConfig> parsed = LoadConfigFile(config);
  ASSERT_TRUE(parsed.ok());
  parsed->set_hot_tier_fraction(0);  // answers are the same from either tier
  parsed->set_pool_bytes(64 << 20);
  absl::StatusOr<ServiceOptions> options = ResolveConfig(*parsed);
  ASSERT_TRUE(options.ok()) << options.status();
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> reference = Handler::Create(*options, &metrics);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ClientOptions o;
  o.target = testing::LoopbackTarget(server.port);
  Client client(o);
  int64_t tokens_checked = 0;
  for (const Seq& s : soak.survivors_) {
    absl::StatusOr<v1::LengthResponse> len = client.Length(s.id);
    if (s.acked[0] + s.acked[1] == 0 && !len.ok()) continue;
    ASSERT_TRUE(len.ok()) << s.id << ": " << len.status();
    for (int l = 0; l < kLayers; ++l) {
      const int64_t stored = static_cast<int64_t>(len->layers(l).tokens());
      EXPECT_EQ(stored, s.acked[l]) << s.id << " layer " << l;
      if (stored == 0) continue;
      for (int64_t t = 0; t < stored; t += kChunk) {
        v1::AppendResponse r;
        ASSERT_TRUE((*reference)->Append(Chunk(s.id, s.seed, l, t, kChunk), &r).ok());
      }
      v1::ReadRequest q;
      q.set_sequence_id(s.id);
      q.set_layer(l);
      std::string want, got;
      ASSERT_TRUE((*reference)
                      ->Read(q,
                             [&](const v1::ReadChunk& c) {
                               want += c.keys() + c.values();
                               return true;
                             })
                      .ok());
      absl::StatusOr<std::vector<v1::ReadChunk>> chunks = client.Read(q);
      ASSERT_TRUE(chunks.ok()) << chunks.status();
      for (const v1::ReadChunk& c : *chunks) got += c.keys() + c.values();
      EXPECT_TRUE(got == want) << s.id << " layer " << l << " does not read back bit-identically";
      tokens_checked += stored;
    }
    v1::ReleaseRequest rel;
    rel.set_sequence_id(s.id);
    v1::ReleaseResponse rr;
    (void)(*reference)->Release(rel, &rr);
  }
  int resurrected = 0;
  for (const std::string& id : soak.released_) {
    absl::StatusOr<v1::LengthResponse> len = client.Length(id);
    if (len.ok() && soak.late_.count(id) > 0) {
      ++resurrected;
      continue;
    }
    EXPECT_TRUE(absl::IsNotFound(len.status())) << id << " was released: " << len.status();
  }
  std::printf("soak: %d of %zu sequences released right after a cancelled stream were re-created by its late chunks\n",
              resurrected, soak.late_.size());
  std::printf("soak: %lld acknowledged tokens read back bit-identically over %zu sequences\n",
              static_cast<long long>(tokens_checked), soak.survivors_.size());

  // Health, memory.
  auto channel = grpc::CreateChannel(o.target, grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_GE(rss.size(), 6u);
  const size_t third = rss.size() / 3;
  const long middle = *std::max_element(rss.begin() + third, rss.begin() + 2 * third);
  const long last = *std::max_element(rss.begin() + 2 * third, rss.end());
  std::printf("soak: server RSS %ld KiB at start, peak %ld KiB in the middle third, %ld KiB in the last third\n",
              rss.front(), middle, last);
  EXPECT_LE(last, middle + middle / 10 + 16 * 1024) << "server memory grows";

  kill(server.pid, SIGTERM);
  EXPECT_EQ(server.Wait(), 0) << testing::Slurp(server.log);
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: soak_test SERVER [SECONDS [WORKERS]]\n");
    return 2;
  }
  driftkv::g_server = argv[1];
  if (argc > 2) driftkv::g_seconds = std::atoi(argv[2]);
  if (argc > 3) driftkv::g_workers = std::atoi(argv[3]);
  if (const char* env = std::getenv("SOAK_SECONDS")) driftkv::g_seconds = std::atoi(env);  // e.g. the ASan run
  return RUN_ALL_TESTS();
}
