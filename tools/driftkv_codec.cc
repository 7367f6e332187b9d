// driftkv-codec: evaluate, encode and decode KV tensors with any codec.
//
//   driftkv-codec eval   --keys K --values V --shape [L,]T,H,D [--dtype f32]
//                        [--queries Q --q-heads N] [codec flags] [--residual R] [--json]
//   driftkv-codec encode --keys K --values V --shape [L,]T,H,D [codec flags]
//                        [--residual R] --out POOL
//   driftkv-codec decode --in POOL --out PREFIX [--dtype f32]
//                        (writes PREFIX.k and PREFIX.v, [L][T][H][D])
//   driftkv-codec sweep  ...   (see eval/sweep.h)
//   driftkv-codec demo         (built-in synthetic KV, human-readable)
// Codec flags: --codec NAME --k-levels --v-levels --k-bytes --v-bytes
// --v-refit --alpha --mean-window --bits --group --kappa-k --kappa-v --seed.
// Transform flags (eval, encode, decode, sweep): eval/transform_flags.h.
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codec/pool_file.h"
#include "codec/registry.h"
#include "eval/codec_eval.h"
#include "eval/flags.h"
#include "eval/raw_io.h"
#include "eval/sweep.h"
#include "eval/synthetic_kv.h"
#include "eval/transform_flags.h"

namespace driftkv {
namespace {

const std::set<std::string> kCodecFlags = {"codec",   "k-levels",    "v-levels", "k-bytes", "v-bytes",
                                           "alpha",   "mean-window", "bits",     "group",   "kappa-k",
                                           "kappa-v", "seed",        "rotation", "v-refit"};

absl::Status CodecFromFlags(const Flags& f, int kv_heads, int head_dim, CodecOptions* o) {
  o->name = f.Str("codec", "dquant");
  o->rotation = f.Str("rotation", "hadamard");
  o->kv_heads = kv_heads;
  o->head_dim = head_dim;
  absl::Status st;
  st.Update(f.Num("k-levels", &o->key_levels));
  st.Update(f.Num("v-levels", &o->value_levels));
  st.Update(f.Num("k-bytes", &o->key_bytes));
  st.Update(f.Num("v-bytes", &o->value_bytes));
  st.Update(f.Num("alpha", &o->alpha));
  st.Update(f.Num("mean-window", &o->mean_window));
  st.Update(f.Num("bits", &o->bits));
  st.Update(f.Num("group", &o->group));
  st.Update(f.Num("kappa-k", &o->kappa_k));
  st.Update(f.Num("kappa-v", &o->kappa_v));
  st.Update(f.Num("seed", &o->seed));
  if (f.Has("v-refit")) {
    absl::StatusOr<Refit> r = ParseRefit(f.Str("v-refit"));
    if (!r.ok()) return absl::InvalidArgumentError(absl::StrCat("--v-refit: ", r.status().message()));
    o->value_refit = *r;
  }
  return st;
}

struct Tensors {
  int64_t layers = 1, tokens = 0, heads = 0, dim = 0;
  std::vector<float> keys, values, queries;
  int64_t query_tokens = 0;
  int q_heads = 0;
};

absl::Status LoadTensors(const Flags& f, bool want_queries, Tensors* t) {
  if (!f.Has("keys") || !f.Has("values") || !f.Has("shape")) {
    return absl::InvalidArgumentError("--keys, --values and --shape are required");
  }
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(f.Str("shape"));
  if (!dims.ok()) return dims.status();
  const size_t off = dims->size() == 4 ? 1 : 0;
  t->layers = off ? (*dims)[0] : 1;
  t->tokens = (*dims)[off];
  t->heads = (*dims)[off + 1];
  t->dim = (*dims)[off + 2];
  absl::StatusOr<Dtype> dtype = ParseDtype(f.Str("dtype", "f32"));
  if (!dtype.ok()) return dtype.status();
  const int64_t count = t->layers * t->tokens * t->heads * t->dim;
  absl::StatusOr<std::vector<float>> k = ReadRawTensor(f.Str("keys"), *dtype, count);
  if (!k.ok()) return k.status();
  absl::StatusOr<std::vector<float>> v = ReadRawTensor(f.Str("values"), *dtype, count);
  if (!v.ok()) return v.status();
  t->keys = *std::move(k);
  t->values = *std::move(v);
  if (want_queries && f.Has("queries")) {
    absl::Status st = f.Num("q-heads", &t->q_heads);
    if (!st.ok()) return st;
    if (t->q_heads <= 0) return absl::InvalidArgumentError("--queries needs --q-heads N (N > 0)");
    // The query count follows from the file size: [L][Tq][N][D].
    FILE* fq = std::fopen(f.Str("queries").c_str(), "rb");
    if (!fq) return absl::NotFoundError(absl::StrCat("cannot open ", f.Str("queries")));
    std::fseek(fq, 0, SEEK_END);
    const int64_t bytes = std::ftell(fq);
    std::fclose(fq);
    const int64_t per_token = t->layers * t->q_heads * t->dim * DtypeBytes(*dtype);
    if (bytes % per_token != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.Str("queries"), " has ", bytes, " bytes, not a multiple of layers*q_heads*head_dim*dtype = ", per_token));
    }
    t->query_tokens = bytes / per_token;
    absl::StatusOr<std::vector<float>> q = ReadRawTensor(f.Str("queries"), *dtype, bytes / DtypeBytes(*dtype));
    if (!q.ok()) return q.status();
    t->queries = *std::move(q);
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& st) {
  std::fprintf(stderr, "driftkv-codec: %s\n", std::string(st.message()).c_str());
  return 1;
}

std::set<std::string> With(std::set<std::string> a, std::initializer_list<std::string> b) {
  a.insert(b);
  return a;
}

// Runs eval (and, with `pool_out`, keeps the encoded layers).
absl::Status EvalTensors(const Flags& f, const Tensors& t, bool print_json, const std::string& pool_out) {
  CodecOptions options;
  absl::Status st = CodecFromFlags(f, static_cast<int>(t.heads), static_cast<int>(t.dim), &options);
  if (!st.ok()) return st;
  absl::StatusOr<TransformChoice> transform = TransformFromFlags(f);
  if (!transform.ok()) return transform.status();
  options = StoredOptions(options, *transform);
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(options);
  if (!codec.ok()) return codec.status();
  int64_t residual = 0;
  int threads = 1;
  st.Update(f.Num("residual", &residual));
  st.Update(f.Num("threads", &threads));
  if (!st.ok()) return st;
  EvalAccumulator acc;
  Pool pool;
  pool.options = options;
  pool.transform = PoolTransformOf(*transform);
  pool.tokens = t.tokens;
  const int64_t per_layer = t.tokens * t.heads * t.dim;
  for (int64_t l = 0; l < t.layers; ++l) {
    EvalLayerInput in;
    in.keys = t.keys.data() + l * per_layer;
    in.values = t.values.data() + l * per_layer;
    in.tokens = t.tokens;
    in.residual = residual;
    in.threads = threads;
    // --values-folded: eval is given the model's values and simulates the
    // folded model (eval/codec_eval.h); encode stores the values as given,
    // already folded, as the folded model emits them.
    in.values_already_folded = !pool_out.empty();
    if (!t.queries.empty()) {
      in.queries = t.queries.data() + l * t.query_tokens * t.q_heads * t.dim;
      in.query_tokens = t.query_tokens;
      in.q_heads = t.q_heads;
    }
    EncodedLayer enc;
    EvalAccumulator layer_acc;
    absl::StatusOr<std::unique_ptr<KvCodec>> layer_codec = MakeCodecForLayer(options, *transform, l);
    if (!layer_codec.ok()) return layer_codec.status();
    st = EvaluateLayer(**layer_codec, in, &layer_acc, pool_out.empty() ? nullptr : &enc);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("layer ", l, ": ", st.message()));
    if (print_json && f.Has("per-layer")) {
      std::printf("{\"layer\":%lld,%s\n", static_cast<long long>(l), EvalJson(**codec, layer_acc).c_str() + 1);
    }
    acc.Add(layer_acc);
    if (!pool_out.empty()) pool.layers.push_back(std::move(enc));
  }
  if (print_json) std::printf("%s\n", EvalJson(**codec, acc).c_str());
  if (!pool_out.empty()) {
    pool.codec = *std::move(codec);
    st = WritePoolFile(pool_out, pool);
    if (!st.ok()) return st;
    std::fprintf(stderr, "wrote %s (%lld layers x %lld tokens)\n", pool_out.c_str(), static_cast<long long>(t.layers),
                 static_cast<long long>(t.tokens));
  }
  return absl::OkStatus();
}

int Eval(int argc, char** argv) {
  Flags f;
  f.set_usage("driftkv-codec eval --keys K --values V --shape [L,]T,H,D [--queries Q --q-heads N] [flags]");
  absl::Status st = f.Parse(argc, argv,
                            With(WithTransformFlags(kCodecFlags),
                                 {"keys", "values", "shape", "dtype", "queries", "q-heads", "residual", "threads"}),
                            With(TransformSwitches(), {"json", "per-layer"}));
  if (!st.ok()) return Fail(st);
  Tensors t;
  st = LoadTensors(f, true, &t);
  if (st.ok()) st = EvalTensors(f, t, true, "");
  return st.ok() ? 0 : Fail(st);
}

int Encode(int argc, char** argv) {
  Flags f;
  f.set_usage("driftkv-codec encode --keys K --values V --shape [L,]T,H,D --out POOL [flags]");
  absl::Status st =
      f.Parse(argc, argv,
              With(WithTransformFlags(kCodecFlags), {"keys", "values", "shape", "dtype", "residual", "threads", "out"}),
              With(TransformSwitches(), {"json"}));
  if (!st.ok()) return Fail(st);
  if (!f.Has("out")) return Fail(absl::InvalidArgumentError("--out POOL is required"));
  Tensors t;
  st = LoadTensors(f, false, &t);
  if (st.ok()) st = EvalTensors(f, t, f.Has("json"), f.Str("out"));
  return st.ok() ? 0 : Fail(st);
}

int Decode(int argc, char** argv) {
  Flags f;
  f.set_usage("driftkv-codec decode --in POOL --out PREFIX [--dtype f32] [transform flags]");
  absl::Status st = f.Parse(argc, argv, With(TransformValueFlags(), {"in", "out", "dtype"}), TransformSwitches());
  if (!st.ok()) return Fail(st);
  if (!f.Has("in") || !f.Has("out")) return Fail(absl::InvalidArgumentError("--in POOL and --out PREFIX are required"));
  absl::StatusOr<Dtype> dtype = ParseDtype(f.Str("dtype", "f32"));
  if (!dtype.ok()) return Fail(dtype.status());
  absl::StatusOr<Pool> pool = ReadPoolFile(f.Str("in"));
  if (!pool.ok()) return Fail(pool.status());
  absl::StatusOr<TransformChoice> transform = TransformFromFlags(f);
  if (!transform.ok()) return Fail(transform.status());
  st = MatchPoolTransform(pool->options, pool->transform, f, &*transform);
  if (!st.ok()) return Fail(st);
  const int64_t per_layer = pool->tokens * pool->codec->n();
  std::vector<float> keys(per_layer * pool->layers.size()), values(keys.size());
  for (size_t l = 0; l < pool->layers.size(); ++l) {
    absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeCodecForLayer(pool->options, *transform, l);
    if (!codec.ok()) return Fail(codec.status());
    st = DecodeLayer(**codec, pool->layers[l], keys.data() + l * per_layer, values.data() + l * per_layer);
    if (!st.ok()) return Fail(absl::DataLossError(absl::StrCat("layer ", l, ": ", st.message())));
  }
  st = WriteRawTensor(f.Str("out") + ".k", *dtype, keys.data(), keys.size());
  if (st.ok()) st = WriteRawTensor(f.Str("out") + ".v", *dtype, values.data(), values.size());
  if (!st.ok()) return Fail(st);
  std::fprintf(stderr, "wrote %s.k and %s.v: [%zu][%lld][%d][%d] %s\n", f.Str("out").c_str(), f.Str("out").c_str(),
               pool->layers.size(), static_cast<long long>(pool->tokens), pool->codec->kv_heads(),
               pool->codec->head_dim(), f.Str("dtype", "f32").c_str());
  return 0;
}

// Built-in synthetic KV (eval/synthetic_kv.h): kind "iid", and kind "llm"
// (per-channel key means, outlier channels, uneven token norms, RoPE,
// queries that look at the keys); one layer each.
Tensors Synthetic(bool structured, int tokens, int heads, int dim, int query_tokens) {
  SynthParams p;
  p.kind = structured ? "llm" : "iid";
  p.layers = 1;
  p.tokens = tokens;
  p.kv_heads = heads;
  p.head_dim = dim;
  p.query_tokens = query_tokens;
  p.seed = structured ? 2 : 1;
  SynthKv kv = GenerateSynth(p);
  Tensors t;
  t.tokens = tokens;
  t.heads = heads;
  t.dim = dim;
  t.keys = std::move(kv.keys);
  t.values = std::move(kv.values);
  t.queries = std::move(kv.queries);
  t.q_heads = kv.q_heads;
  t.query_tokens = query_tokens;
  return t;
}

int Demo(int argc, char** argv) {
  Flags f;
  f.set_usage("driftkv-codec demo [codec flags]");
  absl::Status st = f.Parse(argc, argv, With(kCodecFlags, {"residual", "threads"}), {});
  if (!st.ok()) return Fail(st);
  std::printf(
      "driftkv codec demo: D-Quant on built-in synthetic KV (512 tokens, 8 kv heads x 128, 16 query heads)\n\n");
  for (int structured = 0; structured < 2; ++structured) {
    const Tensors t = Synthetic(structured, 512, 8, 128, 32);
    CodecOptions options;
    st = CodecFromFlags(f, 8, 128, &options);
    if (!st.ok()) return Fail(st);
    absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(options);
    if (!codec.ok()) return Fail(codec.status());
    EvalAccumulator acc;
    EvalLayerInput in;
    in.keys = t.keys.data();
    in.values = t.values.data();
    in.tokens = t.tokens;
    in.queries = t.queries.data();
    in.query_tokens = t.query_tokens;
    in.q_heads = t.q_heads;
    st = f.Num("residual", &in.residual);
    if (st.ok()) st = EvaluateLayer(**codec, in, &acc, nullptr);
    if (!st.ok()) return Fail(st);
    const StreamStats& k = acc.stats.keys;
    const StreamStats& v = acc.stats.values;
    const double bk = 8.0 * acc.key_bytes / acc.values, bv = 8.0 * acc.value_bytes / acc.values;
    std::printf("%s\n", structured ? "LLM-like (channel means, outlier channels, uneven token norms, RoPE)"
                                   : "i.i.d. standard normal");
    std::printf("  bits per value      keys %.3f  values %.3f  mean %.3f  (%.1fx smaller than bf16)\n", bk, bv,
                0.5 * (bk + bv), 32.0 / (bk + bv));
    std::printf("  NMSE                keys %.4f  values %.4f\n", acc.err_k / acc.sum_k, acc.err_v / acc.sum_v);
    std::printf("  attention rel. err  %.4f (32 causal queries, compressed-domain path)\n",
                std::sqrt(acc.attn_err / acc.attn_sum));
    std::printf("  drift               keys %.2f%%  values %.2f%% of symbols moved, largest move %d level(s)\n",
                100.0 * k.moved / k.symbols, 100.0 * v.moved / v.symbols, std::max(k.max_move, v.max_move));
    std::printf("  container use       keys %.1f%%  values %.1f%% of the payload; overflow retries %lld\n",
                100.0 * k.bytes_used / k.bytes_budget, 100.0 * v.bytes_used / v.bytes_budget,
                static_cast<long long>(k.retries + v.retries));
    std::printf("  speed (1 core)      encode %.0f streams/s, decode %.0f streams/s\n\n",
                acc.encoded_streams / acc.encode_seconds, acc.encoded_streams / acc.decode_seconds);
  }
  return 0;
}

// The usage text; to stdout with status 0 for --help, else to stderr with 2.
int Usage(bool help = false) {
  std::fprintf(help ? stdout : stderr,
               "usage: driftkv-codec eval|encode|decode|sweep|demo [flags]\n"
               "  eval   --keys K --values V --shape [L,]T,H,D [--dtype f32|f16|bf16]\n"
               "         [--queries Q --q-heads N] [--residual R] [--json] [--per-layer] [codec flags]\n"
               "  encode --keys K --values V --shape [L,]T,H,D [--residual R] --out POOL [codec flags]\n"
               "  decode --in POOL --out PREFIX [--dtype f32]   (writes PREFIX.k, PREFIX.v)\n"
               "  sweep  --codec A,B,... --keys K --values V [--queries Q] --shape ... --out DIR\n"
               "  demo   (synthetic KV)\n"
               "codec flags: --codec NAME --k-levels 8 --v-levels 6 --k-bytes 331 --v-bytes 231\n"
               "  --v-refit least_squares|unbiased|norm --alpha 1.4 --mean-window 128 --bits 2 --group 128 --kappa-k "
               "0.96 --kappa-v 0.92\n"
               "  --rotation hadamard|identity\n"
               "transform flags (eval, encode, decode, sweep): --transform identity|hadamard|wush\n"
               "  --transforms FILE (driftkv-calibrate) [--layer L] [--values-folded]\n"
               "  (--values-folded: eval and sweep fold the given model values themselves, v' = T_V v,\n"
               "  and report errors in the model's domain; encode stores the given values as folded)\n"
               "driftkv-codec COMMAND --help lists the flags of one command.\n");
  return help ? 0 : 2;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  using namespace driftkv;
  if (argc < 2) return Usage();
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return Usage(true);
  if (cmd == "eval") return Eval(argc - 2, argv + 2);
  if (cmd == "encode") return Encode(argc - 2, argv + 2);
  if (cmd == "decode") return Decode(argc - 2, argv + 2);
  if (cmd == "sweep") return RunSweep(argc - 1, argv + 1);
  if (cmd == "demo") return Demo(argc - 2, argv + 2);
  return Usage();
}
