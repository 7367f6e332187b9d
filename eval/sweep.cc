#include "eval/sweep.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "codec/registry.h"
#include "eval/codec_eval.h"
#include "eval/flags.h"
#include "eval/raw_io.h"
#include "eval/sweep_points.h"
#include "eval/transform_flags.h"

namespace driftkv {
namespace {

struct Input {
  int64_t layers = 1, tokens = 0, heads = 0, dim = 0, query_tokens = 0;
  int q_heads = 0;
  std::vector<float> keys, values, queries;
};

absl::Status Load(const Flags& f, Input* in) {
  if (!f.Has("keys") || !f.Has("values") || !f.Has("shape") || !f.Has("out")) {
    return absl::InvalidArgumentError("--keys, --values, --shape and --out are required");
  }
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(f.Str("shape"));
  if (!dims.ok()) return dims.status();
  const size_t off = dims->size() == 4 ? 1 : 0;
  in->layers = off ? (*dims)[0] : 1;
  in->tokens = (*dims)[off];
  in->heads = (*dims)[off + 1];
  in->dim = (*dims)[off + 2];
  absl::StatusOr<Dtype> dtype = ParseDtype(f.Str("dtype", "f32"));
  if (!dtype.ok()) return dtype.status();
  const int64_t count = in->layers * in->tokens * in->heads * in->dim;
  absl::StatusOr<std::vector<float>> k = ReadRawTensor(f.Str("keys"), *dtype, count);
  if (!k.ok()) return k.status();
  absl::StatusOr<std::vector<float>> v = ReadRawTensor(f.Str("values"), *dtype, count);
  if (!v.ok()) return v.status();
  in->keys = *std::move(k);
  in->values = *std::move(v);
  if (!f.Has("queries")) return absl::OkStatus();
  absl::Status st = f.Num("q-heads", &in->q_heads);
  if (!st.ok()) return st;
  if (in->q_heads <= 0) return absl::InvalidArgumentError("--queries needs --q-heads N (N > 0)");
  std::ifstream qf(f.Str("queries"), std::ios::binary | std::ios::ate);
  if (!qf) return absl::NotFoundError(absl::StrCat("cannot open ", f.Str("queries")));
  const int64_t bytes = qf.tellg();
  const int64_t per_token = in->layers * in->q_heads * in->dim * DtypeBytes(*dtype);
  if (bytes % per_token != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        f.Str("queries"), " has ", bytes, " bytes, not a multiple of layers*q_heads*head_dim*dtype = ", per_token));
  }
  in->query_tokens = bytes / per_token;
  absl::StatusOr<std::vector<float>> q = ReadRawTensor(f.Str("queries"), *dtype, bytes / DtypeBytes(*dtype));
  if (!q.ok()) return q.status();
  in->queries = *std::move(q);
  return absl::OkStatus();
}

struct Row {
  bool ok = false;
  std::string line;
};

// Evaluates one point over all layers; the CSV row (without the label).
Row Evaluate(const Input& in, const SweepPoint& p, int64_t residual, const TransformChoice& transform) {
  Row row;
  absl::StatusOr<std::unique_ptr<KvCodec>> codec = MakeKvCodec(p.options);
  if (!codec.ok()) {
    std::fprintf(stderr, "sweep: skipping %s %s: %s\n", p.options.name.c_str(), p.config.c_str(),
                 std::string(codec.status().message()).c_str());
    return row;
  }
  EvalAccumulator acc;
  const int64_t per_layer = in.tokens * in.heads * in.dim;
  for (int64_t l = 0; l < in.layers; ++l) {
    EvalLayerInput e;
    e.keys = in.keys.data() + l * per_layer;
    e.values = in.values.data() + l * per_layer;
    e.tokens = in.tokens;
    e.residual = residual;
    if (!in.queries.empty()) {
      e.queries = in.queries.data() + l * in.query_tokens * in.q_heads * in.dim;
      e.query_tokens = in.query_tokens;
      e.q_heads = in.q_heads;
    }
    // --transform: one codec per layer (eval/transform_flags.h).
    absl::StatusOr<std::unique_ptr<KvCodec>> layer_codec = MakeCodecForLayer(p.options, transform, l);
    absl::Status st = layer_codec.ok() ? EvaluateLayer(**layer_codec, e, &acc, nullptr) : layer_codec.status();
    if (!st.ok()) {
      std::fprintf(stderr, "sweep: %s %s failed at layer %lld: %s\n", p.options.name.c_str(), p.config.c_str(),
                   static_cast<long long>(l), std::string(st.message()).c_str());
      return row;
    }
  }
  auto ratio = [](double x, double y) { return y > 0 ? x / y : 0.0; };
  const double bk = ratio(8.0 * acc.key_bytes, acc.values);
  const double bv = ratio(8.0 * acc.value_bytes, acc.values);
  const StreamStats& k = acc.stats.keys;
  const StreamStats& v = acc.stats.values;
  // Level counts mean something for dquant and fixed only.
  const bool leveled = p.options.name == "dquant" || p.options.name == "fixed";
  row.ok = true;
  row.line = absl::StrFormat(
      "%s,%s,%s,%d,%d,%.6f,%.6f,%.6f,%.6g,%.6g,%s,%.6g,%.6g,%.6g,%.6g,%d", p.options.name, p.config, p.tag,
      leveled ? p.options.key_levels : 0, leveled ? p.options.value_levels : 0, bk, bv, 0.5 * (bk + bv),
      ratio(acc.err_k, acc.sum_k), ratio(acc.err_v, acc.sum_v),
      acc.has_attention ? absl::StrFormat("%.6g", std::sqrt(ratio(acc.attn_err, acc.attn_sum))) : std::string(""),
      ratio(k.moved, k.symbols), ratio(v.moved, v.symbols), ratio(k.bytes_used, k.bytes_budget),
      ratio(v.bytes_used, v.bytes_budget), std::max(k.max_move, v.max_move));
  return row;
}

constexpr char kHeader[] =
    "label,codec,config,tag,key_levels,value_levels,bits_k,bits_v,bits,nmse_k,nmse_v,"
    "attn_rel_err,drift_rate_k,drift_rate_v,budget_util_k,budget_util_v,max_move";

}  // namespace

int RunSweep(int argc, char** argv) {
  Flags f;
  f.set_usage("driftkv-codec sweep --codec A,B,... --keys K --values V [--queries Q] --shape ... --out DIR");
  std::set<std::string> switches = TransformSwitches();
  switches.insert("no-plot");
  absl::Status st = f.Parse(argc - 1, argv + 1,
                            WithTransformFlags({"codec", "keys", "values", "queries", "q-heads", "shape", "dtype",
                                                "residual", "out", "label", "jobs", "plot-script"}),
                            switches);
  Input in;
  if (st.ok()) st = Load(f, &in);
  TransformChoice transform;
  if (st.ok()) {
    absl::StatusOr<TransformChoice> t = TransformFromFlags(f);
    if (t.ok()) {
      transform = *std::move(t);
    } else {
      st = t.status();
    }
  }
  int64_t residual = 0;
  int jobs = 2;
  if (st.ok()) st.Update(f.Num("residual", &residual));
  if (st.ok()) st.Update(f.Num("jobs", &jobs));
  std::vector<SweepPoint> points;
  if (st.ok()) {
    const std::vector<std::string> names =
        absl::StrSplit(f.Str("codec", "dquant,int,kivi,oscar,turbo,fixed,fp8,bf16"), ',');
    absl::StatusOr<std::vector<SweepPoint>> p =
        SweepPoints(names, static_cast<int>(in.heads), static_cast<int>(in.dim));
    if (p.ok()) {
      points = *std::move(p);
    } else {
      st = p.status();
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "driftkv-codec sweep: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const std::string dir = f.Str("out");
  if (std::system(absl::StrCat("mkdir -p '", dir, "'").c_str()) != 0) {
    std::fprintf(stderr, "driftkv-codec sweep: cannot create %s\n", dir.c_str());
    return 1;
  }
  const std::string label = f.Str("label", "data");
  std::vector<Row> rows(points.size());
  std::atomic<size_t> next{0};
  std::mutex log_mu;
  auto worker = [&] {
    for (size_t i; (i = next++) < points.size();) {
      rows[i] = Evaluate(in, points[i], residual, transform);
      std::lock_guard<std::mutex> lock(log_mu);
      std::fprintf(stderr, "sweep [%zu/%zu] %s %s %s\n", i + 1, points.size(), points[i].options.name.c_str(),
                   points[i].config.c_str(), rows[i].ok ? "" : "(skipped)");
    }
  };
  std::vector<std::thread> threads;
  for (int j = 0; j < std::max(1, jobs); ++j) threads.emplace_back(worker);
  for (auto& t : threads) t.join();

  const std::string csv = dir + "/sweep.csv";
  std::ofstream out(csv);
  out << kHeader << "\n";
  for (const Row& r : rows) {
    if (r.ok) out << label << "," << r.line << "\n";
  }
  out.close();
  if (!out) {
    std::fprintf(stderr, "driftkv-codec sweep: cannot write %s\n", csv.c_str());
    return 1;
  }
  std::fprintf(stderr, "wrote %s\n", csv.c_str());
  if (f.Has("no-plot")) return 0;
  const std::string script = f.Str("plot-script", "tools/plot_sweep.py");
  // Debian's matplotlib is importable by the system interpreter only.
  const char* python = std::ifstream("/usr/bin/python3").good() ? "/usr/bin/python3" : "python3";
  const std::string cmd = absl::StrCat(python, " '", script, "' '", csv, "' '", dir, "'");
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "driftkv-codec sweep: plotting failed; rerun: %s\n", cmd.c_str());
    return 1;
  }
  return 0;
}

}  // namespace driftkv
