// wush-ablation: attention and module-output error of codecs behind the
// identity, Hadamard and WUSH transforms (docs/quality.md).
//
// Real tensors (the fixture's layout, several windows of all layers):
//   wush-ablation --keys K --values V --queries Q --windows W --shape L,T,H,D
//                 --q-heads N [--dtype f16] --transforms F [--wo WO --hidden E]
// K, V: [W][L][T][H][D]; Q: [W][L][Tq][N][D]; WO: [L][E][N*D] f32.
// Synthetic spike case (eval/synthetic_kv.h): calibrates on --calib-draws
// draws, evaluates on --draws others:
//   wush-ablation --synthetic-spike [--draws 4] [--calib-draws 8] [--seed 1]
//                 [--spike 40] [--spike-probability 0.005] [--query-read 6]
//                 [--center-keys W]
// Prints one markdown table: per transform and codec, stored bits per value,
// attention error with keys only / values only / both quantized, module
// error (with W_O) and the per-layer attention error (both quantized).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "codec/transform/transform.h"
#include "eval/flags.h"
#include "eval/raw_io.h"
#include "eval/synthetic_kv.h"
#include "eval/wush_calibrator.h"
#include "eval/wush_eval.h"

namespace driftkv {
namespace {

struct Config {
  std::string label;
  CodecOptions options;
};

// int INT2/INT4 (g128) and dquant at its default (~2.26 b/v) and at the
// sweep's 1.96 point (bench/kl_eval.py's formula for stream length n).
std::vector<Config> Configs(int kv_heads, int head_dim) {
  const int n = kv_heads * head_dim;
  std::vector<Config> out;
  CodecOptions base;
  base.kv_heads = kv_heads;
  base.head_dim = head_dim;
  for (int bits : {2, 4}) {
    Config c{absl::StrCat("int --bits ", bits), base};
    c.options.name = "int";
    c.options.bits = bits;
    out.push_back(c);
  }
  Config d{"dquant (default)", base};
  out.push_back(d);
  const double kb = 2.69 / 2.265 * 1.96, vb = 1.84 / 2.265 * 1.96;
  const int mean_stride = (n + 4 + 3) / 4 * 4;
  Config e{"dquant (1.96 point)", base};
  e.options.key_levels = std::min(16, std::max(3, static_cast<int>(std::lround(std::pow(2.0, kb + 0.31)))));
  e.options.value_levels = std::min(16, std::max(3, static_cast<int>(std::lround(std::pow(2.0, vb + 0.74)))));
  e.options.key_bytes = static_cast<int>(std::floor((kb * n / 8 - mean_stride / 128.0) / 4)) * 4 - 4;
  e.options.value_bytes = static_cast<int>(std::floor((vb * n / 8) / 4)) * 4 - 4;
  e.label = absl::StrCat("dquant --k-bytes ", e.options.key_bytes, " --v-bytes ", e.options.value_bytes, " --k-levels ",
                         e.options.key_levels, " --v-levels ", e.options.value_levels);
  out.push_back(e);
  return out;
}

constexpr TransformKind kKinds[] = {TransformKind::kIdentity, TransformKind::kHadamard, TransformKind::kWush};
constexpr const char* kKindNames[] = {"identity", "hadamard", "wush"};

struct Job {
  AblationInput in;
  int layer = 0;
};

// results[(kind * configs + config) * layers + layer]
absl::Status RunJobs(const std::vector<Job>& jobs, const std::vector<Config>& configs, const TransformSet& set,
                     int threads, std::vector<AblationErrors>* results) {
  const int layers = set.layers;
  results->assign(3 * configs.size() * layers, AblationErrors());
  std::vector<std::vector<AblationErrors>> partial(jobs.size(), std::vector<AblationErrors>(results->size()));
  std::vector<absl::Status> status(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&]() {
    for (size_t j; (j = next++) < jobs.size();) {
      const Job& job = jobs[j];
      const std::vector<float> ref = AttentionOutputs(job.in, job.in.keys, job.in.values);
      for (int k = 0; k < 3; ++k) {
        for (size_t c = 0; c < configs.size(); ++c) {
          absl::StatusOr<std::unique_ptr<KvCodec>> codec =
              MakeTransformedCodec(configs[c].options, kKinds[k], &set, job.layer, false);
          absl::Status st = codec.status();
          if (st.ok())
            st = MeasureAblation(**codec, job.in, ref, &partial[j][(k * configs.size() + c) * layers + job.layer]);
          if (!st.ok() && status[j].ok()) status[j] = st;
        }
      }
      std::fprintf(stderr, "job %zu of %zu done\n", j + 1, jobs.size());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!status[j].ok()) return status[j];
    for (size_t i = 0; i < results->size(); ++i) (*results)[i].Add(partial[j][i]);
  }
  return absl::OkStatus();
}

void Print(const std::vector<Config>& configs, int layers, bool module, const std::vector<AblationErrors>& r) {
  std::printf("| transform | codec | bits/value | attn err K | attn err V | attn err KV |%s per-layer attn err KV |\n",
              module ? " module err K | module err V | module err KV | geo-mean module err KV over layers |" : "");
  std::printf("|---|---|---|---|---|---|%s---|\n", module ? "---|---|---|---|" : "");
  for (size_t c = 0; c < configs.size(); ++c) {
    for (int k = 0; k < 3; ++k) {
      AblationErrors all;
      std::string per_layer;
      double log_sum = 0.0;
      for (int l = 0; l < layers; ++l) {
        const AblationErrors& e = r[(k * configs.size() + c) * layers + l];
        all.Add(e);
        absl::StrAppendFormat(&per_layer, "%s%.4f", l ? " / " : "", e.attention(kBoth));
        log_sum += std::log(std::max(1e-30, e.module(kBoth)));
      }
      const double bits = all.values ? 4.0 * (all.key_bytes + all.value_bytes) / all.values : 0.0;
      std::printf("| %s | %s | %.3f | %.4f | %.4f | %.4f |", kKindNames[k], configs[c].label.c_str(), bits,
                  all.attention(kKeysOnly), all.attention(kValuesOnly), all.attention(kBoth));
      if (module) {
        std::printf(" %.4f | %.4f | %.4f | %.4f |", all.module(kKeysOnly), all.module(kValuesOnly), all.module(kBoth),
                    std::exp(log_sum / layers));
      }
      std::printf(" %s |\n", per_layer.c_str());
    }
  }
}

absl::Status RunReal(const Flags& f) {
  for (const char* need : {"keys", "values", "queries", "windows", "shape", "q-heads", "transforms"}) {
    if (!f.Has(need)) return absl::InvalidArgumentError(absl::StrCat("--", need, " is required"));
  }
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(f.Str("shape"));
  if (!dims.ok()) return dims.status();
  if (dims->size() != 4) return absl::InvalidArgumentError("--shape must be L,T,H,D");
  const int64_t L = (*dims)[0], T = (*dims)[1], H = (*dims)[2], D = (*dims)[3];
  int64_t W = 0, hidden = 0;
  int q_heads = 0, threads = 2;
  absl::Status st = f.Num("windows", &W);
  st.Update(f.Num("q-heads", &q_heads));
  st.Update(f.Num("hidden", &hidden));
  st.Update(f.Num("threads", &threads));
  if (!st.ok()) return st;
  absl::StatusOr<Dtype> dtype = ParseDtype(f.Str("dtype", "f32"));
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<TransformSet> set = ReadTransformsFile(f.Str("transforms"));
  if (!set.ok()) return set.status();
  if (set->layers != L || set->kv_heads != H || set->head_dim != D) {
    return absl::InvalidArgumentError(absl::StrCat("transforms are ", set->layers, " x ", set->kv_heads, " x ",
                                                   set->head_dim, ", tensors ", L, " x ", H, " x ", D));
  }
  const int64_t per = T * H * D;
  absl::StatusOr<std::vector<float>> k = ReadRawTensor(f.Str("keys"), *dtype, W * L * per);
  if (!k.ok()) return k.status();
  absl::StatusOr<std::vector<float>> v = ReadRawTensor(f.Str("values"), *dtype, W * L * per);
  if (!v.ok()) return v.status();
  std::vector<float> q;
  {
    FILE* fq = std::fopen(f.Str("queries").c_str(), "rb");
    if (!fq) return absl::NotFoundError(absl::StrCat("cannot open ", f.Str("queries")));
    std::fseek(fq, 0, SEEK_END);
    const int64_t bytes = std::ftell(fq);
    std::fclose(fq);
    const int64_t elems = bytes / DtypeBytes(*dtype);
    absl::StatusOr<std::vector<float>> qq = ReadRawTensor(f.Str("queries"), *dtype, elems);
    if (!qq.ok()) return qq.status();
    q = *std::move(qq);
  }
  const int64_t tq = static_cast<int64_t>(q.size()) / (W * L * q_heads * D);
  if (tq * W * L * q_heads * D != static_cast<int64_t>(q.size()) || tq > T) {
    return absl::InvalidArgumentError("queries file does not hold [W][L][Tq][N][D] with Tq <= T");
  }
  std::vector<float> wo;
  if (f.Has("wo")) {
    absl::StatusOr<std::vector<float>> w = ReadRawTensor(f.Str("wo"), Dtype::kF32, L * hidden * q_heads * D);
    if (!w.ok()) return w.status();
    wo = *std::move(w);
  }
  std::vector<Job> jobs;
  for (int64_t w = 0; w < W; ++w) {
    for (int64_t l = 0; l < L; ++l) {
      Job j;
      j.layer = static_cast<int>(l);
      j.in.keys = k->data() + (w * L + l) * per;
      j.in.values = v->data() + (w * L + l) * per;
      j.in.tokens = T;
      j.in.queries = q.data() + (w * L + l) * tq * q_heads * D;
      j.in.query_tokens = tq;
      j.in.kv_heads = static_cast<int>(H);
      j.in.q_heads = q_heads;
      j.in.head_dim = static_cast<int>(D);
      if (!wo.empty()) {
        j.in.wo = wo.data() + l * hidden * q_heads * D;
        j.in.hidden = hidden;
      }
      jobs.push_back(j);
    }
  }
  const std::vector<Config> configs = Configs(static_cast<int>(H), static_cast<int>(D));
  std::vector<AblationErrors> r;
  st = RunJobs(jobs, configs, *set, threads, &r);
  if (!st.ok()) return st;
  std::printf("%lld windows x %lld layers, %lld tokens, %lld queries per window-layer\n\n", static_cast<long long>(W),
              static_cast<long long>(L), static_cast<long long>(T), static_cast<long long>(tq));
  Print(configs, static_cast<int>(L), !wo.empty(), r);
  return absl::OkStatus();
}

absl::Status RunSpike(const Flags& f) {
  int draws = 4, threads = 2, calib_draws = 8, center = 0;
  uint64_t seed = 1;
  absl::Status st = f.Num("draws", &draws);
  st.Update(f.Num("calib-draws", &calib_draws));
  st.Update(f.Num("center-keys", &center));
  st.Update(f.Num("seed", &seed));
  st.Update(f.Num("threads", &threads));
  if (!st.ok()) return st;
  SpikeOptions o;
  o.seed = seed;
  st.Update(f.Num("spike", &o.spike));
  st.Update(f.Num("spike-probability", &o.spike_probability));
  st.Update(f.Num("query-read", &o.query_read));
  if (!st.ok()) return st;
  // Calibration draws use seeds seed, seed + 1000, ...: disjoint from the
  // evaluation draws seed + 1 .. seed + draws.
  absl::StatusOr<WushCalibrator> c = WushCalibrator::Create(1, o.kv_heads, o.q_heads, o.head_dim);
  if (!c.ok()) return c.status();
  c->set_key_center_window(center);
  for (int i = 0; i < calib_draws; ++i) {
    SpikeOptions co = o;
    co.seed = seed + 1000 * i;
    const SpikeCase cal = MakeSpikeCase(co);
    st = c->AddLayer(0, cal.keys.data(), cal.values.data(), o.tokens, cal.queries.data(), o.query_tokens);
    if (!st.ok()) return st;
  }
  absl::StatusOr<TransformSet> set = c->Build();
  if (!set.ok()) return set.status();
  std::vector<SpikeCase> cases;
  for (int i = 1; i <= draws; ++i) {
    SpikeOptions e = o;
    e.seed = seed + i;
    cases.push_back(MakeSpikeCase(e));
  }
  std::vector<Job> jobs;
  for (const SpikeCase& s : cases) {
    Job j;
    j.in.keys = s.keys.data();
    j.in.values = s.values.data();
    j.in.tokens = o.tokens;
    j.in.queries = s.queries.data();
    j.in.query_tokens = o.query_tokens;
    j.in.kv_heads = o.kv_heads;
    j.in.q_heads = o.q_heads;
    j.in.head_dim = o.head_dim;
    jobs.push_back(j);
  }
  const std::vector<Config> configs = Configs(o.kv_heads, o.head_dim);
  std::vector<AblationErrors> r;
  st = RunJobs(jobs, configs, *set, threads, &r);
  if (!st.ok()) return st;
  std::printf(
      "synthetic spike case: %lld tokens, %d kv heads x %d, %d query heads, spike %.0f on coordinate 0 with "
      "probability %.3f, queries read it with mean %.1f; calibrated on %d draws (%d tokens), evaluated on %d other "
      "draws%s\n\n",
      static_cast<long long>(o.tokens), o.kv_heads, o.head_dim, o.q_heads, o.spike, o.spike_probability, o.query_read,
      calib_draws, calib_draws * static_cast<int>(o.tokens), draws,
      center ? absl::StrCat(", keys centered over ", center, "-token blocks").c_str() : "");
  Print(configs, 1, false, r);
  return absl::OkStatus();
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  driftkv::Flags f;
  f.set_usage(
      "wush-ablation --keys K --values V --queries Q --windows W --shape L,T,H,D --q-heads N [--dtype f16]\n"
      "              --transforms F [--wo WO --hidden E]\n"
      "wush-ablation --synthetic-spike [--draws 4] [--calib-draws 8] [--seed 1] [--spike 40]\n"
      "              [--spike-probability 0.005] [--query-read 6] [--center-keys W]");
  absl::Status st =
      f.Parse(argc - 1, argv + 1,
              {"keys", "values", "queries", "windows", "shape", "q-heads", "dtype", "transforms", "wo", "hidden",
               "threads", "draws", "seed", "spike", "spike-probability", "query-read", "calib-draws", "center-keys"},
              {"synthetic-spike"});
  if (st.ok()) st = f.Has("synthetic-spike") ? driftkv::RunSpike(f) : driftkv::RunReal(f);
  if (!st.ok()) {
    std::fprintf(stderr, "wush-ablation: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
