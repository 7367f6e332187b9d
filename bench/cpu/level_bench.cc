// CPU decode attention from the hot tier (level pages, codec/level_page.h)
// against the cold tier (rANS records), one thread, the conversions
// between them, and a new page's two ways into the hot tier (Google
// Benchmark). One layer of 1024 tokens = 8 pages, 8 KV heads x 128, 32
// query heads (GQA 4), no bf16 window, i.i.d. normal
// keys and values at the default containers. The two attentions give the
// same bits (tests/level_page_test.cc); only the level decoding differs.
//   bazel run -c opt //bench/cpu:level_bench
#include <random>
#include <vector>

#include "benchmark/benchmark.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/level_attention.h"
#include "codec/level_page.h"

namespace driftkv {
namespace {

constexpr int kHeads = 8, kDim = 128, kN = kHeads * kDim, kQHeads = 32;
constexpr int kPages = 8, kTokens = kPages * kLevelPageTokens;

struct Fixture {
  DQuantCodec codec;
  LevelPageLayout layout;
  std::vector<std::vector<uint8_t>> keys, values, means, hot;  // per page
  std::vector<CompressedBlock> blocks;
  std::vector<LevelPageRef> refs;
  std::vector<float> query;
  std::vector<std::vector<float>> k_in, v_in;  // per page: the tokens encoded

  static const Fixture& Get() {
    static const Fixture* f = [] {
      DQuantConfig c;
      c.kv_heads = kHeads;
      c.head_dim = kDim;
      auto* f = new Fixture{*DQuantCodec::Create(c)};
      f->layout = *MakeLevelPageLayout(f->codec);
      std::mt19937_64 rng(1);
      std::normal_distribution<float> nd;
      std::vector<float> k(kLevelPageTokens * kN), v(kLevelPageTokens * kN);
      CodecScratch scratch;
      for (int p = 0; p < kPages; ++p) {
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        f->k_in.push_back(k);
        f->v_in.push_back(v);
        f->keys.emplace_back(kLevelPageTokens * f->codec.key_stride());
        f->values.emplace_back(kLevelPageTokens * f->codec.value_stride());
        f->means.emplace_back(f->codec.mean_stride());
        StreamStats ks, vs;
        (void)f->codec.EncodeWindow(k.data(), v.data(), kLevelPageTokens, f->keys[p].data(), f->values[p].data(),
                                    f->means[p].data(), &scratch, &ks, &vs);
        f->hot.emplace_back(f->layout.page_bytes);
        (void)PromotePage(f->codec, f->layout, f->keys[p].data(), f->values[p].data(), f->means[p].data(),
                          kLevelPageTokens, f->hot[p].data());
      }
      for (int p = 0; p < kPages; ++p) {
        f->blocks.push_back({f->keys[p].data(), f->values[p].data(), f->means[p].data(), kLevelPageTokens});
        f->refs.push_back({f->hot[p].data(), kLevelPageTokens});
      }
      f->query.resize(kQHeads * kDim);
      for (float& x : f->query) x = 0.3f * nd(rng);
      return f;
    }();
    return *f;
  }
};

// One query token over the layer's 1024 compressed tokens, from rANS records.
void BM_AttentionCold(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<float> out(kQHeads * kDim), lse(kQHeads);
  AttentionScratch scratch;
  for (auto _ : state) {
    benchmark::DoNotOptimize(CompressedAttention(f.codec, f.blocks, Bf16Tokens{}, f.query.data(), kQHeads, 0.088f,
                                                 out.data(), lse.data(), &scratch));
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(kTokens * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionCold)->Unit(benchmark::kMicrosecond);

// The same query over the same tokens, from level pages.
void BM_AttentionHot(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<float> out(kQHeads * kDim), lse(kQHeads);
  LevelAttentionScratch scratch;
  for (auto _ : state) {
    benchmark::DoNotOptimize(LevelAttention(f.codec, f.refs, Bf16Tokens{}, f.query.data(), kQHeads, 0.088f, out.data(),
                                            lse.data(), &scratch));
    benchmark::ClobberMemory();
  }
  state.counters["tokens/s"] = benchmark::Counter(kTokens * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionHot)->Unit(benchmark::kMicrosecond);

// Fixed-width levels of one page back to [token][n] bytes (the hot path's
// only decoding).
void BM_UnpackLevelPage(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<uint8_t> kl(kLevelPageTokens * kN), vl(kLevelPageTokens * kN), mean(4 + kN);
  std::vector<uint32_t> kh(kLevelPageTokens), vh(kLevelPageTokens);
  int p = 0;
  for (auto _ : state) {
    UnpackLevelPage(f.layout, f.hot[p].data(), kl.data(), vl.data(), kh.data(), vh.data(), mean.data());
    benchmark::ClobberMemory();
    p = (p + 1) % kPages;
  }
  state.counters["pages/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_UnpackLevelPage)->Unit(benchmark::kMicrosecond);

// Cold records of one page (128 tokens) to a level page.
void BM_PromotePage(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<uint8_t> page(f.layout.page_bytes);
  int p = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(PromotePage(f.codec, f.layout, f.keys[p].data(), f.values[p].data(), f.means[p].data(),
                                         kLevelPageTokens, page.data()));
    benchmark::ClobberMemory();
    p = (p + 1) % kPages;
  }
  state.counters["pages/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PromotePage)->Unit(benchmark::kMicrosecond);

// A level page back to cold records (rANS encoding of the known levels).
void BM_DemotePage(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<uint8_t> keys(kLevelPageTokens * f.codec.key_stride()), values(kLevelPageTokens * f.codec.value_stride()),
      mean(f.codec.mean_stride());
  int p = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        DemotePage(f.codec, f.layout, f.hot[p].data(), kLevelPageTokens, keys.data(), values.data(), mean.data()));
    benchmark::ClobberMemory();
    p = (p + 1) % kPages;
  }
  state.counters["pages/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DemotePage)->Unit(benchmark::kMicrosecond);

// A hot layer's new page: 128 tokens encoded cold, then promoted (what the
// service did), against encoded straight into the level page (what it
// does: EncodeLevelPage, the encoder's symbols packed, no rANS decode).
void BM_NewPageEncodeThenPromote(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<uint8_t> keys(kLevelPageTokens * f.codec.key_stride()), values(kLevelPageTokens * f.codec.value_stride()),
      mean(f.codec.mean_stride()), page(f.layout.page_bytes);
  CodecScratch scratch;
  int p = 0;
  for (auto _ : state) {
    StreamStats ks, vs;
    benchmark::DoNotOptimize(f.codec.EncodeWindow(f.k_in[p].data(), f.v_in[p].data(), kLevelPageTokens, keys.data(),
                                                  values.data(), mean.data(), &scratch, &ks, &vs));
    benchmark::DoNotOptimize(
        PromotePage(f.codec, f.layout, keys.data(), values.data(), mean.data(), kLevelPageTokens, page.data()));
    benchmark::ClobberMemory();
    p = (p + 1) % kPages;
  }
  state.counters["pages/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NewPageEncodeThenPromote)->Unit(benchmark::kMicrosecond);

void BM_NewPageStraight(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  std::vector<uint8_t> keys(kLevelPageTokens * f.codec.key_stride()), values(kLevelPageTokens * f.codec.value_stride()),
      mean(f.codec.mean_stride()), page(f.layout.page_bytes);
  CodecScratch scratch;
  int p = 0;
  for (auto _ : state) {
    StreamStats ks, vs;
    benchmark::DoNotOptimize(EncodeLevelPage(f.codec, f.layout, f.k_in[p].data(), f.v_in[p].data(), kLevelPageTokens,
                                             keys.data(), values.data(), mean.data(), page.data(), &scratch, &ks, &vs));
    benchmark::ClobberMemory();
    p = (p + 1) % kPages;
  }
  state.counters["pages/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NewPageStraight)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace driftkv

BENCHMARK_MAIN();
