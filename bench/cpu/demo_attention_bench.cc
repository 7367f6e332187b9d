// CPU decode attention of one README-demo item (tools/generate.sh: the eval
// model's shape, 4 KV heads x 128, 8 query heads, GQA 2) from the hot tier,
// one thread (Google Benchmark): 6 level pages (768 tokens) and a bf16
// window of 0 or 192 tokens (the demo's window holds 128-255 tokens), and
// the window alone; and the first from memory, not cache. i.i.d. normal keys and values at the default containers
// (key levels 8, value levels 6), query 0.3 x normal, scale 1/sqrt(128).
//   bazel run -c opt //bench/cpu:demo_attention_bench
#include <algorithm>
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/level_attention.h"
#include "codec/level_page.h"
#include "wire/half.h"

namespace driftkv {
namespace {

constexpr int kHeads = 4, kDim = 128, kN = kHeads * kDim, kQHeads = 8;
constexpr int kPages = 6, kWindow = 192;
constexpr float kScale = 0.08838835f;  // 1/sqrt(128)

struct Fixture {
  DQuantCodec codec;
  std::vector<std::vector<uint8_t>> hot;  // per page
  std::vector<LevelPageRef> refs;
  std::vector<uint16_t> window_keys, window_values;  // [kWindow][kN] bf16
  std::vector<float> query;

  static const Fixture& Get() {
    static const Fixture* f = [] {
      DQuantConfig c;
      c.kv_heads = kHeads;
      c.head_dim = kDim;
      auto* f = new Fixture{*DQuantCodec::Create(c)};
      const LevelPageLayout layout = *MakeLevelPageLayout(f->codec);
      std::mt19937_64 rng(1);
      std::normal_distribution<float> nd;
      std::vector<float> k(kLevelPageTokens * kN), v(kLevelPageTokens * kN);
      std::vector<uint8_t> keys(kLevelPageTokens * f->codec.key_stride()),
          values(kLevelPageTokens * f->codec.value_stride()), mean(f->codec.mean_stride());
      CodecScratch scratch;
      for (int p = 0; p < kPages; ++p) {
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        StreamStats ks, vs;
        (void)f->codec.EncodeWindow(k.data(), v.data(), kLevelPageTokens, keys.data(), values.data(), mean.data(),
                                    &scratch, &ks, &vs);
        f->hot.emplace_back(layout.page_bytes);
        (void)PromotePage(f->codec, layout, keys.data(), values.data(), mean.data(), kLevelPageTokens,
                          f->hot[p].data());
      }
      for (int p = 0; p < kPages; ++p) f->refs.push_back({f->hot[p].data(), kLevelPageTokens});
      for (int i = 0; i < kWindow * kN; ++i) {
        f->window_keys.push_back(FloatToBf16(nd(rng)));
        f->window_values.push_back(FloatToBf16(nd(rng)));
      }
      f->query.resize(kQHeads * kDim);
      for (float& x : f->query) x = 0.3f * nd(rng);
      return f;
    }();
    return *f;
  }

  Bf16Tokens Window(int tokens) const { return {window_keys.data(), window_values.data(), tokens}; }
};

// One item: the pages (range(0) of them) and range(1) window tokens.
void BM_DemoItem(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const int pages = static_cast<int>(state.range(0)), window = static_cast<int>(state.range(1));
  std::vector<float> out(kQHeads * kDim), lse(kQHeads);
  LevelAttentionScratch scratch;
  const absl::Span<const LevelPageRef> refs(f.refs.data(), pages);
  for (auto _ : state) {
    benchmark::DoNotOptimize(LevelAttention(f.codec, refs, f.Window(window), f.query.data(), kQHeads, kScale,
                                            out.data(), lse.data(), &scratch));
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(
      static_cast<double>(pages * kLevelPageTokens + window) * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DemoItem)->Args({kPages, kWindow})->Args({kPages, 0})->Args({0, kWindow})->Unit(benchmark::kMicrosecond);

// The same from memory, not cache, as in the demo, where the model's
// weights pass through the caches between two Attend calls: 64 MiB are
// written (untimed) before each call.
void BM_DemoItemCold(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const int pages = static_cast<int>(state.range(0)), window = static_cast<int>(state.range(1));
  std::vector<float> out(kQHeads * kDim), lse(kQHeads);
  std::vector<uint8_t> evict(64 << 20);
  LevelAttentionScratch scratch;
  const absl::Span<const LevelPageRef> refs(f.refs.data(), pages);
  uint8_t fill = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::fill(evict.begin(), evict.end(), ++fill);
    benchmark::ClobberMemory();
    state.ResumeTiming();
    benchmark::DoNotOptimize(LevelAttention(f.codec, refs, f.Window(window), f.query.data(), kQHeads, kScale,
                                            out.data(), lse.data(), &scratch));
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_DemoItemCold)->Args({kPages, kWindow})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace driftkv

BENCHMARK_MAIN();
