// Hit rate against pool budget on a trace with a Zipf popularity of
// prompts (docs/prefix_cache.md, "Hit rate against memory"): driftkv's
// prefix cache measured through Handler calls in process (CPU backend),
// against a bf16 store of the same bytes, simulated.
//
// TRACE. --prompts distinct prompts of --tokens tokens each (no prompt is
// a prefix of another); request i picks prompt k in [0, prompts) with
// probability proportional to 1 / (k + 1)^--zipf (std::mt19937_64 seeded
// with --seed), and adds a question of its own of window_tokens tokens.
// A request does what a client of the cache does: Lookup of the prompt's
// ids, Fork from the prefix held, Append of the rest of the prompt and the
// question with ids (every prompt page is sealed: the question fills the
// window), Release. Hit rate: prompt pages found by Lookup over prompt
// pages asked for, over the last 80% of the requests (the first 20% warm
// the cache), the same for both stores.
//
// THE BF16 STORE is not run, it is modelled: the same pages (--page_tokens
// tokens of one layer) at 4 x kv_heads x head_dim bytes per token (bf16
// keys and values), so budget / that many pages fit; the same LRU policy
// as driftkv's index (a page found or stored becomes the most recent; the
// least recent goes for room; a prompt is held up to its first missing
// page). driftkv's capacity is what its pool holds (page_stride bytes per
// page, all layers' pages in one pool) and its behaviour is measured.
//
//   zipf_hit_rate_bench [--prompts=200] [--tokens=512] [--requests=2000] [--zipf=1.0] [--seed=1]
//                       [--layers=1] [--kv_heads=2] [--csv=PATH]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <list>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "service/handler.h"
#include "wire/half.h"

namespace driftkv {
namespace {

using bench::Flag;
using bench::IntFlag;

constexpr int kD = 64, kP = 128;
// Budgets, as fractions of the bf16 bytes of every prompt's pages.
constexpr double kBudgets[] = {0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.7, 1.0};

struct Trace {
  int prompts, tokens, layers, kv_heads;
  std::vector<int> picks;  // prompt of each request
};

uint32_t PromptId(int prompt, int t) {
  uint32_t s = (static_cast<uint32_t>(prompt) * 1000003u + static_cast<uint32_t>(t)) * 2654435761u;
  return (s ^ (s >> 15)) % 128000u;
}

std::string Bf16(int r, int first, int count, int n, int salt) {
  std::string out(static_cast<size_t>(count) * n * 2, '\0');
  for (int t = 0; t < count; ++t) {
    for (int i = 0; i < n; ++i) {
      uint32_t s = (static_cast<uint32_t>(r) * 7919u + static_cast<uint32_t>(first + t)) * 2654435761u + i * 40503u +
                   static_cast<uint32_t>(salt);
      s ^= s >> 15;
      const uint16_t b = FloatToBf16(static_cast<float>(s % 2001) / 1000.0f - 1.0f);
      std::memcpy(&out[(static_cast<size_t>(t) * n + i) * 2], &b, 2);
    }
  }
  return out;
}

// The bf16 store: an LRU of (prompt, page) pages of `capacity`.
double SimulateBf16(const Trace& tr, int64_t capacity) {
  const int pages = tr.tokens / kP;
  std::list<int64_t> lru;  // most recent first
  std::unordered_map<int64_t, std::list<int64_t>::iterator> where;
  int64_t hit = 0, asked = 0;
  const size_t warm = tr.picks.size() / 5;
  for (size_t r = 0; r < tr.picks.size(); ++r) {
    const int p = tr.picks[r];
    int held = 0;
    while (held < pages && where.count(static_cast<int64_t>(p) * pages + held) > 0) ++held;
    if (r >= warm) {
      hit += held;
      asked += pages;
    }
    for (int k = 0; k < pages; ++k) {
      const int64_t key = static_cast<int64_t>(p) * pages + k;
      auto it = where.find(key);
      if (it != where.end()) lru.erase(it->second);
      lru.push_front(key);
      where[key] = lru.begin();
      while (static_cast<int64_t>(lru.size()) > capacity) {
        where.erase(lru.back());
        lru.pop_back();
      }
    }
  }
  return asked > 0 ? static_cast<double>(hit) / asked : 0.0;
}

// driftkv with a pool of `budget` bytes; returns the hit rate, its pool's
// capacity in pages in *pages.
double RunDriftkv(const Trace& tr, uint64_t budget, int64_t* pages) {
  const int n = tr.kv_heads * kD;
  ServiceOptions o;
  o.layers = tr.layers;
  o.codec.kv_heads = tr.kv_heads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kP;
  o.window_tokens = kP;
  o.max_sequences = 4;
  o.backend_threads = 1;
  o.pool_bytes = budget;
  Metrics metrics;
  auto made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  Handler& h = **made;
  *pages = h.pool().capacity_pages();
  const int prompt_pages = tr.tokens / kP, total = tr.tokens + kP;
  int64_t hit = 0, asked = 0;
  const size_t warm = tr.picks.size() / 5;
  for (size_t r = 0; r < tr.picks.size(); ++r) {
    const int p = tr.picks[r];
    std::vector<uint32_t> ids(total);
    for (int t = 0; t < total; ++t) {
      ids[t] = t < tr.tokens ? PromptId(p, t) : static_cast<uint32_t>((r * 7919 + t * 13) % 128000);
    }
    v1::LookupRequest lr;
    lr.mutable_token_ids()->Add(ids.begin(), ids.begin() + tr.tokens);
    v1::LookupResponse found;
    CHECK_OK(h.Lookup(lr, &found));
    if (r >= warm) {
      hit += static_cast<int64_t>(found.pages());
      asked += prompt_pages;
    }
    const std::string id = absl::StrCat("r", r);
    int from = 0;
    if (found.pages() > 0) {
      v1::ForkRequest f;
      f.set_sequence_id(id);
      f.mutable_prefix_token_ids()->Add(ids.begin(), ids.begin() + tr.tokens);
      v1::ForkResponse fr;
      if (h.Fork(f, &fr).ok()) from = static_cast<int>(fr.tokens());  // evicted meanwhile: push it all
    }
    for (int l = 0; l < tr.layers; ++l) {
      v1::AppendChunk c;
      c.set_sequence_id(id);
      c.set_layer(l);
      c.set_first_token(from);
      c.set_token_count(total - from);
      c.set_dtype(v1::DTYPE_BF16);
      // A prompt's tokens are the same in every request (r = -1 - p).
      std::string k, v;
      const int own = std::max(from, tr.tokens);
      if (from < tr.tokens) {
        k = Bf16(-1 - p, from, tr.tokens - from, n, 1 + l);
        v = Bf16(-1 - p, from, tr.tokens - from, n, 100 + l);
      }
      k += Bf16(static_cast<int>(r), own, total - own, n, 1 + l);
      v += Bf16(static_cast<int>(r), own, total - own, n, 100 + l);
      c.set_keys(k);
      c.set_values(v);
      c.mutable_token_ids()->Add(ids.begin() + from, ids.end());
      v1::AppendResponse totals;
      CHECK_OK(h.Append(c, &totals));
    }
    v1::ReleaseRequest rel;
    rel.set_sequence_id(id);
    v1::ReleaseResponse rr;
    CHECK_OK(h.Release(rel, &rr));
  }
  return asked > 0 ? static_cast<double>(hit) / asked : 0.0;
}

int Main(int argc, char** argv) {
  Trace tr;
  tr.prompts = IntFlag(argc, argv, "prompts", 200);
  tr.tokens = IntFlag(argc, argv, "tokens", 512) / kP * kP;
  tr.layers = IntFlag(argc, argv, "layers", 1);
  tr.kv_heads = IntFlag(argc, argv, "kv_heads", 2);
  const int requests = IntFlag(argc, argv, "requests", 2000), seed = IntFlag(argc, argv, "seed", 1);
  double zipf = 1.0;
  if (!absl::SimpleAtod(Flag(argc, argv, "zipf", "1.0"), &zipf)) zipf = 1.0;
  const std::string csv = Flag(argc, argv, "csv", "");
  std::vector<double> cdf(tr.prompts);
  double sum = 0;
  for (int k = 0; k < tr.prompts; ++k) cdf[k] = sum += 1.0 / std::pow(k + 1.0, zipf);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, sum);
  for (int i = 0; i < requests; ++i) {
    tr.picks.push_back(static_cast<int>(std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()));
  }
  const int n = tr.kv_heads * kD;
  const int64_t bf16_page = static_cast<int64_t>(kP) * WindowBytesPerToken(n);
  const double all_bf16 = static_cast<double>(tr.prompts) * (tr.tokens / kP) * tr.layers * bf16_page;
  constexpr int kRuns = sizeof(kBudgets) / sizeof(kBudgets[0]);
  double hit[kRuns], bf16_hit[kRuns];
  int64_t pages[kRuns];
  // Two budgets at a time (one per core); each run is one thread.
  for (int i = 0; i < kRuns; i += 2) {
    std::vector<std::thread> runs;
    for (int j = i; j < std::min(i + 2, kRuns); ++j) {
      runs.emplace_back([&, j] { hit[j] = RunDriftkv(tr, static_cast<uint64_t>(kBudgets[j] * all_bf16), &pages[j]); });
    }
    for (std::thread& t : runs) t.join();
  }
  std::printf(
      "%d prompts of %d tokens, Zipf exponent %.2f, %d requests (seed %d), %d layer(s) of %d x %d, "
      "pages of %d tokens; hit rate over the last 80%% of requests\n",
      tr.prompts, tr.tokens, zipf, requests, seed, tr.layers, tr.kv_heads, kD, kP);
  std::printf("%10s %12s %12s %10s %10s\n", "budget MiB", "driftkv pages", "bf16 pages", "driftkv", "bf16");
  std::ofstream out;
  if (!csv.empty()) {
    out.open(csv);
    out << "budget_bytes,driftkv_pages,bf16_pages,driftkv_hit_rate,bf16_hit_rate\n";
  }
  for (int j = 0; j < kRuns; ++j) {
    const uint64_t budget = static_cast<uint64_t>(kBudgets[j] * all_bf16);
    const int64_t bf16_pages = static_cast<int64_t>(budget) / bf16_page;
    bf16_hit[j] = SimulateBf16(tr, bf16_pages / tr.layers);  // per layer: the trace's pages are one layer's
    std::printf("%10.2f %12lld %12lld %9.1f%% %9.1f%%\n", budget / 1048576.0, static_cast<long long>(pages[j]),
                static_cast<long long>(bf16_pages), 100 * hit[j], 100 * bf16_hit[j]);
    if (out.is_open()) {
      out << budget << "," << pages[j] << "," << bf16_pages << "," << hit[j] << "," << bf16_hit[j] << "\n";
    }
  }
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
