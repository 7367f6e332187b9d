// synth-kv: writes the synthetic KV tensors of eval/synthetic_kv.h as raw f32
// files PREFIX.k, PREFIX.v ([L][T][H][D]) and PREFIX.q ([L][Tq][2H][D]), and
// prints the matching `driftkv-codec` flags.
//
//   synth-kv --out PREFIX [--kind llm|iid] [--layers 4] [--tokens 1024]
//            [--kv-heads 4] [--head-dim 128] [--query-tokens 128] [--seed 1]
//            [--key-mean 1] [--outlier-channels 4] [--outlier-scale 6]
//            [--channel-spread 0.5] [--token-norm-sigma 0.25] [--sink-scale 4]
//            [--value-dof 5] [--query-align 1.5]
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "eval/flags.h"
#include "eval/raw_io.h"
#include "eval/synthetic_kv.h"

int main(int argc, char** argv) {
  using driftkv::Flags;
  Flags f;
  f.set_usage(
      "synth-kv --out PREFIX [--kind llm|iid] [shape and structure flags]: writes PREFIX.k, PREFIX.v, PREFIX.q");
  absl::Status st = f.Parse(argc - 1, argv + 1,
                            {"out", "kind", "layers", "tokens", "kv-heads", "head-dim", "query-tokens", "seed",
                             "key-mean", "outlier-channels", "outlier-scale", "channel-spread", "token-norm-sigma",
                             "sink-scale", "value-dof", "query-align"},
                            {});
  driftkv::SynthParams p;
  p.kind = f.Str("kind", p.kind);
  st.Update(f.Num("layers", &p.layers));
  st.Update(f.Num("tokens", &p.tokens));
  st.Update(f.Num("kv-heads", &p.kv_heads));
  st.Update(f.Num("head-dim", &p.head_dim));
  st.Update(f.Num("query-tokens", &p.query_tokens));
  st.Update(f.Num("seed", &p.seed));
  st.Update(f.Num("key-mean", &p.key_mean));
  st.Update(f.Num("outlier-channels", &p.outlier_channels));
  st.Update(f.Num("outlier-scale", &p.outlier_scale));
  st.Update(f.Num("channel-spread", &p.channel_spread));
  st.Update(f.Num("token-norm-sigma", &p.token_norm_sigma));
  st.Update(f.Num("sink-scale", &p.sink_scale));
  st.Update(f.Num("value-dof", &p.value_dof));
  st.Update(f.Num("query-align", &p.query_align));
  if (st.ok() && !f.Has("out")) st = absl::InvalidArgumentError("--out PREFIX is required");
  if (st.ok()) st = driftkv::ValidateSynth(p);
  if (!st.ok()) {
    std::fprintf(stderr, "synth-kv: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const driftkv::SynthKv kv = driftkv::GenerateSynth(p);
  const std::string out = f.Str("out");
  using driftkv::Dtype;
  st = driftkv::WriteRawTensor(out + ".k", Dtype::kF32, kv.keys.data(), kv.keys.size());
  if (st.ok()) st = driftkv::WriteRawTensor(out + ".v", Dtype::kF32, kv.values.data(), kv.values.size());
  if (st.ok()) st = driftkv::WriteRawTensor(out + ".q", Dtype::kF32, kv.queries.data(), kv.queries.size());
  if (!st.ok()) {
    std::fprintf(stderr, "synth-kv: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("--keys %s.k --values %s.v --queries %s.q --q-heads %d --shape %d,%d,%d,%d --dtype f32\n", out.c_str(),
              out.c_str(), out.c_str(), kv.q_heads, p.layers, p.tokens, p.kv_heads, p.head_dim);
  return 0;
}
