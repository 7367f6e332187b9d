// Restore time of the host-memory level (docs/tiers.md, "The host level on
// the CUDA backend"): a Handler (--backend cuda by default; 8 KV heads x
// 128, GQA 32/8, pages of 128 tokens) with a pool of --pool_seqs sequences
// of --layers x --tokens and a host level of --host_mib, optionally a disk
// level (--disk_dir, --disk_mib). Fills --sequences sequences (the oldest
// move down), then, each timed with a steady clock on the calling thread:
//   - restore into room: --room of the newest sequences are released, and
//     as many sequences on the host level are prefetched (no move down);
//   - swap: further Prefetches with the pool full (each first moves the
//     least recently used sequence down to the host level);
//   - Attend after Prefetch against Attend of the same sequence once more
//     (resident): one Attend of every layer (--layers items, f32 queries);
//   - Attend of a sequence on the host level without a Prefetch (the
//     restore inside the Attend).
// The first 4 sequences' answers (every layer attended, layer 0 read) are
// taken while they are in the pool and compared after they came back.
//
//   host_level_bench [--backend=cuda] [--layers=32] [--tokens=8320] [--pool_seqs=12]
//                    [--host_mib=8192] [--sequences=60] [--room=8] [--disk_dir= --disk_mib=]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
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

using bench::AttendAll;
using bench::kPageTokens;
using bench::LevelAdd;
using bench::LevelAnswers;

// driftkv_level_moved_pages_total{level, direction="up"}.
double MovedUp(Metrics& m, const std::string& level) {
  for (const auto& family : m.registry()->Collect()) {
    if (family.name != "driftkv_level_moved_pages_total") continue;
    for (const auto& metric : family.metric) {
      bool l = false, up = false;
      for (const auto& label : metric.label) {
        l = l || (label.name == "level" && label.value == level);
        up = up || (label.name == "direction" && label.value == "up");
      }
      if (l && up) return metric.counter.value;
    }
  }
  return 0;
}

// Histogram `name`{level}: its mean in ms and its count.
std::pair<double, uint64_t> MeanMs(Metrics& m, const std::string& name, const std::string& level) {
  for (const auto& family : m.registry()->Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) {
        if (label.name == "level" && label.value == level && metric.histogram.sample_count > 0) {
          return {1e3 * metric.histogram.sample_sum / metric.histogram.sample_count, metric.histogram.sample_count};
        }
      }
    }
  }
  return {0, 0};
}

double Ms(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count();
}

struct Quantiles {
  double p50 = 0, p90 = 0, max = 0;
  size_t n = 0;
};
Quantiles Of(std::vector<double> v) {
  Quantiles q;
  if (v.empty()) return q;
  std::sort(v.begin(), v.end());
  q.n = v.size();
  q.p50 = v[v.size() / 2];
  q.p90 = v[std::min(v.size() - 1, v.size() * 9 / 10)];
  q.max = v.back();
  return q;
}

int Main(int argc, char** argv) {
  const int layers = IntFlag(argc, argv, "layers", 32), tokens = IntFlag(argc, argv, "tokens", 8320);
  const int pool_seqs = IntFlag(argc, argv, "pool_seqs", 12), sequences = IntFlag(argc, argv, "sequences", 60);
  const int room = IntFlag(argc, argv, "room", 8);
  ServiceOptions o = bench::LevelServiceOptions(Flag(argc, argv, "backend", "cuda"), layers);
  o.max_sequences = static_cast<uint64_t>(sequences) + 1;
  o.host_level.budget_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "host_mib", 8192)) << 20;
  o.disk_level.dir = Flag(argc, argv, "disk_dir", "");
  o.disk_level.budget_bytes = static_cast<uint64_t>(IntFlag(argc, argv, "disk_mib", 0)) << 20;
  const int seq_pages = layers * ((tokens - kPageTokens) / kPageTokens);
  {  // the pool for pool_seqs sequences: one probe handler gives the page size
    ServiceOptions p = o;
    p.host_level = HostLevelOptions();
    p.disk_level = DiskLevelOptions();
    p.pool_bytes = 64u << 20;
    Metrics m;
    absl::StatusOr<std::unique_ptr<Handler>> probe = Handler::Create(p, &m);
    CHECK_OK(probe.status());
    o.pool_bytes = static_cast<uint64_t>(pool_seqs) * seq_pages * (*probe)->pool().page_stride();
  }
  Metrics metrics;
  const auto c0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  const double create_ms = Ms(c0);
  Handler& h = **made;
  const size_t stride = h.pool().page_stride();
  const double seq_mb = static_cast<double>(seq_pages) * stride / 1e6;
  std::printf(
      "backend %s; page %zu bytes; a sequence %d layers x %d tokens = %d pages (%.1f MB); pool %lld pages "
      "(%d sequences); host level %.0f MiB (%lld slots, created and page-locked with the handler in %.0f ms)\n",
      o.backend.c_str(), stride, layers, tokens, seq_pages, seq_mb, static_cast<long long>(h.pool().capacity_pages()),
      pool_seqs, h.spill_tier()->host_store()->block_bytes() / 1048576.0,
      static_cast<long long>(h.spill_tier()->host_store()->capacity()), create_ms);

  std::vector<std::string> before;
  const auto f0 = std::chrono::steady_clock::now();
  for (int i = 0; i < sequences; ++i) {
    CHECK_OK(LevelAdd(h, absl::StrCat("s", i), layers, tokens, static_cast<uint32_t>(i)));
    if (i < 4) before.push_back(LevelAnswers(h, absl::StrCat("s", i), layers));
  }
  std::printf("stored %d sequences (%.1fx the pool) in %.1f s: %lld on the host level, %lld on disk\n", sequences,
              static_cast<double>(sequences) / pool_seqs, Ms(f0) / 1000.0,
              static_cast<long long>(h.spill_tier()->sequences_on_host()),
              static_cast<long long>(h.spill_tier()->sequences_below() - h.spill_tier()->sequences_on_host()));

  // Restores into room: the newest `room` sequences (in the pool) go.
  for (int i = sequences - room; i < sequences; ++i) {
    v1::ReleaseRequest r;
    r.set_sequence_id(absl::StrCat("s", i));
    v1::ReleaseResponse rr;
    CHECK_OK(h.Release(r, &rr));
  }
  const int live = sequences - room;
  // By the level the sequence came from: [0] host, [1] disk.
  std::vector<double> into_room[2], swap[2], attend_after, attend_resident, attend_inline;
  int next = 0;  // oldest first: sequences below, least recently used first
  auto prefetch = [&](int i, std::vector<double>* out) {
    v1::PrefetchRequest p;
    p.set_sequence_id(absl::StrCat("s", i));
    v1::PrefetchResponse r;
    const double host_up = MovedUp(metrics, "host");
    const auto a = std::chrono::steady_clock::now();
    CHECK_OK(h.Prefetch(p, &r));
    const double t = Ms(a);
    const bool from_host = MovedUp(metrics, "host") > host_up;
    if (r.pages_restored() > 0) out[from_host ? 0 : 1].push_back(t);
    return r.pages_restored() > 0;
  };
  auto attend = [&](int i, std::vector<double>* out) {
    v1::AttendResponse resp;
    const v1::AttendRequest req = AttendAll(absl::StrCat("s", i), layers);
    const auto a = std::chrono::steady_clock::now();
    CHECK_OK(h.Attend(req, &resp));
    out->push_back(Ms(a));
  };
  for (int k = 0; k < room && next < live; ++next) {
    if (!prefetch(next, into_room)) continue;
    ++k;
    attend(next, &attend_after);
    attend(next, &attend_resident);
  }
  // Swaps: the pool is full; every other sequence restored by an Attend
  // of its own (no Prefetch).
  for (int k = 0; next < live; ++next, ++k) {
    if (k % 2 == 0) {
      if (!prefetch(next, swap)) continue;
      attend(next, &attend_after);
      attend(next, &attend_resident);
    } else {
      attend(next, &attend_inline);
    }
  }
  int same = 0;
  for (int i = 0; i < static_cast<int>(before.size()); ++i) {
    if (LevelAnswers(h, absl::StrCat("s", i), layers) != before[i]) {
      std::fprintf(stderr, "s%d: answers after the moves differ\n", i);
      return 1;
    }
    ++same;
  }
  auto line = [&](const char* what, const std::vector<double>& v, bool rate) {
    const Quantiles q = Of(v);
    std::printf("%-46s n=%3zu p50 %8.3f ms  p90 %8.3f ms  max %8.3f ms", what, q.n, q.p50, q.p90, q.max);
    if (rate && q.p50 > 0) std::printf("  (%.1f GB/s of pages at p50)", seq_mb / q.p50);
    std::printf("\n");
  };
  line("Prefetch from host, into room", into_room[0], true);
  line("Prefetch from host, swapping one down", swap[0], true);
  if (!o.disk_level.dir.empty()) {
    line("Prefetch from disk, into room", into_room[1], true);
    line("Prefetch from disk, swapping one down", swap[1], true);
  }
  line("Attend of all layers right after Prefetch", attend_after, false);
  line("Attend of all layers again (resident)", attend_resident, false);
  line("Attend of all layers without Prefetch (restore)", attend_inline, false);
  for (const char* level : {"host", "disk"}) {
    const auto [down, downs] = MeanMs(metrics, "driftkv_level_move_down_seconds", level);
    const auto [up, ups] = MeanMs(metrics, "driftkv_level_restore_seconds", level);
    if (downs + ups == 0) continue;
    std::printf(
        "%s level, whole run: %llu moves down, mean %.3f ms; %llu restores, mean %.3f ms (a move down "
        "inside included)\n",
        level, static_cast<unsigned long long>(downs), down, static_cast<unsigned long long>(ups), up);
  }
  std::printf("Attend after Prefetch - resident, p50: %.3f ms; %d sequences' answers bit-identical after moving\n",
              Of(attend_after).p50 - Of(attend_resident).p50, same);
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
