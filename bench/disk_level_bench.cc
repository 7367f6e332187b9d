// Capacity and restore time of the disk level under the pool (docs/tiers.md,
// "In the service"): a Handler (--backend cpu or cuda; 8 KV heads x 128,
// pages of 128 tokens, window 128) with a --pool_mib pool and a --disk_mib
// disk level under --dir. Appends sequences of --layers x --tokens (bf16, one random
// pattern per sequence) until an Append is refused or --max sequences are
// stored; reports how many the pool alone holds (its pages / a sequence's
// pages) and how many were stored. Then Prefetch of --reps sequences below,
// oldest first (each moves others down to make room), timed: the restore
// time's quantiles and page bytes per second. The first 4 sequences' layer
// 0 is read before it moves and after it came back: bytes must be equal.
//
//   disk_level_bench --dir=DIR [--layers=8] [--tokens=1152] [--pool_mib=64]
//                    [--disk_mib=2048] [--max=100000] [--reps=40] [--backend=cpu|cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/bf16_pattern.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "service/handler.h"

namespace driftkv {
namespace {

using bench::Flag;
using bench::IntFlag;

constexpr int kKvHeads = 8, kD = 128, kN = kKvHeads * kD, kPageTokens = 128;

absl::Status Add(Handler& h, const std::string& id, int layers, int tokens, uint32_t seed) {
  v1::AppendResponse r;
  for (int l = 0; l < layers; ++l) {
    v1::AppendChunk c;
    c.set_sequence_id(id);
    c.set_layer(l);
    c.set_token_count(tokens);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(bench::Bf16Pattern(static_cast<size_t>(tokens) * kN, seed * 2 + l * 7919));
    c.set_values(bench::Bf16Pattern(static_cast<size_t>(tokens) * kN, seed * 2 + 1 + l * 7919));
    if (absl::Status st = h.Append(c, &r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::string ReadLayer0(Handler& h, const std::string& id) {
  v1::ReadRequest q;
  q.set_sequence_id(id);
  q.set_dtype(v1::DTYPE_BF16);
  std::string out;
  CHECK_OK(h.Read(q, [&](const v1::ReadChunk& c) {
    out += c.keys();
    out += c.values();
    return true;
  }));
  return out;
}

int Main(int argc, char** argv) {
  const std::string dir = Flag(argc, argv, "dir", "");
  if (dir.empty()) {
    std::fprintf(stderr, "usage: disk_level_bench --dir=DIR [--layers= --tokens= --pool_mib= --disk_mib= ...]\n");
    return 2;
  }
  const int layers = IntFlag(argc, argv, "layers", 8), tokens = IntFlag(argc, argv, "tokens", 1152);
  const int max = IntFlag(argc, argv, "max", 100000), reps = IntFlag(argc, argv, "reps", 40);
  ServiceOptions o;
  o.metrics_listen = "";
  // --backend=cuda: the pool's pages also live on the GPU, and a restore
  // uploads them before the Prefetch returns.
  o.backend = bench::Flag(argc, argv, "backend", "cpu");
  o.layers = layers;
  o.codec.kv_heads = kKvHeads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = kPageTokens;
  o.pool_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "pool_mib", 64)) << 20;
  o.max_sequences = static_cast<uint64_t>(max) + 1;
  o.disk_level.dir = dir;
  o.disk_level.budget_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "disk_mib", 2048)) << 20;
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  Handler& h = **made;

  std::vector<std::string> before;
  int stored = 0;
  absl::Status refused;
  const auto t0 = std::chrono::steady_clock::now();
  for (; stored < max; ++stored) {
    refused = Add(h, absl::StrCat("s", stored), layers, tokens, static_cast<uint32_t>(stored));
    if (!refused.ok()) break;
    if (stored < 4) before.push_back(ReadLayer0(h, absl::StrCat("s", stored)));
  }
  const double fill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  v1::LengthRequest lq;
  lq.set_sequence_id("s0");
  v1::LengthResponse len;
  CHECK_OK(h.Length(lq, &len));
  int64_t seq_pages = 0;
  for (const v1::LayerLength& l : len.layers()) seq_pages += static_cast<int64_t>(l.compressed_tokens()) / kPageTokens;
  const int64_t pool_only = h.pool().capacity_pages() / seq_pages;
  const tiers::DiskPageStoreStats ds = h.spill_tier()->disk_store()->stats();
  std::printf("page %zu bytes; a sequence %d layers x %d tokens = %lld pages; pool %lld pages: %lld sequences alone\n",
              h.pool().page_stride(), layers, tokens, static_cast<long long>(seq_pages),
              static_cast<long long>(h.pool().capacity_pages()), static_cast<long long>(pool_only));
  std::printf(
      "stored %d sequences (%.1fx the pool alone) in %.1f s; %lld below, %llu pages / %.1f MiB on disk; "
      "stopped by: %s\n",
      stored, static_cast<double>(stored) / std::max<int64_t>(1, pool_only), fill_s,
      static_cast<long long>(h.spill_tier()->sequences_below()), static_cast<unsigned long long>(ds.pages),
      ds.bytes_used / 1048576.0, refused.ok() ? "--max" : std::string(refused.message()).c_str());

  std::vector<double> ms;
  int64_t pages = 0;
  for (int i = 0; i < reps && i < stored; ++i) {
    v1::PrefetchRequest p;
    p.set_sequence_id(absl::StrCat("s", i));
    v1::PrefetchResponse r;
    const auto a = std::chrono::steady_clock::now();
    CHECK_OK(h.Prefetch(p, &r));
    const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
    if (r.pages_restored() == 0) continue;  // was in the pool
    ms.push_back(t);
    pages += static_cast<int64_t>(r.pages_restored());
    if (i < static_cast<int>(before.size()) && ReadLayer0(h, p.sequence_id()) != before[i]) {
      std::fprintf(stderr, "sequence %s: bytes after the move differ\n", p.sequence_id().c_str());
      return 1;
    }
  }
  if (ms.empty()) {
    std::printf("no Prefetch found a sequence below\n");
    return 0;
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  double total = 0;
  for (double t : ms) total += t;
  auto q = [&](double f) { return sorted[std::min(sorted.size() - 1, static_cast<size_t>(f * sorted.size()))]; };
  std::printf(
      "Prefetch of %zu sequences below (%lld pages each, moving others down meanwhile): p50 %.2f ms, p90 %.2f "
      "ms, max %.2f ms; %.3f GB/s of pages; %zu read back bit-identical\n",
      ms.size(), static_cast<long long>(seq_pages), q(0.5), q(0.9), sorted.back(),
      pages * h.pool().page_stride() / (total / 1000.0) / 1e9, before.size());
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
