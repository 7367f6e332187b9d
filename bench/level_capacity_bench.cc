// The levels' capacity at their full size (docs/tiers.md, "Capacity"): a
// Handler (--backend cuda by default) with a pool of --pool_mib, a host
// level of --host_mib and a disk level of --disk_mib under --disk_dir,
// filled until Append is refused, then every sequence checked and
// released, newest first.
//
// The fill would take ~15 minutes through Append alone on the H200 (the
// Append path encodes ~0.33 GB/s of bf16 there), so most sequences are
// forks: s0 is appended (--layers x --tokens), then --forks forks of all
// its pages; then distinct sequences d1.. are appended until the pool has
// no room. Each fork that moves below gets its own copy of every page
// (host slots or disk records: docs/tiers.md, "Shared pages"), so a fork
// below holds as many bytes as a distinct sequence. The capacity counts
// sequence-equivalents: the sequences below plus the pool's pages in use
// over a sequence's pages, against the pool's own capacity in sequences.
//
// The check: every layer attended and layer 0 read (LevelAnswers) equal
// the answer taken while the sequence (or, for the forks, the first fork)
// was in the pool; every page's CRC-32C is checked when it comes back.
//
//   level_capacity_bench [--backend=cuda] [--layers=32] [--tokens=8320] [--pool_mib=1024]
//                        [--host_mib=8192] --disk_dir=DIR [--disk_mib=32768] [--forks=320]
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "bench/level_bench_util.h"
#include "service/handler.h"

namespace driftkv {
namespace {

using bench::Flag;
using bench::IntFlag;
using bench::kPageTokens;
using bench::LevelAdd;
using bench::LevelAnswers;

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

int Main(int argc, char** argv) {
  const int layers = IntFlag(argc, argv, "layers", 32), tokens = IntFlag(argc, argv, "tokens", 8320);
  const int forks = IntFlag(argc, argv, "forks", 320);
  ServiceOptions o = bench::LevelServiceOptions(Flag(argc, argv, "backend", "cuda"), layers);
  o.max_sequences = static_cast<uint64_t>(forks) + 1000;
  o.pool_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "pool_mib", 1024)) << 20;
  o.host_level.budget_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "host_mib", 8192)) << 20;
  o.disk_level.dir = Flag(argc, argv, "disk_dir", "");
  o.disk_level.budget_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "disk_mib", 32768)) << 20;
  if (o.disk_level.dir.empty()) {
    std::fprintf(stderr, "--disk_dir is required\n");
    return 2;
  }
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  Handler& h = **made;
  SpillTier& tier = *h.spill_tier();
  const int page_pages = (tokens - kPageTokens) / kPageTokens;  // full pages a layer (the window stays bf16)
  const int64_t seq_pages = static_cast<int64_t>(layers) * page_pages;
  const int64_t capacity = h.pool().capacity_pages();
  const int64_t pool_alone = capacity / seq_pages;
  std::printf(
      "backend %s; page %zu bytes; a sequence %d layers x %d tokens = %lld pages (%.1f MB); pool %lld pages "
      "(%lld sequences alone); host level %llu MiB; disk level %llu MiB in blocks of %u bytes (%llu bytes a record)\n",
      o.backend.c_str(), h.pool().page_stride(), layers, tokens, static_cast<long long>(seq_pages),
      static_cast<double>(seq_pages) * h.pool().page_stride() / 1e6, static_cast<long long>(capacity),
      static_cast<long long>(pool_alone), static_cast<unsigned long long>(o.host_level.budget_bytes >> 20),
      static_cast<unsigned long long>(o.disk_level.budget_bytes >> 20), tier.disk_store()->block_bytes(),
      static_cast<unsigned long long>(tier.disk_store()->record_bytes()));

  const auto f0 = std::chrono::steady_clock::now();
  CHECK_OK(LevelAdd(h, "s0", layers, tokens, 0));
  const std::string s0_answer = LevelAnswers(h, "s0", layers);
  for (int i = 1; i <= forks; ++i) {
    v1::ForkRequest f;
    f.set_source_sequence_id("s0");
    f.set_sequence_id(absl::StrCat("f", i));
    f.set_tokens(static_cast<uint64_t>(page_pages) * kPageTokens);
    v1::ForkResponse fr;
    CHECK_OK(h.Fork(f, &fr));
  }
  const std::string fork_answer = LevelAnswers(h, "f1", layers);
  // Distinct sequences until the pool is full; the first one that needs
  // room moves s0 and its forks below, all of them (their pages are shared
  // until the last holder has moved), until the levels are full.
  std::vector<std::string> distinct_answers;
  absl::Status refused;
  for (int d = 1;; ++d) {
    const std::string id = absl::StrCat("d", d);
    refused = LevelAdd(h, id, layers, tokens, static_cast<uint32_t>(d));
    if (!refused.ok()) {
      v1::ReleaseRequest r;  // partly appended
      r.set_sequence_id(id);
      v1::ReleaseResponse rr;
      h.Release(r, &rr).IgnoreError();
      break;
    }
    distinct_answers.push_back(LevelAnswers(h, id, layers));
  }
  const double fill_s = Seconds(f0);
  const int64_t on_host = tier.sequences_on_host(), below = tier.sequences_below();
  const int64_t in_pool = h.pool().pages_in_use(0);
  const double held = static_cast<double>(below) + static_cast<double>(in_pool) / static_cast<double>(seq_pages);
  std::printf(
      "filled in %.1f s (s0, %d forks, %zu distinct; stopped by: %s)\n"
      "below: %lld sequences (%lld on the host level, %lld on disk: %llu bytes of records); pool: %lld pages in use "
      "(%.2f sequences)\n"
      "held: %.2f sequence-equivalents = %.2fx the pool's %lld sequences\n",
      fill_s, forks, distinct_answers.size(), std::string(refused.message()).substr(0, 160).c_str(),
      static_cast<long long>(below), static_cast<long long>(on_host), static_cast<long long>(below - on_host),
      static_cast<unsigned long long>(tier.disk_store()->bytes_used()), static_cast<long long>(in_pool),
      static_cast<double>(in_pool) / static_cast<double>(seq_pages), held, held / static_cast<double>(pool_alone),
      static_cast<long long>(pool_alone));

  // Newest first: the distinct ones and the forks still in the pool, then
  // those below, s0 last; each checked, then released, which makes the
  // room the next restore needs. (Oldest first, each restore would need a
  // move down to make room, and the pool's least recently used sequences
  // are the forks still sharing s0's pages: moving one frees no page until
  // the last has moved, while it takes room below.)
  const auto v0 = std::chrono::steady_clock::now();
  int checked = 0, differ = 0;
  auto check = [&](const std::string& id, const std::string& want) {
    if (LevelAnswers(h, id, layers) != want) {
      std::printf("%s: the answer differs\n", id.c_str());
      ++differ;
    }
    ++checked;
    v1::ReleaseRequest r;
    r.set_sequence_id(id);
    v1::ReleaseResponse rr;
    CHECK_OK(h.Release(r, &rr));
  };
  for (size_t d = distinct_answers.size(); d > 0; --d) check(absl::StrCat("d", d), distinct_answers[d - 1]);
  for (int i = forks; i >= 1; --i) check(absl::StrCat("f", i), fork_answer);
  check("s0", s0_answer);
  std::printf("checked %d sequences in %.1f s (every layer attended, layer 0 read): %d differ\n", checked, Seconds(v0),
              differ);
  return differ == 0 ? 0 : 1;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
