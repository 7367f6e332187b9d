// The hot tier through the service on the GPU, against the cold tier, in
// one process and one run: two in-process driftkv servers on the CUDA
// backend (hot tier off / on), the same prefill (one layer of S sequences x
// T tokens, 8 KV heads x 128, GQA 32/8, default window), then
//   1. latency of an Attend of all S items over gRPC on loopback (p50, p99
//      of --reps calls), of the same request through the Handler without
//      gRPC, and of the attention kernel alone on S x T synthetic pages of
//      the same tier (kernels/, CUDA events): the service's cost on top.
//      The cold tier's "kernel" is the backend's way with its default
//      scratch: promotion into level pages and the level kernel; the fused
//      cold kernel alone is printed below the table;
//   2. batch invariance: each item alone, inside the S-item request, and
//      under --clients concurrent clients sending shuffled subsets; every
//      answer must equal the item's lone answer bit for bit;
//   3. the first Attend of the hot server, which promotes every layer
//      (synchronous promotion), against a later one.
//
//   4. with --prefetch=1, each sequence's Prefetch before that first Attend
//      (the hot server promotes there instead);
//   5. with --prefetch_layers=L alone: a hot server of L layers, each
//      sequence's Prefetch (every layer promoted together), then an Attend
//      of every layer of every sequence.
//
//   service_hot_bench [--sequences=64] [--context=8192] [--reps=30] [--clients=8]
//                     [--prefetch=0|1] [--prefetch_layers=L] [--lookahead_bytes=N]
//                     [--warm_channel=0|1]
//   --lookahead_bytes: the client channel's HTTP/2 window
//   (grpc.http2.lookahead_bytes; 0: gRPC's default, grown by its BDP probe)
//   --warm_channel=1: before the first Attend, one Attend of the same size
//   whose items all name one more sequence (prefilled like the others), so
//   that the first Attend's answer arrives on a channel that has carried
//   one: a fresh channel's receive window starts small and grows only with
//   the answers it carries, which a decode worker's channel has done
//   before its sequences turn hot. Only that sequence is promoted by it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/check.h"
#include "client/client.h"
#include "codec/dquant_codec.h"
#include "codec/level_page.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/level_attention.h"
#include "kernels/level_promote.h"
#include "kernels/testing/device_buffer.h"
#include "service/process_env.h"
#include "service/server.h"
#include "wire/half.h"

namespace driftkv {
namespace {

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kQHeads = 32;

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

struct Quantiles {
  double p50, p99;
};
Quantiles Of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

ServiceOptions Options(int sequences, int context, bool hot) {
  ServiceOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "";
  o.backend = "cuda";
  o.layers = 1;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  const uint64_t pages = static_cast<uint64_t>(sequences) * (context / 128 + 1);
  o.pool_bytes = pages * 80000 + (64ull << 20);
  o.max_sequences = sequences + 8;
  o.max_batch = std::max(o.max_batch, sequences);
  if (hot) {
    o.hot_tier_bytes = pages * 100000 + (64ull << 20);
    o.hot_idle_seconds = 0;  // never demote for idling during the run
  }
  return o;
}

std::string SeqId(int s) {
  return absl::StrCat("seq", s);
}

v1::AttendItem Item(int s, const std::vector<float>& query) {
  v1::AttendItem it;
  it.set_sequence_id(SeqId(s));
  it.set_layer(0);
  it.set_dtype(v1::DTYPE_F32);
  it.set_q_heads(kQHeads);
  it.set_query(std::string(reinterpret_cast<const char*>(query.data()) + static_cast<size_t>(s) * kQHeads * kD * 4,
                           static_cast<size_t>(kQHeads) * kD * 4));
  return it;
}

// The attention kernel alone on `sequences` x `context` tokens of synthetic
// pages of one tier (decode work does not depend on the bytes), same
// window and query shape as the service: CUDA-event median. With spread
// > 1 the pages lie `spread` pages apart in a pool that many times larger
// (as a layer's pages lie among other layers' in the service's pool).
// With cycle > 1 there are `cycle` copies of the pages (layers), each
// packed, and launch i reads copy i % cycle: a decode step's Attends read
// one layer after another, never the same pages twice in a row.
// With varied set, the queries and windows are random normal and the pages
// 16 distinct encoded windows (otherwise every page is the same window and
// queries and windows are constants). With separate_windows, keys and
// values of the window are two buffers (the service's device window cache
// has two; otherwise one buffer serves both). *merge_ms, when given, gets
// the median of the hot merge launch alone. With cold_levels (cold pages),
// the CUDA backend's way with its default scratch: the pages promoted into
// a scratch pool of level pages, then the level kernel (cold_levels.h);
// otherwise the fused cold kernel.
double KernelMs(const DQuantCodec& codec, int sequences, int context, int window, bool hot, int reps, int spread = 1,
                bool varied = false, int cycle = 1, bool separate_windows = false, double* merge_ms = nullptr,
                bool cold_levels = true) {
  const int comp = context - window, pages = (comp + 127) / 128;
  const PageLayout cl = codec.page_layout();
  absl::StatusOr<LevelPageLayout> hl = MakeLevelPageLayout(codec);
  CHECK_OK(hl.status());
  const size_t page_bytes = hot ? hl->page_bytes : cl.page_bytes;
  const size_t total = static_cast<size_t>(sequences) * pages;
  gpu::DeviceBuffer pool(total * spread * cycle * page_bytes);
  // Pages of real records, so that the cold kernel's rANS decodes valid
  // streams: encode windows and replicate them.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  {
    const int distinct = varied ? 16 : 1;
    for (int d = 0; d < distinct; ++d) {
      std::vector<float> k(128 * kN), v(k.size());
      for (float& x : k) x = g(rng);
      for (float& x : v) x = g(rng);
      std::vector<uint8_t> cold(cl.page_bytes, 0), page(page_bytes, 0);
      CodecScratch scratch;
      StreamStats ks, vs;
      CHECK_OK(codec.EncodeWindow(k.data(), v.data(), 128, cold.data(), cold.data() + cl.value_offset,
                                  cold.data() + cl.mean_offset, &scratch, &ks, &vs));
      if (hot) {
        CHECK_OK(PromotePage(codec, *hl, cold.data(), cold.data() + cl.value_offset, cold.data() + cl.mean_offset, 128,
                             page.data()));
      } else {
        page = cold;
      }
      for (size_t i = d; i < total; i += distinct) {
        cudaMemcpy(pool.get<uint8_t>() + i * spread * page_bytes, page.data(), page_bytes, cudaMemcpyHostToDevice);
      }
    }
  }
  for (int c = 1; c < cycle; ++c) {
    cudaMemcpy(pool.get<uint8_t>() + c * total * spread * page_bytes, pool.get<uint8_t>(), total * spread * page_bytes,
               cudaMemcpyDeviceToDevice);
  }
  std::vector<int32_t> table(total * cycle), start(sequences), tokens(sequences, comp), wt(sequences, window);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i * spread);
  for (int i = 0; i < sequences; ++i) start[i] = i * pages;
  std::vector<uint16_t> w(static_cast<size_t>(sequences) * gpu::kMaxWindow * kN, FloatToBf16(0.5f));
  std::vector<float> q(static_cast<size_t>(sequences) * kQHeads * kD, 0.25f);
  if (varied) {
    for (uint16_t& x : w) x = FloatToBf16(g(rng));
    for (float& x : q) x = g(rng);
  }
  gpu::DeviceBuffer dt, ds, dtok, dw, dwv, dwt, dq, out, lse, ws, tabs;
  dt.Upload(table);
  ds.Upload(start);
  dtok.Upload(tokens);
  dw.Upload(w);
  if (separate_windows) {
    for (uint16_t& x : w) x = FloatToBf16(g(rng));
    dwv.Upload(w);
  }
  dwt.Upload(wt);
  dq.Upload(q);
  out.Resize(q.size() * 4);
  lse.Resize(static_cast<size_t>(sequences) * kQHeads * 4);
  ws.Resize(gpu::AttentionWorkspaceBytes(sequences, kQHeads, kD, pages));
  std::vector<uint32_t> t(512);
  gpu::PackDecodeTable(codec.key_codec().table(), t.data());
  gpu::PackDecodeTable(codec.value_codec().table(), t.data() + 256);
  tabs.Upload(t);
  gpu::AttentionBatch batch;
  batch.items = sequences;
  batch.q_heads = kQHeads;
  batch.max_pages = pages;
  batch.page_table_dev = dt.get<int32_t>();
  batch.page_start_dev = ds.get<int32_t>();
  batch.tokens_dev = dtok.get<int32_t>();
  batch.window_k_dev = dw.get<uint16_t>();
  batch.window_v_dev = separate_windows ? dwv.get<uint16_t>() : dw.get<uint16_t>();
  batch.window_tokens_dev = dwt.get<int32_t>();
  batch.query_dev = dq.get<float>();
  batch.softmax_scale = 1.0f / std::sqrt(128.0f);
  batch.out_dev = out.get<float>();
  batch.lse_dev = lse.get<float>();
  batch.workspace_dev = ws.get<void>();
  cudaEvent_t split = nullptr;  // between the split kernel and the merge
  if (merge_ms != nullptr && hot) cudaEventCreate(&split);
  // The service's way: merge counters, so the launcher picks where the
  // window and the merge run (LevelMerge::kAuto); timing the merge apart
  // (split_done) needs them in a second launch.
  gpu::DeviceBuffer counters;
  if (hot || cold_levels) counters.Upload(std::vector<uint32_t>(static_cast<size_t>(sequences) * hl->kv_heads, 0u));
  // The cold way through level pages: a scratch of `total` level pages,
  // the promotion's ids (the scratch's 0, 1, ...), full pages' tokens and
  // rANS tables as kernels/level_promote.h takes them.
  gpu::DeviceBuffer scratch, scratch_table, full_tokens, raw_tables;
  if (!hot && cold_levels) {
    scratch.Resize(total * hl->page_bytes);
    std::vector<int32_t> iota(total);
    for (size_t i = 0; i < total; ++i) iota[i] = static_cast<int32_t>(i);
    scratch_table.Upload(iota);
    full_tokens.Upload(std::vector<int32_t>(total, 128));
    raw_tables.Upload(gpu::PromoteDecodeTables(codec));
  }
  auto launch = [&] {
    if (!hot && cold_levels) {
      gpu::PromoteParams pp;
      pp.cold_pool_dev = pool.get<uint8_t>();
      pp.cold = cl;
      pp.hot_pool_dev = scratch.get<uint8_t>();
      pp.hot = *hl;
      gpu::SetPromoteCodec(codec, raw_tables.get<uint32_t>(), &pp);
      pp.pages = static_cast<int>(total);
      pp.cold_pages_dev = batch.page_table_dev;
      pp.hot_pages_dev = scratch_table.get<int32_t>();
      pp.tokens_dev = full_tokens.get<int32_t>();
      CHECK_OK(gpu::LaunchPromote(pp, nullptr));
      gpu::LevelAttentionParams p;
      p.batch = batch;
      p.batch.page_table_dev = scratch_table.get<int32_t>();
      p.pool_dev = scratch.get<uint8_t>();
      p.layout = *hl;
      p.merge_counters_dev = counters.get<uint32_t>();
      CHECK_OK(gpu::LaunchLevelAttention(p, nullptr));
    } else if (hot) {
      gpu::LevelAttentionParams p;
      p.batch = batch;
      p.pool_dev = pool.get<uint8_t>();
      p.layout = *hl;
      p.split_done = split;
      if (split == nullptr) p.merge_counters_dev = counters.get<uint32_t>();
      CHECK_OK(gpu::LaunchLevelAttention(p, nullptr));
    } else {
      gpu::DQuantAttentionParams p;
      p.batch = batch;
      p.pool_dev = pool.get<uint8_t>();
      p.layout = cl;
      p.tables_dev = tabs.get<uint32_t>();
      CHECK_OK(gpu::LaunchDQuantAttention(p, nullptr));
    }
  };
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  int next = 0;
  auto next_layer = [&] {
    batch.page_table_dev = dt.get<int32_t>() + static_cast<size_t>(next) * total;
    next = (next + 1) % cycle;
  };
  for (int i = 0; i < 5; ++i) {
    next_layer();
    launch();
  }
  std::vector<double> times, merges;
  for (int i = 0; i < reps; ++i) {
    next_layer();
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    times.push_back(ms);
    if (split != nullptr) {
      cudaEventElapsedTime(&ms, split, b);
      merges.push_back(ms);
    }
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (split != nullptr) {
    cudaEventDestroy(split);
    *merge_ms = Of(merges).p50;
  }
  return Of(times).p50;
}

// Sums of the server's Attend phase histograms and of its promotion
// histogram, by label: the difference around one call is its breakdown.
absl::btree_map<std::string, double> PhaseSums(Metrics& metrics) {
  absl::btree_map<std::string, double> sums;
  for (const prometheus::MetricFamily& f : metrics.registry()->Collect()) {
    const bool phases = f.name == "driftkv_attend_phase_seconds";
    const bool backend = f.name == "driftkv_tier_promotion_backend_seconds";
    if (!phases && !backend && f.name != "driftkv_tier_promotion_seconds") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string label = backend ? "promotion_backend" : "promotion";
      for (const prometheus::ClientMetric::Label& l : m.label)
        if (l.name == "phase") label = l.value;
      sums[label] += m.histogram.sample_sum;
    }
  }
  return sums;
}

std::string Breakdown(const absl::btree_map<std::string, double>& before,
                      const absl::btree_map<std::string, double>& after) {
  std::string out;
  for (const auto& [label, sum] : after) {
    const auto it = before.find(label);
    const double ms = 1e3 * (sum - (it == before.end() ? 0.0 : it->second));
    if (ms >= 0.01) absl::StrAppend(&out, " ", label, "=", absl::StrFormat("%.2f", ms));
  }
  return out;
}

// Random bf16 keys/values in 512-token chunks: `sequences` x `context`
// tokens in each of `layers` layers.
void Prefill(Client& client, int sequences, int context, int layers) {
  constexpr int kChunk = 512;
  std::vector<uint16_t> k(static_cast<size_t>(kChunk) * kN), v(k.size());
  for (int s = 0; s < sequences; ++s) {
    for (int layer = 0; layer < layers; ++layer) {
      std::vector<v1::AppendChunk> chunks;
      for (int first = 0; first < context; first += kChunk) {
        const int count = std::min(kChunk, context - first);
        std::mt19937_64 crng(static_cast<uint64_t>(s) * 1000003 + first + 7919 * layer);
        std::normal_distribution<float> cg(0.0f, 1.0f);
        for (size_t i = 0; i < static_cast<size_t>(count) * kN; ++i) {
          k[i] = FloatToBf16(cg(crng) + 0.5f * static_cast<float>(i % 7));
          v[i] = FloatToBf16(cg(crng));
        }
        v1::AppendChunk c;
        c.set_sequence_id(SeqId(s));
        c.set_layer(layer);
        c.set_first_token(first);
        c.set_token_count(count);
        c.set_dtype(v1::DTYPE_BF16);
        c.set_keys(std::string(reinterpret_cast<const char*>(k.data()), static_cast<size_t>(count) * kN * 2));
        c.set_values(std::string(reinterpret_cast<const char*>(v.data()), static_cast<size_t>(count) * kN * 2));
        chunks.push_back(std::move(c));
      }
      CHECK_OK(client.Append(chunks).status());
    }
  }
}

struct TierResult {
  std::vector<std::string> alone;  // each item's lone answer: output then lse bytes
  Quantiles rpc, handler;
  double kernel_ms = 0, first_ms = 0, later_ms = 0;
  double fused_ms = 0;  // cold: the fused cold kernel alone
  int checked = 0, mismatches = 0;
};

// One Prefetch per sequence, in turn: their times (ms) and the layers
// they promoted.
std::string PrefetchAll(Client& client, Metrics& metrics, int sequences) {
  std::vector<double> ms;
  uint64_t promoted = 0;
  double total = 0;
  const double promotion_before = PhaseSums(metrics)["promotion"];
  for (int s = 0; s < sequences; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<v1::PrefetchResponse> p = client.Prefetch(SeqId(s));
    ms.push_back(Ms(std::chrono::steady_clock::now() - t0));
    CHECK_OK(p.status());
    promoted += p->layers_promoted();
    total += ms.back();
  }
  const Quantiles q = Of(ms);
  const double promotion_ms = 1e3 * (PhaseSums(metrics)["promotion"] - promotion_before);
  return absl::StrFormat(
      "%d Prefetch calls: %.2f ms in all, p50 %.3f ms, max %.3f ms, %d layers promoted, promotions %.2f ms in all",
      sequences, total, q.p50, *std::max_element(ms.begin(), ms.end()), promoted, promotion_ms);
}

int lookahead_bytes = 0;  // --lookahead_bytes
int warm_channel = 0;     // --warm_channel

TierResult RunTier(bool hot, int sequences, int context, int reps, int clients, bool prefetch) {
  TierResult r;
  const ServiceOptions options = Options(sequences + warm_channel, context, hot);
  auto server = DriftkvServer::Start(options);
  CHECK_OK(server.status());
  auto channel_args = grpc::ChannelArguments();
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  channel_args.SetMaxSendMessageSize(256 << 20);
  if (lookahead_bytes > 0) channel_args.SetInt("grpc.http2.lookahead_bytes", lookahead_bytes);
  ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", (*server)->port());
  co.timeout = absl::Seconds(600);
  Client client(grpc::CreateCustomChannel(co.target, grpc::InsecureChannelCredentials(), channel_args), co);

  Prefill(client, sequences + warm_channel, context, 1);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> query(static_cast<size_t>(sequences) * kQHeads * kD);
  for (float& x : query) x = g(rng);
  v1::AttendRequest all;
  for (int s = 0; s < sequences; ++s) *all.add_items() = Item(s, query);

  // First Attend (the hot server promotes every layer here), then later ones;
  // each one's time by the Handler's phases (ms).
  Metrics& metrics = (*server)->metrics();
  if (prefetch) std::printf("  [%s] %s\n", hot ? "hot" : "cold", PrefetchAll(client, metrics, sequences).c_str());
  if (warm_channel != 0) {
    v1::AttendRequest warm;
    for (int s = 0; s < sequences; ++s) {
      v1::AttendItem it = Item(s, query);
      it.set_sequence_id(SeqId(sequences));
      *warm.add_items() = std::move(it);
    }
    const auto w0 = std::chrono::steady_clock::now();
    CHECK_OK(client.Attend(warm).status());
    std::printf("  [%s] channel warmed by an Attend of %d items of one more sequence: %.2f ms\n", hot ? "hot" : "cold",
                sequences, Ms(std::chrono::steady_clock::now() - w0));
  }
  auto m0 = PhaseSums(metrics);
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(client.Attend(all).status());
  r.first_ms = Ms(std::chrono::steady_clock::now() - t0);
  auto m1 = PhaseSums(metrics);
  t0 = std::chrono::steady_clock::now();
  CHECK_OK(client.Attend(all).status());
  r.later_ms = Ms(std::chrono::steady_clock::now() - t0);
  auto m2 = PhaseSums(metrics);
  std::printf("  [%s] first Attend %.2f ms, phases ms:%s\n  [%s] second Attend %.2f ms, phases ms:%s\n",
              hot ? "hot" : "cold", r.first_ms, Breakdown(m0, m1).c_str(), hot ? "hot" : "cold", r.later_ms,
              Breakdown(m1, m2).c_str());

  // Latency over gRPC and through the Handler, alternating.
  std::vector<double> rpc, hnd;
  for (int i = 0; i < reps; ++i) {
    t0 = std::chrono::steady_clock::now();
    CHECK_OK(client.Attend(all).status());
    rpc.push_back(Ms(std::chrono::steady_clock::now() - t0));
    v1::AttendResponse resp;
    t0 = std::chrono::steady_clock::now();
    CHECK_OK((*server)->handler().Attend(all, &resp));
    hnd.push_back(Ms(std::chrono::steady_clock::now() - t0));
  }
  r.rpc = Of(rpc);
  r.handler = Of(hnd);

  // Batch invariance.
  std::vector<std::string> alone(sequences);
  for (int s = 0; s < sequences; ++s) {
    v1::AttendRequest one;
    *one.add_items() = Item(s, query);
    absl::StatusOr<v1::AttendResponse> a = client.Attend(one);
    CHECK_OK(a.status());
    alone[s] = a->results(0).output();
    for (float l : a->results(0).lse()) alone[s].append(reinterpret_cast<const char*>(&l), 4);
  }
  auto same = [&](int s, const v1::AttendResult& res) {
    std::string got = res.output();
    for (float l : res.lse()) got.append(reinterpret_cast<const char*>(&l), 4);
    return got == alone[s];
  };
  std::atomic<int> checked{0}, bad{0};
  {
    absl::StatusOr<v1::AttendResponse> a = client.Attend(all);
    CHECK_OK(a.status());
    for (int s = 0; s < sequences; ++s) {
      ++checked;
      if (!same(s, a->results(s))) ++bad;
    }
  }
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      Client cl(grpc::CreateCustomChannel(co.target, grpc::InsecureChannelCredentials(), channel_args), co);
      std::mt19937_64 crng(500 + c);
      for (int round = 0; round < 10; ++round) {
        std::vector<int> order(sequences);
        for (int s = 0; s < sequences; ++s) order[s] = s;
        std::shuffle(order.begin(), order.end(), crng);
        order.resize(1 + crng() % sequences);
        v1::AttendRequest req;
        for (int s : order) *req.add_items() = Item(s, query);
        absl::StatusOr<v1::AttendResponse> a = cl.Attend(req);
        CHECK_OK(a.status());
        for (size_t i = 0; i < order.size(); ++i) {
          ++checked;
          if (!same(order[i], a->results(i))) ++bad;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  r.checked = checked.load();
  r.mismatches = bad.load();
  r.alone = alone;
  v1::StatsResponse stats;
  (*server)->handler().Stats(&stats);
  std::printf("  [%s] Stats: %s\n", hot ? "hot" : "cold", stats.ShortDebugString().substr(0, 400).c_str());
  (*server)->Shutdown(absl::Seconds(1));
  server->reset();

  DQuantConfig cfg;
  cfg.kv_heads = kKvHeads;
  cfg.head_dim = kD;
  absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(cfg);
  CHECK_OK(codec.status());
  const int window = options.window_tokens + (context - options.window_tokens) % 128;
  r.kernel_ms = KernelMs(*codec, sequences, context, window, hot, reps);
  if (!hot) r.fused_ms = KernelMs(*codec, sequences, context, window, false, reps, 1, false, 1, false, nullptr, false);
  return r;
}

// A hot server of `layers` layers: each sequence's Prefetch (all its
// layers promoted together, its windows cached), then an Attend of every
// layer of every sequence, first and second.
void PrefetchLayers(int layers, int sequences, int context) {
  ServiceOptions o = Options(sequences * layers, context, true);
  o.layers = layers;
  o.max_sequences = sequences + 8;
  auto server = DriftkvServer::Start(o);
  CHECK_OK(server.status());
  ClientOptions co;
  co.target = absl::StrCat("127.0.0.1:", (*server)->port());
  co.timeout = absl::Seconds(600);
  auto channel_args = grpc::ChannelArguments();
  channel_args.SetMaxReceiveMessageSize(256 << 20);
  channel_args.SetMaxSendMessageSize(256 << 20);
  Client client(grpc::CreateCustomChannel(co.target, grpc::InsecureChannelCredentials(), channel_args), co);
  Prefill(client, sequences, context, layers);
  std::printf("  [%d layers x %d tokens] %s\n", layers, context,
              PrefetchAll(client, (*server)->metrics(), sequences).c_str());
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> query(static_cast<size_t>(sequences) * kQHeads * kD);
  for (float& x : query) x = g(rng);
  v1::AttendRequest all;
  for (int s = 0; s < sequences; ++s) {
    for (int l = 0; l < layers; ++l) {
      v1::AttendItem it = Item(s, query);
      it.set_layer(l);
      *all.add_items() = it;
    }
  }
  double ms[2];
  for (double& m : ms) {
    auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(client.Attend(all).status());
    m = Ms(std::chrono::steady_clock::now() - t0);
  }
  std::printf("  [%d layers x %d tokens] Attend of all %d items after Prefetch: first %.2f ms, second %.2f ms\n",
              layers, context, sequences * layers, ms[0], ms[1]);
  (*server)->Shutdown(absl::Seconds(1));
}

int Main(int argc, char** argv) {
  int sequences = 64, context = 8192, reps = 30, clients = 8, spread = 0, prefetch = 0, prefetch_layers = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--sequences=", 0) == 0)
      sequences = std::stoi(a.substr(12));
    else if (a.rfind("--context=", 0) == 0)
      context = std::stoi(a.substr(10));
    else if (a.rfind("--reps=", 0) == 0)
      reps = std::stoi(a.substr(7));
    else if (a.rfind("--clients=", 0) == 0)
      clients = std::stoi(a.substr(10));
    else if (a.rfind("--prefetch=", 0) == 0)
      prefetch = std::stoi(a.substr(11));
    else if (a.rfind("--prefetch_layers=", 0) == 0)
      prefetch_layers = std::stoi(a.substr(18));
    else if (a.rfind("--lookahead_bytes=", 0) == 0)
      lookahead_bytes = std::stoi(a.substr(18));
    else if (a.rfind("--warm_channel=", 0) == 0)
      warm_channel = std::stoi(a.substr(15)) != 0 ? 1 : 0;
    else if (a.rfind("--kernel_only_spread=", 0) == 0)
      spread = std::stoi(a.substr(21));
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (!gpu::GpuAvailable()) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  if (spread > 0) {
    // The hot kernel alone, pages packed and pages `spread` apart, three
    // rounds alternating.
    DQuantConfig cfg;
    cfg.kv_heads = kKvHeads;
    cfg.head_dim = kD;
    absl::StatusOr<DQuantCodec> codec = DQuantCodec::Create(cfg);
    CHECK_OK(codec.status());
    for (int round = 0; round < 3; ++round) {
      const double packed = KernelMs(*codec, sequences, context, 128, true, reps, 1);
      const double spread_ms = KernelMs(*codec, sequences, context, 128, true, reps, spread);
      const double varied = KernelMs(*codec, sequences, context, 128, true, reps, 1, true);
      const double cycled = KernelMs(*codec, sequences, context, 128, true, reps, 1, false, 8);
      std::printf(
          "hot kernel alone, %d x %d: pages packed %.3f ms, %d apart %.3f ms, varied data (random queries and "
          "windows, 16 distinct pages) %.3f ms, 8 layers in turn %.3f ms\n",
          sequences, context, packed, spread, spread_ms, varied, cycled);
      // As the service holds them: separate random key and value windows,
      // 128, then 146 tokens (the pages as for 128) (a decode benchmark's after its 18 prefill
      // steps), then 255 (the most a window holds); the merge alone beside.
      for (int w : {128, 146, 255}) {
        double merge = 0.0, merge_shared = 0.0;
        const double one =
            KernelMs(*codec, sequences, context - 128 + w, w, true, reps, 1, true, 1, false, &merge_shared);
        const double two = KernelMs(*codec, sequences, context - 128 + w, w, true, reps, 1, true, 1, true, &merge);
        std::printf(
            "  window %d tokens: one buffer for keys and values %.3f ms (merge %.3f), separate %.3f ms (merge "
            "%.3f)\n",
            w, one, merge_shared, two, merge);
      }
    }
    return 0;
  }
  std::printf("service on the GPU: 1 layer, %d sequences x %d tokens, 8 KV heads x 128, GQA 32/8, %d reps\n", sequences,
              context, reps);
  if (prefetch_layers > 0) {
    // Prefetch of `sequences` sequences of `prefetch_layers` layers alone.
    PrefetchLayers(prefetch_layers, sequences, context);
    return 0;
  }
  const TierResult cold = RunTier(false, sequences, context, reps, clients, prefetch != 0);
  const TierResult hot = RunTier(true, sequences, context, reps, clients, prefetch != 0);
  std::printf(
      "\n| tier | kernel ms | Handler p50 ms | gRPC p50 ms | gRPC p99 ms | gRPC p50 - kernel us | first Attend ms | "
      "second ms | invariance (bit-equal / checked) |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (int t = 0; t < 2; ++t) {
    const TierResult& r = t == 0 ? cold : hot;
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.0f | %.2f | %.2f | %d / %d |\n", t == 0 ? "cold" : "hot",
                r.kernel_ms, r.handler.p50, r.rpc.p50, r.rpc.p99, 1000.0 * (r.rpc.p50 - r.kernel_ms), r.first_ms,
                r.later_ms, r.checked - r.mismatches, r.checked);
  }
  std::printf("cold kernels alone: promotion and level kernel %.3f ms, fused cold kernel %.3f ms\n", cold.kernel_ms,
              cold.fused_ms);
  // The two tiers attend the same tokens (the same symbols): with the
  // backend's cold scratch both go through the level kernel, bit for bit
  // (max |diff| 0); with the fused cold kernel they agree to its rounding.
  double diff = 0.0, norm = 0.0;
  for (int s = 0; s < sequences; ++s) {
    const float* a = reinterpret_cast<const float*>(cold.alone[s].data());
    const float* b = reinterpret_cast<const float*>(hot.alone[s].data());
    for (size_t i = 0; i < static_cast<size_t>(kQHeads) * kD; ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
      norm = std::max(norm, static_cast<double>(std::fabs(a[i])));
    }
  }
  std::printf("\nhot vs cold answers: max |diff| %.3g, max |cold| %.3g (relative %.2g)\n", diff, norm, diff / norm);
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  driftkv::PrepareServerProcess();  // its servers run in this process, set up as driftkv-server's
  return driftkv::Main(argc, argv);
}
