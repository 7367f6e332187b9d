// `driftkv bench`: concurrent sequences ingest a synthetic context, then
// decode steps; ingest rate, Attend rate and latency quantiles. With
// --servers a,b,c the sequences are spread over the replicas by rendezvous
// hashing of their ids (client/sharded_client.h), each sequence's thread
// talks to its owner, and the rates are the aggregate over the replicas.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/cli.h"
#include "client/sharded_client.h"
#include "wire/tensor.h"

ABSL_FLAG(int, sequences, 8, "bench: concurrent sequences (one client thread each)");
ABSL_FLAG(std::string, servers, "",
          "bench: replicas HOST:PORT,HOST:PORT,... (overrides --server); sequences are spread by "
          "rendezvous hashing of their ids and the throughput is the aggregate");

namespace driftkv {
namespace cli {

int Bench(Client& client) {
  std::vector<std::string> replicas = SplitReplicas(absl::GetFlag(FLAGS_servers));
  if (replicas.empty()) replicas.push_back(client.options().target);
  ShardedClient sharded(replicas, client.options());
  absl::StatusOr<v1::InfoResponse> info = absl::UnknownError("no replica");
  for (absl::StatusOr<v1::InfoResponse>& i : sharded.InfoAll()) {
    if (!i.ok()) return Fail(i.status());
    if (info.ok() &&
        (i->layers() != info->layers() || i->kv_heads() != info->kv_heads() || i->head_dim() != info->head_dim())) {
      return Fail(absl::FailedPreconditionError("the replicas serve different model shapes"));
    }
    if (!info.ok()) info = *i;
  }
  const int layers = info->layers(), kv_heads = info->kv_heads(), d = info->head_dim();
  const size_t n = static_cast<size_t>(kv_heads) * d;
  const int q_heads = absl::GetFlag(FLAGS_q_heads) > 0 ? absl::GetFlag(FLAGS_q_heads) : 2 * kv_heads;
  const int seqs = absl::GetFlag(FLAGS_sequences), tokens = absl::GetFlag(FLAGS_tokens);
  const int steps = absl::GetFlag(FLAGS_steps), chunk = absl::GetFlag(FLAGS_chunk_tokens);
  // One synthetic context per layer, shared by all sequences (the server
  // encodes each sequence's copy anyway).
  std::vector<std::vector<float>> keys(layers), values(layers);
  for (int l = 0; l < layers; ++l) {
    SyntheticLayer(tokens + steps, kv_heads, d, absl::GetFlag(FLAGS_seed) * 1000 + l, &keys[l], &values[l]);
  }
  std::vector<v1::AppendChunk> chunks;  // layer-interleaved, as a prefill produces them
  for (int t = 0; t < tokens; t += chunk) {
    for (int l = 0; l < layers; ++l) {
      const int c = std::min(chunk, tokens - t);
      chunks.push_back(MakeChunk("", l, t, c, keys[l].data() + t * n, values[l].data() + t * n, n, v1::DTYPE_BF16));
      // The bench-N ids of an earlier run may be tombstoned (released).
      chunks.back().set_new_incarnation(t == 0);
    }
  }
  const std::vector<float> q = SyntheticQuery(keys[0], tokens, kv_heads, d, q_heads, 7);
  std::printf(
      "bench: %d sequences x %d layers x %d tokens (kv_heads %d, head_dim %d, bf16; %d-token chunks, %d "
      "concurrent Append calls per sequence), then %d decode steps of %d items (one per layer, q_heads %d), "
      "server %s\n",
      seqs, layers, tokens, kv_heads, d, chunk, absl::GetFlag(FLAGS_streams), steps, layers, q_heads,
      absl::StrJoin(replicas, ",").c_str());

  std::atomic<int> failures{0};
  std::atomic<int64_t> ingested{0};
  Progress progress("ingest", static_cast<int64_t>(seqs) * chunks.size());
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<int> owner(seqs), per_replica(replicas.size());
  for (int s = 0; s < seqs; ++s) {
    owner[s] = sharded.ReplicaOf(absl::StrCat("bench-", s));
    ++per_replica[owner[s]];
    ClientOptions o = client.options();
    o.target = replicas[owner[s]];  // every call of the sequence goes to its owner
    clients.push_back(std::make_unique<Client>(o));
  }
  if (replicas.size() > 1) {
    std::printf("sequences per replica:");
    for (size_t r = 0; r < replicas.size(); ++r) std::printf(" %s %d", replicas[r].c_str(), per_replica[r]);
    std::printf("\n");
  }
  for (int s = 0; s < seqs; ++s) {
    threads.emplace_back([&, s] {
      std::vector<v1::AppendChunk> mine = chunks;
      for (v1::AppendChunk& c : mine) c.set_sequence_id(absl::StrCat("bench-", s));
      // Several Append calls of 4 layers' worth, so progress can move.
      const size_t per_call = static_cast<size_t>(layers) * 4;
      for (size_t i = 0; i < mine.size(); i += per_call) {
        const size_t m = std::min(per_call, mine.size() - i);
        absl::StatusOr<v1::AppendResponse> r =
            clients[s]->AppendConcurrently(absl::MakeConstSpan(mine).subspan(i, m), absl::GetFlag(FLAGS_streams));
        if (!r.ok()) {
          if (failures++ == 0) std::cerr << "\nappend: " << r.status() << "\n";
          return;
        }
        progress.Update(ingested += m);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double ingest_s = SecondsSince(t0);
  progress.Done();
  threads.clear();
  if (failures > 0) return 1;
  const double raw_bytes = 2.0 * seqs * layers * tokens * n * 2;  // keys + values, bf16

  std::vector<std::vector<double>> latency(seqs);
  std::atomic<int64_t> done_steps{0};
  Progress decode("decode", static_cast<int64_t>(seqs) * steps);
  t0 = Clock::now();
  for (int s = 0; s < seqs; ++s) {
    threads.emplace_back([&, s] {
      const std::string seq = absl::StrCat("bench-", s);
      for (int step = 0; step < steps; ++step) {
        v1::AttendRequest req;
        const int pos = tokens + step;
        for (int l = 0; l < layers; ++l) {
          *req.add_items() = StepItem(seq, l, keys[l].data() + pos * n, values[l].data() + pos * n, n, pos, q, q_heads);
        }
        const auto a = Clock::now();
        absl::StatusOr<v1::AttendResponse> r = clients[s]->Attend(req);
        latency[s].push_back(SecondsSince(a));
        if (!r.ok()) {
          if (failures++ == 0) std::cerr << "\nattend: " << r.status() << "\n";
          return;
        }
        decode.Update(++done_steps);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double decode_s = SecondsSince(t0);
  decode.Done();
  if (failures > 0) return 1;
  std::vector<double> all;
  for (auto& v : latency) all.insert(all.end(), v.begin(), v.end());
  const double calls = static_cast<double>(all.size());
  const double avg_ctx = tokens + (steps + 1) / 2.0;
  // Pool usage summed over the replicas.
  absl::StatusOr<v1::StatsResponse> stats = v1::StatsResponse();
  for (absl::StatusOr<v1::StatsResponse>& r : sharded.StatsAll()) {
    if (!r.ok()) {
      stats = r.status();
      break;
    }
    stats->set_pages_in_use(stats->pages_in_use() + r->pages_in_use());
    stats->set_bytes_in_use(stats->bytes_in_use() + r->bytes_in_use());
    stats->set_tokens_compressed(stats->tokens_compressed() + r->tokens_compressed());
    stats->set_tokens_window(stats->tokens_window() + r->tokens_window());
  }
  for (int s = 0; s < seqs; ++s) (void)clients[s]->Release(absl::StrCat("bench-", s));
  if (replicas.size() > 1) std::printf("aggregate over %zu replicas:\n", replicas.size());
  std::printf("ingest: %.3f s, %.3f GB/s raw (bf16 keys+values), %.0f tokens/s (all %d layers), %.0f token-layers/s\n",
              ingest_s, raw_bytes / ingest_s / 1e9, seqs * static_cast<double>(tokens) / ingest_s, layers,
              seqs * static_cast<double>(tokens) * layers / ingest_s);
  std::printf("attend: %.0f calls in %.3f s, %.1f calls/s, %.1f items/s, %.3g attended tokens/s (context ~%.0f)\n",
              calls, decode_s, calls / decode_s, calls * layers / decode_s, calls * layers * avg_ctx / decode_s,
              avg_ctx);
  const double p50 = Quantile(&all, 0.50) * 1e3, p99 = Quantile(&all, 0.99) * 1e3;
  std::printf("attend latency per call (%d items): p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", layers, p50, p99,
              all.empty() ? 0.0 : all.back() * 1e3);
  if (stats.ok()) {
    std::printf("pool after decode: %llu pages in use (%.1f MB), %llu tokens compressed, %llu in bf16 windows\n",
                static_cast<unsigned long long>(stats->pages_in_use()), stats->bytes_in_use() / 1e6,
                static_cast<unsigned long long>(stats->tokens_compressed()),
                static_cast<unsigned long long>(stats->tokens_window()));
  }
  return 0;
}

}  // namespace cli
}  // namespace driftkv
