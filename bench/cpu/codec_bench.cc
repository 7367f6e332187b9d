// CPU codec speed, one core (Google Benchmark). Streams of n = 1024 values
// (8 kv heads x 128) at the default containers, i.i.d. normal input.
//   bazel run -c opt //bench/cpu:codec_bench
#include <vector>

#include "benchmark/benchmark.h"
#include "codec/compressed_attention.h"
#include "codec/dquant_codec.h"
#include "codec/dquant_kv_codec.h"
#include "codec/encoded_layer.h"
#include "codec/registry.h"
#include "eval/synthetic_kv.h"

namespace driftkv {
namespace {

constexpr int kHeads = 8, kDim = 128, kN = kHeads * kDim, kTokens = 512;

struct Fixture {
  std::unique_ptr<KvCodec> codec;
  std::vector<float> keys, values;
  EncodedLayer layer;
  const DQuantCodec& dq() const { return static_cast<const DQuantKvCodec&>(*codec).codec(); }

  static const Fixture& Get() {
    static const Fixture* f = [] {
      auto* f = new Fixture;
      CodecOptions o;
      o.kv_heads = kHeads;
      o.head_dim = kDim;
      f->codec = *MakeKvCodec(o);
      // i.i.d. normal keys and values (eval/synthetic_kv.h, kind "iid").
      SynthParams p;
      p.kind = "iid";
      p.layers = 1;
      p.tokens = kTokens;
      p.kv_heads = kHeads;
      p.head_dim = kDim;
      p.query_tokens = 0;
      SynthKv kv = GenerateSynth(p);
      f->keys = std::move(kv.keys);
      f->values = std::move(kv.values);
      (void)EncodeLayer(*f->codec, f->keys.data(), f->values.data(), kTokens, 0, 1, &f->layer, nullptr);
      return f;
    }();
    return *f;
  }
};

// Encode one window of 128 tokens (keys and values): 256 streams.
void BM_EncodeStreams(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const int count = 128;
  std::vector<uint8_t> k(count * f.codec->key_stride()), v(count * f.codec->value_stride()),
      side(f.codec->side_stride());
  CodecScratch scratch;
  int64_t t0 = 0;
  for (auto _ : state) {
    CodecStats stats;
    benchmark::DoNotOptimize(f.codec->EncodeBlock(f.keys.data() + t0 * kN, f.values.data() + t0 * kN, count, k.data(),
                                                  v.data(), side.data(), &scratch, &stats));
    t0 = (t0 + count) % kTokens;
  }
  state.SetItemsProcessed(state.iterations() * 2 * count);  // streams
  state.counters["streams/s"] = benchmark::Counter(2.0 * count * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeStreams)->Unit(benchmark::kMillisecond);

// rANS decode of one stream to its level indices (what attention consumes).
void BM_DecodeSymbols(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const bool keys = state.range(0) == 0;
  const StreamCodec& sc = keys ? f.dq().key_codec() : f.dq().value_codec();
  const uint8_t* records = keys ? f.layer.key_records.data() : f.layer.value_records.data();
  std::vector<uint8_t> sym(kN);
  int64_t t = 0;
  for (auto _ : state) {
    float s, o;
    benchmark::DoNotOptimize(sc.DecodeSymbols(records + t * sc.stride(), sym.data(), &s, &o));
    benchmark::ClobberMemory();
    t = (t + 1) % kTokens;
  }
  state.SetLabel(keys ? "keys" : "values");
  state.counters["streams/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeSymbols)->Arg(0)->Arg(1);

// Full reconstruction of one token's key or value (levels, grid, mean,
// inverse Hadamard).
void BM_DecodeStreamToFloats(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const bool keys = state.range(0) == 0;
  std::vector<float> out(kN);
  CodecScratch scratch;
  int64_t t = 0;
  for (auto _ : state) {
    if (keys) {
      benchmark::DoNotOptimize(f.dq().DecodeKey(f.layer.key_records.data() + t * f.codec->key_stride(),
                                                f.layer.side.data() + (t / 128) * f.codec->side_stride(), out.data(),
                                                &scratch));
    } else {
      benchmark::DoNotOptimize(
          f.dq().DecodeValue(f.layer.value_records.data() + t * f.codec->value_stride(), out.data(), &scratch));
    }
    t = (t + 1) % kTokens;
  }
  state.SetLabel(keys ? "keys" : "values");
  state.counters["streams/s"] = benchmark::Counter(state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_DecodeStreamToFloats)->Arg(0)->Arg(1);

// Compressed-domain decode attention of one query (32 query heads, GQA 4)
// over 512 compressed tokens.
void BM_CompressedAttention(benchmark::State& state) {
  const Fixture& f = Fixture::Get();
  const std::vector<CompressedBlock> blocks = LayerBlocks(*f.codec, f.layer, kTokens);
  std::vector<float> q(32 * kDim, 0.05f), out(32 * kDim), lse(32);
  AttentionScratch scratch;
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        CompressedAttention(f.dq(), blocks, Bf16Tokens{}, q.data(), 32, 0.088f, out.data(), lse.data(), &scratch));
  }
  state.counters["tokens/s"] = benchmark::Counter(kTokens * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CompressedAttention)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace driftkv

BENCHMARK_MAIN();
