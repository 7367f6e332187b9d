// The hot tier through the service on the CPU backend, against the cold
// tier, side by side in one process and one run (docs/hot_tier.md,
// "Service"). Three in-process driftkv servers on the CPU backend: hot tier
// off, on with synchronous promotion, on with asynchronous promotion; one
// layer, 8 KV heads x 128, GQA 32/8, the default 128-token bf16 window,
// `--tokens` tokens per sequence (1024: 7 pages + 128 window tokens),
// synthetic "llm" keys and values (eval/synthetic_kv.h) sent as bf16.
//   1. steady state: Attend of one item, p50 / p99 of --reps calls, through
//      the Handler (no network) and over gRPC on loopback (driftkv::Client),
//      the servers' calls interleaved; hot answers are checked bit for bit
//      against cold ones;
//   2. the first Attend of a sequence (--first fresh sequences): cold; sync
//      (promotes, then attends the level pages); async (attends cold and
//      queues the promotion), the async server's second call right after,
//      and its call once the promotion has run; and the promotion time
//      (driftkv_tier_promotion_seconds).
//   bazel run -c opt //bench/cpu:hot_tier_service_bench -- [--tokens=1024] [--reps=200] [--first=8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "eval/synthetic_kv.h"
#include "service/server.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kQHeads = 32;

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

struct Bench {
  std::unique_ptr<DriftkvServer> server;
  std::unique_ptr<Client> client;
  const char* name;
};

Bench Start(const char* name, uint64_t hot_bytes, HotPromotion mode) {
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.layers = 1;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.pool_bytes = 256ull << 20;
  o.hot_tier_bytes = hot_bytes;
  o.hot_promotion = mode;
  ServerHooks hooks;
  hooks.start_reaper = false;
  absl::StatusOr<std::unique_ptr<DriftkvServer>> s = DriftkvServer::Start(o, std::move(hooks));
  Check(s.status(), "start");
  Bench b;
  b.server = *std::move(s);
  ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", b.server->port());
  b.client = std::make_unique<Client>(co);
  b.name = name;
  return b;
}

void Push(Bench& b, const std::string& seq, const SynthKv& kv, int tokens) {
  v1::AppendResponse r;
  for (int t = 0; t < tokens; t += 256) {
    const int c = std::min(256, tokens - t);
    v1::AppendChunk chunk = MakeChunk(seq, 0, t, c, kv.keys.data() + static_cast<size_t>(t) * kN,
                                      kv.values.data() + static_cast<size_t>(t) * kN, kN, v1::DTYPE_BF16);
    Check(b.server->handler().Append(chunk, &r), "append");
  }
}

v1::AttendRequest Request(const std::string& seq, const std::vector<float>& q) {
  v1::AttendRequest req;
  v1::AttendItem* it = req.add_items();
  it->set_sequence_id(seq);
  it->set_layer(0);
  it->set_dtype(v1::DTYPE_F32);
  it->set_q_heads(kQHeads);
  FloatToTensor(q.data(), q.size(), v1::DTYPE_F32, it->mutable_query());
  return req;
}

// One Attend through the Handler: seconds, and the answer's bytes.
double TimeHandler(Bench& b, const v1::AttendRequest& req, std::string* answer = nullptr) {
  v1::AttendResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  Check(b.server->handler().Attend(req, &resp), "attend");
  const auto t1 = std::chrono::steady_clock::now();
  if (answer != nullptr) {
    *answer = resp.results(0).output() +
              std::string(reinterpret_cast<const char*>(resp.results(0).lse().data()), kQHeads * sizeof(float));
  }
  return Seconds(t0, t1);
}

double TimeGrpc(Bench& b, const v1::AttendRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<v1::AttendResponse> r = b.client->Attend(req);
  const auto t1 = std::chrono::steady_clock::now();
  Check(r.status(), "grpc attend");
  return Seconds(t0, t1);
}

int Flag(int argc, char** argv, const char* name, int def) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    int v = 0;
    if (std::string(argv[i]).rfind(prefix, 0) == 0 && absl::SimpleAtoi(argv[i] + prefix.size(), &v)) return v;
  }
  return def;
}

int Main(int argc, char** argv) {
  const int tokens = Flag(argc, argv, "tokens", 1024), reps = Flag(argc, argv, "reps", 200),
            first = Flag(argc, argv, "first", 8);
  const uint64_t hot_bytes = 64ull << 20;
  Bench off = Start("off", 0, HotPromotion::kSync);
  Bench sync = Start("sync", hot_bytes, HotPromotion::kSync);
  Bench async = Start("async", hot_bytes, HotPromotion::kAsync);
  std::printf(
      "CPU backend, %d backend threads (hardware), 1 layer x %d tokens, %d KV heads x %d, %d query heads, "
      "window %d; pool 256 MiB cold, hot tier %llu MiB\n",
      std::min(16u, std::max(1u, std::thread::hardware_concurrency())), tokens, kKvHeads, kD, kQHeads,
      kDefaultWindowTokens, static_cast<unsigned long long>(hot_bytes >> 20));

  // 1. Steady state.
  const SynthKv kv = SynthLayer(tokens, kKvHeads, kD, 1);
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(kQHeads) * kD);
  for (float& x : q) x = g(rng);
  const v1::AttendRequest req = Request("s", q);
  for (Bench* b : {&off, &sync, &async}) Push(*b, "s", kv, tokens);
  std::string cold_answer, sync_answer, async_answer;
  TimeHandler(off, req, &cold_answer);
  TimeHandler(sync, req, &sync_answer);
  TimeHandler(async, req);
  async.server->handler().DrainPromotions();
  TimeHandler(async, req, &async_answer);
  const bool same = sync_answer == cold_answer && async_answer == cold_answer;
  std::vector<double> h_off, h_hot, g_off, g_hot;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      h_off.push_back(TimeHandler(off, req));
      h_hot.push_back(TimeHandler(sync, req));
    } else {
      h_hot.push_back(TimeHandler(sync, req));
      h_off.push_back(TimeHandler(off, req));
    }
  }
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      g_off.push_back(TimeGrpc(off, req));
      g_hot.push_back(TimeGrpc(sync, req));
    } else {
      g_hot.push_back(TimeGrpc(sync, req));
      g_off.push_back(TimeGrpc(off, req));
    }
  }
  std::printf("\n1. Attend of one item, %d calls each, interleaved; hot answers %s the cold ones bit for bit\n", reps,
              same ? "EQUAL" : "DIFFER FROM");
  std::printf(
      "| path | cold p50 ms | cold p99 ms | hot p50 ms | hot p99 ms | cold / hot (p50) "
      "|\n|---|---:|---:|---:|---:|---:|\n");
  std::printf("| Handler | %.3f | %.3f | %.3f | %.3f | **%.2fx** |\n", 1e3 * Quantile(h_off, 0.5),
              1e3 * Quantile(h_off, 0.99), 1e3 * Quantile(h_hot, 0.5), 1e3 * Quantile(h_hot, 0.99),
              Quantile(h_off, 0.5) / Quantile(h_hot, 0.5));
  std::printf("| gRPC loopback | %.3f | %.3f | %.3f | %.3f | **%.2fx** |\n", 1e3 * Quantile(g_off, 0.5),
              1e3 * Quantile(g_off, 0.99), 1e3 * Quantile(g_hot, 0.5), 1e3 * Quantile(g_hot, 0.99),
              Quantile(g_off, 0.5) / Quantile(g_hot, 0.5));

  // 2. First Attend of fresh sequences.
  std::vector<double> f_off, f_sync, f_async, f_async2, f_async_drained, f_sync2;
  for (int i = 0; i < first; ++i) {
    const std::string id = absl::StrCat("f", i);
    const SynthKv fkv = SynthLayer(tokens, kKvHeads, kD, 100 + i);
    const v1::AttendRequest freq = Request(id, q);
    for (Bench* b : {&off, &sync, &async}) Push(*b, id, fkv, tokens);
    f_off.push_back(TimeHandler(off, freq));
    f_sync.push_back(TimeHandler(sync, freq));
    f_sync2.push_back(TimeHandler(sync, freq));
    f_async.push_back(TimeHandler(async, freq));
    f_async2.push_back(TimeHandler(async, freq));
    async.server->handler().DrainPromotions();
    f_async_drained.push_back(TimeHandler(async, freq));
    for (Bench* b : {&off, &sync, &async}) {
      v1::ReleaseRequest rel;
      rel.set_sequence_id(id);
      v1::ReleaseResponse rr;
      Check(b->server->handler().Release(rel, &rr), "release");
    }
  }
  auto promotion_ms = [](Bench& b) {
    const prometheus::ClientMetric m = b.server->metrics().tier_promotion_seconds->Collect();
    return m.histogram.sample_count == 0 ? 0.0 : 1e3 * m.histogram.sample_sum / m.histogram.sample_count;
  };
  std::printf("\n2. First Attend of a fresh sequence (Handler), median of %d sequences\n", first);
  std::printf(
      "| server | 1st call ms | 2nd call ms | after the promotion ms | mean promotion ms (metric) "
      "|\n|---|---:|---:|---:|---:|\n");
  std::printf("| hot tier off | %.3f | | | |\n", 1e3 * Quantile(f_off, 0.5));
  std::printf("| sync | %.3f | %.3f | %.3f | %.3f |\n", 1e3 * Quantile(f_sync, 0.5), 1e3 * Quantile(f_sync2, 0.5),
              1e3 * Quantile(f_sync2, 0.5), promotion_ms(sync));
  std::printf("| async | %.3f | %.3f | %.3f | %.3f |\n", 1e3 * Quantile(f_async, 0.5), 1e3 * Quantile(f_async2, 0.5),
              1e3 * Quantile(f_async_drained, 0.5), promotion_ms(async));
  for (Bench* b : {&off, &sync, &async}) {
    b->client.reset();
    b->server->Shutdown(absl::ZeroDuration());
  }
  return same ? 0 : 1;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
