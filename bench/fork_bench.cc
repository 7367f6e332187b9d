// The server-side time of a Fork (docs/prefix_cache.md): Handler::Fork of
// a long prefix, without a network. One source sequence of --context
// tokens on each of --layers layers (8 KV heads x 128, pages of 128
// tokens, window_tokens 128; real pages from the CPU backend, prefilled
// through Handler::Append with one thread per group of layers), then
// --reps forks of its first --tokens tokens, each timed around
// Handler::Fork alone and then released (not timed). --hot=1 promotes the
// source first, so that the forks share level pages of the hot tier.
// Prints the quantiles, and the pool's pages before and during a fork (a
// fork adds none).
//
//   fork_bench [--layers=32] [--context=8320] [--tokens=8192] [--reps=100]
//              [--hot=0] [--threads=8]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "codec/level_page.h"
#include "service/handler.h"
#include "wire/half.h"

namespace driftkv {
namespace {

using bench::IntFlag;

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kPageTokens = 128;

// Appends tokens [0, context) to `layers` of sequence "source", layer l
// on thread l % threads, in bf16 chunks of 1024 tokens of one random
// pattern (what the pages hold does not change what a fork does).
void Prefill(Handler& h, int layers, int context, int threads) {
  constexpr int kChunk = 1024;
  std::string kv(static_cast<size_t>(kChunk) * kN * 2, '\0');
  uint32_t s = 7;
  for (size_t i = 0; i < kv.size() / 2; ++i) {
    s = s * 1664525u + 1013904223u;
    const uint16_t b = FloatToBf16(static_cast<float>(static_cast<int32_t>(s >> 8) % 2000) / 1000.0f - 1.0f);
    kv[2 * i] = static_cast<char>(b & 0xff);
    kv[2 * i + 1] = static_cast<char>(b >> 8);
  }
  absl::Mutex mu;
  absl::Status first;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int l = t; l < layers; l += threads) {
        for (int at = 0; at < context; at += kChunk) {
          const int count = std::min(kChunk, context - at);
          v1::AppendChunk c;
          c.set_sequence_id("source");
          c.set_layer(l);
          c.set_first_token(at);
          c.set_token_count(count);
          c.set_dtype(v1::DTYPE_BF16);
          c.set_keys(kv.substr(0, static_cast<size_t>(count) * kN * 2));
          c.set_values(kv.substr(0, static_cast<size_t>(count) * kN * 2));
          v1::AppendResponse r;
          absl::Status st = h.Append(c, &r);
          if (!st.ok()) {
            absl::MutexLock lock(&mu);
            if (first.ok()) first = st;
            return;
          }
        }
      }
    });
  }
  for (std::thread& t : pool) t.join();
  CHECK_OK(first);
}

int Run(int argc, char** argv) {
  const int layers = IntFlag(argc, argv, "layers", 32);
  const int context = IntFlag(argc, argv, "context", 8192 + 128);
  const int tokens = IntFlag(argc, argv, "tokens", 8192);
  const int reps = IntFlag(argc, argv, "reps", 100);
  const bool hot = IntFlag(argc, argv, "hot", 0) != 0;
  const int threads = std::max(1, IntFlag(argc, argv, "threads", 8));

  ServiceOptions o;
  o.layers = layers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = 128;
  o.backend_threads = threads;
  const uint64_t pages = static_cast<uint64_t>(layers) * (context / kPageTokens + 1);
  o.pool_bytes = pages * 120000 + (64ull << 20);
  if (hot) o.hot_tier_bytes = (pages + 8) * MakeLevelPageLayout(kKvHeads, kD)->page_bytes;
  o.max_sequences = 8;
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  Handler& h = **made;

  const auto prefill_start = std::chrono::steady_clock::now();
  Prefill(h, layers, context, threads);
  const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();
  if (hot) {
    for (int l = 0; l < layers; ++l) {
      v1::AttendRequest a;
      v1::AttendItem* it = a.add_items();
      it->set_sequence_id("source");
      it->set_layer(l);
      it->set_q_heads(kKvHeads);
      it->set_dtype(v1::DTYPE_BF16);
      it->set_query(std::string(static_cast<size_t>(kKvHeads) * kD * 2, '\0'));
      v1::AttendResponse r;
      CHECK_OK(h.Attend(a, &r));  // promotes the layer (sync)
      if (!h.LayerIsHot("source", l)) CHECK_OK(absl::InternalError(absl::StrCat("layer ", l, " stayed cold")));
    }
  }
  const uint64_t cold_before = h.pool().pages_in_use();
  const uint64_t hot_before = h.hot_pool() != nullptr ? h.hot_pool()->pages_in_use() : 0;

  v1::ForkRequest req;
  req.set_source_sequence_id("source");
  req.set_sequence_id("fork");
  req.set_tokens(tokens);
  v1::ReleaseRequest rel;
  rel.set_sequence_id("fork");
  std::vector<double> us;
  uint64_t cold_during = 0, shared = 0;
  for (int i = 0; i < reps + 3; ++i) {  // the first 3 warm the allocator
    req.set_new_incarnation(true);      // the released id again
    v1::ForkResponse resp;
    const auto t = std::chrono::steady_clock::now();
    absl::Status st = h.Fork(req, &resp);
    const double elapsed = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
    CHECK_OK(st);
    cold_during = h.pool().pages_in_use();
    shared = resp.pages_shared();
    v1::ReleaseResponse rr;
    CHECK_OK(h.Release(rel, &rr));
    if (i >= 3) us.push_back(elapsed);
  }
  std::sort(us.begin(), us.end());
  const auto q = [&](double f) { return us[std::min(us.size() - 1, static_cast<size_t>(f * us.size()))]; };
  std::printf("fork of %d tokens x %d layers (%d KV heads x %d, pages of %d tokens), %s tier, %d forks\n", tokens,
              layers, kKvHeads, kD, kPageTokens, hot ? "hot" : "cold", reps);
  std::printf("prefill: %d tokens per layer in %.1f s; pages in use: cold %llu (during a fork %llu), hot %llu\n",
              context, prefill_s, static_cast<unsigned long long>(cold_before),
              static_cast<unsigned long long>(cold_during), static_cast<unsigned long long>(hot_before));
  std::printf("pages shared per fork: %llu\n", static_cast<unsigned long long>(shared));
  std::printf("Handler::Fork us: p50 %.1f, p90 %.1f, p99 %.1f, min %.1f, max %.1f\n", q(0.5), q(0.9), q(0.99),
              us.front(), us.back());
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Run(argc, argv);
}
