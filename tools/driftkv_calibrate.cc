// driftkv-calibrate: WUSH-KV transforms from captured activations.
//
//   driftkv-calibrate --keys K --values V --queries Q [--keys K2 --values V2
//                     --queries Q2 ...] --shape L,T,H,D --q-heads N
//                     [--dtype f16] [--wo W --hidden E] [--gamma 0.01]
//                     [--center-keys W]
//                     --out TRANSFORMS
// K, V: [L][T][H][D]; Q: [L][Tq][N][D] (Tq from the file size, may differ
// per triple); W: [L][E][N*D] o_proj weights, f32 or --dtype (told apart by
// the file size). --center-keys W takes the key Gram matrix over keys minus
// their W-token block mean (for D-Quant, whose window mean W is 128;
// sequences in K must then be multiples of W tokens long). Files are raw
// little-endian, as for driftkv-codec. Reads
// one layer of one file at a time; the output is the transforms file of
// codec/transform/transforms_file.h.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codec/transform/transforms_file.h"
#include "eval/flags.h"
#include "eval/raw_io.h"
#include "eval/wush_calibrator.h"
#include "wire/half.h"

namespace driftkv {
namespace {

int64_t FileBytes(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return -1;
  std::fseek(f, 0, SEEK_END);
  const int64_t n = std::ftell(f);
  std::fclose(f);
  return n;
}

// Elements [first, first + count) of a raw tensor file, as floats.
absl::StatusOr<std::vector<float>> ReadSlice(const std::string& path, Dtype dtype, int64_t first, int64_t count) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  const int bytes = DtypeBytes(dtype);
  std::vector<uint8_t> raw(count * bytes);
  std::fseek(f, first * bytes, SEEK_SET);
  const size_t got = std::fread(raw.data(), 1, raw.size(), f);
  std::fclose(f);
  if (got != raw.size()) return absl::DataLossError(absl::StrCat("short read from ", path));
  std::vector<float> out(count);
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* p = raw.data() + i * bytes;
    if (dtype == Dtype::kF32) {
      out[i] = BitsToFloat(p[0] | p[1] << 8 | p[2] << 16 | static_cast<uint32_t>(p[3]) << 24);
    } else {
      const uint16_t h = static_cast<uint16_t>(p[0] | p[1] << 8);
      out[i] = dtype == Dtype::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
    }
  }
  return out;
}

struct Triple {
  std::string keys, values, queries;
};

// Pulls the repeatable --keys/--values/--queries out of argv.
absl::Status SplitTriples(int argc, char** argv, std::vector<Triple>* triples, std::vector<char*>* rest) {
  std::vector<std::string> k, v, q;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    std::vector<std::string>* dst = nullptr;
    std::string value;
    for (auto [name, list] :
         {std::pair<const char*, std::vector<std::string>*>{"keys", &k}, {"values", &v}, {"queries", &q}}) {
      const std::string flag = absl::StrCat("--", name);
      if (a == flag) {
        if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(flag, " needs a value"));
        dst = list;
        value = argv[++i];
      } else if (a.rfind(flag + "=", 0) == 0) {
        dst = list;
        value = a.substr(flag.size() + 1);
      }
    }
    if (dst) {
      dst->push_back(value);
    } else {
      rest->push_back(argv[i]);
    }
  }
  if (k.empty() || k.size() != v.size() || k.size() != q.size()) {
    return absl::InvalidArgumentError(absl::StrCat("need as many --keys, --values and --queries (got ", k.size(), ", ",
                                                   v.size(), ", ", q.size(), "), at least one each"));
  }
  for (size_t i = 0; i < k.size(); ++i) triples->push_back({k[i], v[i], q[i]});
  return absl::OkStatus();
}

absl::Status Run(int argc, char** argv) {
  std::vector<Triple> triples;
  std::vector<char*> rest;
  bool help = false;
  for (int i = 0; i < argc; ++i) help |= std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h";
  absl::Status st = SplitTriples(argc, argv, &triples, &rest);
  if (!st.ok() && !help) return st;
  Flags f;
  f.set_usage(
      "driftkv-calibrate --keys K --values V --queries Q [--keys K2 --values V2 --queries Q2 ...]\n"
      "                  --shape L,T,H,D --q-heads N [--dtype f16] [--wo W --hidden E] [--gamma 0.01]\n"
      "                  [--center-keys W] --out TRANSFORMS\n"
      "(--keys, --values and --queries repeat, one triple per input)");
  st = f.Parse(static_cast<int>(rest.size()), rest.data(),
               {"shape", "q-heads", "dtype", "wo", "hidden", "gamma", "out", "center-keys"}, {});
  if (!st.ok()) return st;
  if (!f.Has("shape") || !f.Has("q-heads") || !f.Has("out")) {
    return absl::InvalidArgumentError("--shape L,T,H,D, --q-heads N and --out TRANSFORMS are required");
  }
  absl::StatusOr<std::vector<int64_t>> dims = ParseShape(f.Str("shape"));
  if (!dims.ok()) return dims.status();
  if (dims->size() != 4) return absl::InvalidArgumentError("--shape must be L,T,H,D");
  const int64_t L = (*dims)[0], T = (*dims)[1], H = (*dims)[2], D = (*dims)[3];
  int q_heads = 0;
  int64_t hidden = 0;
  double gamma = kWushDefaultGamma;
  int center = 0;
  st.Update(f.Num("center-keys", &center));
  if (center < 0) return absl::InvalidArgumentError(absl::StrCat("--center-keys ", center, " must be >= 0"));
  st.Update(f.Num("q-heads", &q_heads));
  st.Update(f.Num("hidden", &hidden));
  st.Update(f.Num("gamma", &gamma));
  if (!st.ok()) return st;
  absl::StatusOr<Dtype> dtype = ParseDtype(f.Str("dtype", "f32"));
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<WushCalibrator> cal =
      WushCalibrator::Create(static_cast<int>(L), static_cast<int>(H), q_heads, static_cast<int>(D));
  if (!cal.ok()) return cal.status();
  cal->set_key_center_window(center);
  const auto start = std::chrono::steady_clock::now();

  const int64_t per_layer = T * H * D, q_row = static_cast<int64_t>(q_heads) * D;
  const int eb = DtypeBytes(*dtype);
  for (const Triple& t : triples) {
    for (const std::string* p : {&t.keys, &t.values, &t.queries}) {
      if (FileBytes(*p) < 0) return absl::NotFoundError(absl::StrCat("cannot open ", *p));
    }
    for (const std::string* p : {&t.keys, &t.values}) {
      if (FileBytes(*p) != L * per_layer * eb) {
        return absl::InvalidArgumentError(absl::StrCat(*p, " has ", FileBytes(*p), " bytes; --shape ", f.Str("shape"),
                                                       " and --dtype need ", L * per_layer * eb));
      }
    }
    const int64_t qbytes = FileBytes(t.queries);
    if (qbytes <= 0 || qbytes % (L * q_row * eb) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(t.queries, " has ", qbytes, " bytes, not a positive multiple of ",
                                                     "layers * q_heads * head_dim * dtype = ", L * q_row * eb));
    }
    const int64_t tq = qbytes / (L * q_row * eb);
    for (int64_t l = 0; l < L; ++l) {
      absl::StatusOr<std::vector<float>> k = ReadSlice(t.keys, *dtype, l * per_layer, per_layer);
      if (!k.ok()) return k.status();
      absl::StatusOr<std::vector<float>> v = ReadSlice(t.values, *dtype, l * per_layer, per_layer);
      if (!v.ok()) return v.status();
      absl::StatusOr<std::vector<float>> q = ReadSlice(t.queries, *dtype, l * tq * q_row, tq * q_row);
      if (!q.ok()) return q.status();
      st = cal->AddLayer(static_cast<int>(l), k->data(), v->data(), T, q->data(), tq);
      if (!st.ok()) return st;
    }
  }
  if (f.Has("wo")) {
    if (hidden <= 0) return absl::InvalidArgumentError("--wo needs --hidden E (E > 0)");
    const int64_t per = hidden * q_row, bytes = FileBytes(f.Str("wo"));
    if (bytes < 0) return absl::NotFoundError(absl::StrCat("cannot open ", f.Str("wo")));
    Dtype wdt = Dtype::kF32;
    if (bytes != L * per * 4) {
      if (bytes != L * per * eb) {
        return absl::InvalidArgumentError(absl::StrCat(f.Str("wo"), " has ", bytes, " bytes; [L][E][N*D] needs ",
                                                       L * per * 4, " (f32) or ", L * per * eb, " (--dtype)"));
      }
      wdt = *dtype;
    }
    for (int64_t l = 0; l < L; ++l) {
      absl::StatusOr<std::vector<float>> w = ReadSlice(f.Str("wo"), wdt, l * per, per);
      if (!w.ok()) return w.status();
      st = cal->AddOutputProjection(static_cast<int>(l), w->data(), hidden);
      if (!st.ok()) return st;
    }
  }
  absl::StatusOr<TransformSet> set = cal->Build(gamma);
  if (!set.ok()) return set.status();
  st = WriteTransformsFile(f.Str("out"), *set);
  if (!st.ok()) return st;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr,
               "wrote %s: %lld layers x %lld kv heads, head_dim %lld, %zu input(s), %llu key tokens per layer, "
               "value Hessian %s, gamma %g, %.1f s\n",
               f.Str("out").c_str(), static_cast<long long>(L), static_cast<long long>(H), static_cast<long long>(D),
               triples.size(), static_cast<unsigned long long>(set->calibration_tokens),
               f.Has("wo") ? "from W_O" : "identity", gamma, secs);
  return absl::OkStatus();
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  absl::Status st = driftkv::Run(argc - 1, argv + 1);
  if (!st.ok()) {
    std::fprintf(stderr, "driftkv-calibrate: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
