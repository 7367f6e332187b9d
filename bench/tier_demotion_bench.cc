// A hot sequence's demotion with and without cold copies (docs/hot_tier.md,
// "Cold copies"), side by side in one process: two handlers on one backend,
// hot_keep_cold_copies on and off, each holding one sequence of --layers x
// --tokens (8 KV heads x 128, pages of 128 tokens). Each round, alternating
// the handlers' order: an Attend of every layer (which promotes them all),
// then the sequence's demotion as the idle reaper does it (ExpireIdle after
// hot_idle_seconds); the wall time of each. The answers of both handlers are
// checked equal to each other and to the answer before the first round.
//
//   bazel-bin/bench/tier_demotion_bench [--backend=cpu|cuda] [--layers=8]
//                                       [--tokens=2176] [--rounds=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/check.h"
#include "bench/flags.h"
#include "bench/level_bench_util.h"
#include "codec/level_page.h"
#include "service/handler.h"
#include "service/process_env.h"

namespace driftkv {
namespace {

using bench::Flag;
using bench::IntFlag;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Side {
  explicit Side(const char* n) : name(n) {}
  const char* name;
  Metrics metrics;
  absl::Time now = absl::FromUnixSeconds(1000000);
  std::unique_ptr<Handler> h;
  std::vector<double> promote_ms, demote_ms;
};

int Main(int argc, char** argv) {
  const int layers = IntFlag(argc, argv, "layers", 8), tokens = IntFlag(argc, argv, "tokens", 2176);
  const int rounds = IntFlag(argc, argv, "rounds", 5);
  const std::string backend = Flag(argc, argv, "backend", "cpu");
  ServiceOptions o = bench::LevelServiceOptions(backend, layers);
  const int pages = layers * ((tokens - bench::kPageTokens) / bench::kPageTokens);
  o.hot_tier_bytes = static_cast<uint64_t>(pages + 8) * MakeLevelPageLayout(bench::kKvHeads, bench::kD)->page_bytes;
  o.pool_bytes = static_cast<uint64_t>(pages) * 2 * 80000 + (16u << 20);
  o.hot_idle_seconds = 1.0;
  Side sides[2] = {Side("copies"), Side("no copies")};
  std::string want;
  for (int k = 0; k < 2; ++k) {
    Side& s = sides[k];
    ServiceOptions mine = o;
    mine.hot_keep_cold_copies = k == 0;
    absl::StatusOr<std::unique_ptr<Handler>> made = Handler::Create(mine, &s.metrics, [&s] { return s.now; });
    CHECK_OK(made.status());
    s.h = *std::move(made);
    CHECK_OK(bench::LevelAdd(*s.h, "s", layers, tokens, 0));
  }
  std::printf("backend %s; one sequence of %d layers x %d tokens: %d pages in both tiers\n", backend.c_str(), layers,
              tokens, pages);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < 2; ++i) {
      Side& s = sides[(r + i) % 2];
      v1::AttendResponse resp;
      auto t0 = Clock::now();
      CHECK_OK(s.h->Attend(bench::AttendAll("s", layers), &resp));
      s.promote_ms.push_back(Ms(t0));
      v1::StatsResponse st;
      s.h->Stats(&st);
      if (st.hot_layers() != static_cast<uint64_t>(layers)) CHECK_OK(absl::InternalError("not every layer promoted"));
      s.now += absl::Seconds(2);
      t0 = Clock::now();
      s.h->ExpireIdle();
      s.demote_ms.push_back(Ms(t0));
      s.h->Stats(&st);
      if (st.hot_layers() != 0) CHECK_OK(absl::InternalError("not every layer demoted"));
    }
  }
  for (Side& s : sides) {
    v1::StatsResponse st;
    s.h->Stats(&st);
    const std::string got = bench::LevelAnswers(*s.h, "s", layers);  // promotes once more
    if (want.empty()) want = got;
    if (got != want) CHECK_OK(absl::InternalError("the two handlers answer differently"));
    std::printf(
        "%-9s  Attend that promotes: median %8.2f ms   demotion: median %8.2f ms (%d rounds); pages demoted %llu, "
        "from copies %llu\n",
        s.name, Median(s.promote_ms), Median(s.demote_ms), rounds, static_cast<unsigned long long>(st.pages_demoted()),
        static_cast<unsigned long long>(st.pages_demoted_from_copies()));
  }
  std::printf("demotion without copies / with copies: %.1fx (medians, same run)\n",
              Median(sides[1].demote_ms) / Median(sides[0].demote_ms));
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  driftkv::PrepareServerProcess();
  return driftkv::Main(argc, argv);
}
