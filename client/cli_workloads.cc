// The long-running commands of the `driftkv` CLI: bench, demo, fixture.
// Exact attention is computed by the client in float64 over the original
// float keys/values (codec/attention.h ReferenceAttention); errors use the
// definition of `driftkv-codec eval` (tools/eval_lib.h): attn_rel_err =
// sqrt(sum (o - ref)^2 / sum ref^2) over all queries and heads.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "codec/attention.h"
#include "codec/dquant_codec.h"
#include "codec/half.h"
#include "service/tensor.h"

ABSL_FLAG(double, query_focus, 0.25,
          "synthetic queries: weight of the past key they copy (higher: sharper attention)");
ABSL_FLAG(int, streams, 4, "bench/demo/push: concurrent Append calls per sequence (layers split between them)");
ABSL_FLAG(int, sequences, 8, "bench: concurrent sequences (one client thread each)");
ABSL_FLAG(int, steps, 32, "bench/demo: decode steps per sequence");
ABSL_FLAG(std::string, fixture, "/work/shared/eval/fixture_public",
          "fixture: path prefix of .k.bin/.v.bin/.q.bin");
ABSL_FLAG(int, prefill, 896, "fixture: tokens pushed before the decode steps");
ABSL_FLAG(bool, local_check, true,
          "fixture: also replay the service's storage rule with the codec in-process");

namespace driftkv {
namespace cli {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

ClientOptions OptionsFromFlags() {
  ClientOptions o;
  o.target = absl::GetFlag(FLAGS_server);
  o.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  return o;
}

void SyntheticLayer(int tokens, int kv_heads, int head_dim, uint32_t seed, std::vector<float>* keys,
                    std::vector<float>* values) {
  const int n = kv_heads * head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> offset(n), drift(n), value_offset(n);
  for (int j = 0; j < n; ++j) {
    value_offset[j] = 0.5f * g(rng);  // values have channel structure too
    // Two outlier channels per head (a low-frequency RoPE pair in real keys).
    const int c = j % head_dim;
    offset[j] = 0.6f * g(rng) + ((c == head_dim / 2 - 1 || c == head_dim - 1) ? 8.0f : 0.0f);
    drift[j] = 0.3f * g(rng);
  }
  keys->resize(static_cast<size_t>(tokens) * n);
  values->resize(keys->size());
  for (int t = 0; t < tokens; ++t) {
    const float phase = std::sin(t * 0.01f);
    for (int j = 0; j < n; ++j) {
      (*keys)[static_cast<size_t>(t) * n + j] = offset[j] + drift[j] * phase + g(rng);
      (*values)[static_cast<size_t>(t) * n + j] = value_offset[j] + 0.5f * g(rng);
    }
  }
}

std::vector<float> SyntheticQuery(const std::vector<float>& keys, int tokens, int kv_heads,
                                  int head_dim, int q_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, tokens - 1);
  const int n = kv_heads * head_dim, group = q_heads / kv_heads;
  std::vector<float> q(static_cast<size_t>(q_heads) * head_dim);
  for (int h = 0; h < q_heads; ++h) {
    const float* k = keys.data() + static_cast<size_t>(pick(rng)) * n + (h / group) * head_dim;
    const float focus = static_cast<float>(absl::GetFlag(FLAGS_query_focus));
    for (int j = 0; j < head_dim; ++j) q[h * head_dim + j] = focus * k[j] + g(rng);
  }
  return q;
}

void AccumulateError(const std::vector<float>& out, const float* keys, const float* values,
                     int64_t tokens, int kv_heads, int head_dim, const float* query, int q_heads,
                     double scale, double* err, double* sum) {
  std::vector<double> ref(static_cast<size_t>(q_heads) * head_dim), lse(q_heads);
  ReferenceAttention(keys, values, tokens, kv_heads, head_dim, query, q_heads, scale, ref.data(),
                     lse.data());
  for (size_t i = 0; i < ref.size(); ++i) {
    *err += (out[i] - ref[i]) * (out[i] - ref[i]);
    *sum += ref[i] * ref[i];
  }
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(std::max<int64_t>(total, 1)), tty_(isatty(2) != 0) {}

void Progress::Update(int64_t done) {
  if (!tty_) return;
  const int p = static_cast<int>(100 * done / total_);
  if (p == last_percent_) return;
  last_percent_ = p;
  std::fprintf(stderr, "\r%s %3d%% (%lld/%lld)", label_.c_str(), p, static_cast<long long>(done),
               static_cast<long long>(total_));
}

void Progress::Done() {
  if (tty_ && last_percent_ >= 0) std::fprintf(stderr, "\n");
}

double Quantile(std::vector<double>* v, double q) {
  if (v->empty()) return 0;
  std::sort(v->begin(), v->end());
  const size_t i = std::min(v->size() - 1, static_cast<size_t>(std::ceil(q * v->size())) - (q > 0 ? 1 : 0));
  return (*v)[i];
}

namespace {

int Fail(const absl::Status& st) {
  std::cerr << "driftkv: " << absl::StatusCodeToString(st.code()) << ": " << st.message() << "\n";
  return 1;
}

v1::AttendItem StepItem(const std::string& seq, uint32_t layer, const float* key, const float* value,
                        size_t n, uint64_t index, const std::vector<float>& q, int q_heads) {
  v1::AttendItem it;
  it.set_sequence_id(seq);
  it.set_layer(layer);
  it.set_dtype(v1::DTYPE_BF16);
  it.set_q_heads(q_heads);
  FloatToTensor(q.data(), q.size(), v1::DTYPE_BF16, it.mutable_query());
  FloatToTensor(key, n, v1::DTYPE_BF16, it.mutable_new_key());
  FloatToTensor(value, n, v1::DTYPE_BF16, it.mutable_new_value());
  it.set_new_token_index(index);
  return it;
}

// Rounds through bf16, as the queries and steps travel.
std::vector<float> Bf16(const float* x, size_t count) {
  std::vector<float> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = Bf16ToFloat(FloatToBf16(x[i]));
  return out;
}

}  // namespace

int Bench(Client& client) {
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  const int layers = info->layers(), kv_heads = info->kv_heads(), d = info->head_dim();
  const size_t n = static_cast<size_t>(kv_heads) * d;
  const int q_heads = absl::GetFlag(FLAGS_q_heads) > 0 ? absl::GetFlag(FLAGS_q_heads) : 2 * kv_heads;
  const int seqs = absl::GetFlag(FLAGS_sequences), tokens = absl::GetFlag(FLAGS_tokens);
  const int steps = absl::GetFlag(FLAGS_steps), chunk = absl::GetFlag(FLAGS_chunk_tokens);
  // One synthetic context per layer, shared by all sequences (the server
  // encodes each sequence's copy anyway).
  std::vector<std::vector<float>> keys(layers), values(layers);
  for (int l = 0; l < layers; ++l) {
    SyntheticLayer(tokens + steps, kv_heads, d, absl::GetFlag(FLAGS_seed) * 1000 + l, &keys[l], &values[l]);
  }
  std::vector<v1::AppendChunk> chunks;  // layer-interleaved, as a prefill produces them
  for (int t = 0; t < tokens; t += chunk) {
    for (int l = 0; l < layers; ++l) {
      const int c = std::min(chunk, tokens - t);
      chunks.push_back(MakeChunk("", l, t, c, keys[l].data() + t * n, values[l].data() + t * n, n,
                                 v1::DTYPE_BF16));
    }
  }
  const std::vector<float> q = SyntheticQuery(keys[0], tokens, kv_heads, d, q_heads, 7);
  std::printf("bench: %d sequences x %d layers x %d tokens (kv_heads %d, head_dim %d, bf16; %d-token chunks, %d "
              "concurrent Append calls per sequence), then %d decode steps of %d items (one per layer, q_heads %d), "
              "server %s\n",
              seqs, layers, tokens, kv_heads, d, chunk, absl::GetFlag(FLAGS_streams), steps, layers, q_heads,
              absl::GetFlag(FLAGS_server).c_str());

  std::atomic<int> failures{0};
  std::atomic<int64_t> ingested{0};
  Progress progress("ingest", static_cast<int64_t>(seqs) * chunks.size());
  auto t0 = Clock::now();
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<Client>> clients;
  for (int s = 0; s < seqs; ++s) clients.push_back(std::make_unique<Client>(client.options()));
  for (int s = 0; s < seqs; ++s) {
    threads.emplace_back([&, s] {
      std::vector<v1::AppendChunk> mine = chunks;
      for (v1::AppendChunk& c : mine) c.set_sequence_id(absl::StrCat("bench-", s));
      // Several Append calls of 4 layers' worth, so progress can move.
      const size_t per_call = static_cast<size_t>(layers) * 4;
      for (size_t i = 0; i < mine.size(); i += per_call) {
        const size_t m = std::min(per_call, mine.size() - i);
        absl::StatusOr<v1::AppendResponse> r = clients[s]->AppendConcurrently(
            absl::MakeConstSpan(mine).subspan(i, m), absl::GetFlag(FLAGS_streams));
        if (!r.ok()) {
          if (failures++ == 0) std::cerr << "\nappend: " << r.status() << "\n";
          return;
        }
        progress.Update(ingested += m);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double ingest_s = SecondsSince(t0);
  progress.Done();
  threads.clear();
  if (failures > 0) return 1;
  const double raw_bytes = 2.0 * seqs * layers * tokens * n * 2;  // keys + values, bf16

  std::vector<std::vector<double>> latency(seqs);
  std::atomic<int64_t> done_steps{0};
  Progress decode("decode", static_cast<int64_t>(seqs) * steps);
  t0 = Clock::now();
  for (int s = 0; s < seqs; ++s) {
    threads.emplace_back([&, s] {
      const std::string seq = absl::StrCat("bench-", s);
      for (int step = 0; step < steps; ++step) {
        v1::AttendRequest req;
        const int pos = tokens + step;
        for (int l = 0; l < layers; ++l) {
          *req.add_items() = StepItem(seq, l, keys[l].data() + pos * n, values[l].data() + pos * n, n,
                                      pos, q, q_heads);
        }
        const auto a = Clock::now();
        absl::StatusOr<v1::AttendResponse> r = clients[s]->Attend(req);
        latency[s].push_back(SecondsSince(a));
        if (!r.ok()) {
          if (failures++ == 0) std::cerr << "\nattend: " << r.status() << "\n";
          return;
        }
        decode.Update(++done_steps);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double decode_s = SecondsSince(t0);
  decode.Done();
  if (failures > 0) return 1;
  std::vector<double> all;
  for (auto& v : latency) all.insert(all.end(), v.begin(), v.end());
  const double calls = static_cast<double>(all.size());
  const double avg_ctx = tokens + (steps + 1) / 2.0;
  absl::StatusOr<v1::StatsResponse> stats = client.Stats();
  for (int s = 0; s < seqs; ++s) (void)client.Release(absl::StrCat("bench-", s));
  std::printf("ingest: %.3f s, %.3f GB/s raw (bf16 keys+values), %.0f tokens/s (all %d layers), %.0f token-layers/s\n",
              ingest_s, raw_bytes / ingest_s / 1e9, seqs * static_cast<double>(tokens) / ingest_s, layers,
              seqs * static_cast<double>(tokens) * layers / ingest_s);
  std::printf("attend: %.0f calls in %.3f s, %.1f calls/s, %.1f items/s, %.3g attended tokens/s (context ~%.0f)\n",
              calls, decode_s, calls / decode_s, calls * layers / decode_s,
              calls * layers * avg_ctx / decode_s, avg_ctx);
  const double p50 = Quantile(&all, 0.50) * 1e3, p99 = Quantile(&all, 0.99) * 1e3;
  std::printf("attend latency per call (%d items): p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", layers, p50, p99,
              all.empty() ? 0.0 : all.back() * 1e3);
  if (stats.ok()) {
    std::printf("pool after decode: %llu pages in use (%.1f MB), %llu tokens compressed, %llu in bf16 windows\n",
                static_cast<unsigned long long>(stats->pages_in_use()), stats->bytes_in_use() / 1e6,
                static_cast<unsigned long long>(stats->tokens_compressed()),
                static_cast<unsigned long long>(stats->tokens_window()));
  }
  return 0;
}

int Demo(Client& client) {
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  const int layers = info->layers(), kv_heads = info->kv_heads(), d = info->head_dim();
  const size_t n = static_cast<size_t>(kv_heads) * d;
  const int q_heads = absl::GetFlag(FLAGS_q_heads) > 0 ? absl::GetFlag(FLAGS_q_heads) : 2 * kv_heads;
  const int tokens = absl::GetFlag(FLAGS_tokens), steps = absl::GetFlag(FLAGS_steps);
  const int chunk = absl::GetFlag(FLAGS_chunk_tokens);
  const std::string seq = absl::GetFlag(FLAGS_sequence);
  std::printf("driftkv demo: server %s (%s backend, %d layers x %d kv_heads x %d head_dim, dquant %.2f/%.2f bits "
              "per key/value, pages of %u tokens, bf16 window %u tokens)\n",
              absl::GetFlag(FLAGS_server).c_str(), info->backend().c_str(), layers, kv_heads, d,
              info->key_bits_per_value(), info->value_bits_per_value(), info->page_tokens(), info->window_tokens());
  std::vector<std::vector<float>> keys(layers), values(layers);
  for (int l = 0; l < layers; ++l) {
    SyntheticLayer(tokens + steps, kv_heads, d, absl::GetFlag(FLAGS_seed) * 1000 + l, &keys[l], &values[l]);
  }
  // 1. Layer-wise ingest, as a prefill worker would stream it.
  std::vector<v1::AppendChunk> chunks;
  for (int t = 0; t < tokens; t += chunk) {
    for (int l = 0; l < layers; ++l) {
      const int c = std::min(chunk, tokens - t);
      chunks.push_back(MakeChunk(seq, l, t, c, keys[l].data() + t * n, values[l].data() + t * n, n, v1::DTYPE_BF16));
    }
  }
  auto t0 = Clock::now();
  absl::StatusOr<v1::AppendResponse> pushed = client.AppendConcurrently(chunks, absl::GetFlag(FLAGS_streams));
  if (!pushed.ok()) return Fail(pushed.status());
  const double push_s = SecondsSince(t0);
  const double raw = 2.0 * layers * tokens * n * 2;
  std::printf("1. pushed %d tokens x %d layers of synthetic keys/values (%.1f MB bf16) in %.3f s: %.1f MB/s, "
              "%.0f tokens/s\n", tokens,
              layers, raw / 1e6, push_s, raw / push_s / 1e6, tokens / push_s);

  // 2. Decode steps: each appends one token per layer and attends.
  double err = 0, sum = 0, attend_s = 0;
  std::vector<double> lat;
  Progress progress("decode", steps);
  for (int step = 0; step < steps; ++step) {
    const int pos = tokens + step;
    v1::AttendRequest req;
    std::vector<std::vector<float>> qs(layers);
    for (int l = 0; l < layers; ++l) {
      std::vector<float> q = SyntheticQuery(keys[l], pos + 1, kv_heads, d, q_heads, 100 * step + l);
      qs[l] = Bf16(q.data(), q.size());
      *req.add_items() = StepItem(seq, l, keys[l].data() + pos * n, values[l].data() + pos * n, n, pos, q, q_heads);
    }
    const auto a = Clock::now();
    absl::StatusOr<v1::AttendResponse> r = client.Attend(req);
    lat.push_back(SecondsSince(a));
    attend_s += lat.back();
    if (!r.ok()) return Fail(r.status());
    for (int l = 0; l < layers; ++l) {
      // Exact attention over the original float tokens [0, pos].
      AccumulateError(OutputFloats(r->results(l)), keys[l].data(), values[l].data(), pos + 1, kv_heads, d,
                      qs[l].data(), q_heads, 1.0 / std::sqrt(static_cast<double>(d)), &err, &sum);
    }
    progress.Update(step + 1);
  }
  progress.Done();
  const double rel = std::sqrt(err / std::max(sum, 1e-300));
  std::printf("2. %d decode steps x %d layers: attention vs exact float64 attention on the original keys/values: "
              "relative L2 error %.4f\n", steps, layers, rel);
  std::printf("   Attend: p50 %.2f ms, p99 %.2f ms per call of %d items, %.1f items/s\n", Quantile(&lat, 0.5) * 1e3,
              Quantile(&lat, 0.99) * 1e3, layers, steps * layers / attend_s);

  // 3. What it costs in memory.
  absl::StatusOr<v1::StatsResponse> s = client.Stats();
  if (!s.ok()) return Fail(s.status());
  const double compressed_raw = 4.0 * s->tokens_compressed() * n;  // bf16 keys + values
  const double all_raw = 4.0 * (s->tokens_compressed() + s->tokens_window()) * n;
  std::printf("3. stored %llu tokens compressed in %llu pages (%.2f MB) + %llu tokens in bf16 windows (%.2f MB)\n",
              static_cast<unsigned long long>(s->tokens_compressed()),
              static_cast<unsigned long long>(s->pages_in_use()), s->bytes_in_use() / 1e6,
              static_cast<unsigned long long>(s->tokens_window()), s->window_bytes() / 1e6);
  std::printf("   compression vs bf16: %.2fx on compressed pages, %.2fx overall including the bf16 windows\n",
              s->bytes_in_use() > 0 ? compressed_raw / s->bytes_in_use() : 0.0,
              all_raw / std::max<double>(1.0, s->bytes_in_use() + s->window_bytes()));
  std::printf("   symbols moved by drift: keys %.1f%%, values %.1f%%\n",
              100.0 * s->symbols_moved_key() / std::max<uint64_t>(1, s->symbols_key()),
              100.0 * s->symbols_moved_value() / std::max<uint64_t>(1, s->symbols_value()));
  absl::StatusOr<v1::ReleaseResponse> rel_seq = client.Release(seq);
  if (!rel_seq.ok()) return Fail(rel_seq.status());
  std::printf("4. released %s (%llu pages). Metrics: %s\n", seq.c_str(),
              static_cast<unsigned long long>(rel_seq->pages_freed()), absl::GetFlag(FLAGS_metrics_url).c_str());
  if (!(rel < 0.5)) {
    std::printf("demo FAILED: error %.4f is not that of a working codec\n", rel);
    return 1;
  }
  std::printf("demo OK\n");
  return 0;
}

int Fixture(Client& client) {
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  constexpr int kSeqs = 2, kLayers = 4, kTokens = 1024, kKvHeads = 4, kD = 128, kQueries = 128, kQHeads = 8;
  constexpr size_t kN = kKvHeads * kD;
  if (info->layers() != kLayers || info->kv_heads() != kKvHeads || info->head_dim() != kD) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "the fixture is 4 layers x 4 kv_heads x 128; the server serves ", info->layers(), " x ",
        info->kv_heads(), " x ", info->head_dim())));
  }
  const int prefill = absl::GetFlag(FLAGS_prefill);
  if (prefill < 1 || prefill + kQueries > kTokens) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--prefill ", prefill, " out of range [1, 896]")));
  }
  std::string raw[3];
  const char* ext[3] = {".k.bin", ".v.bin", ".q.bin"};
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(absl::GetFlag(FLAGS_fixture) + ext[i], std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", absl::GetFlag(FLAGS_fixture), ext[i])));
    raw[i].assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t kv_bytes = static_cast<size_t>(kSeqs) * kLayers * kTokens * kN * 2;
  if (raw[0].size() != kv_bytes || raw[1].size() != kv_bytes ||
      raw[2].size() != static_cast<size_t>(kSeqs) * kLayers * kQueries * kQHeads * kD * 2) {
    return Fail(absl::InvalidArgumentError("fixture files do not have the documented sizes"));
  }
  auto layer_bytes = [&](int i, int s, int l, int t0, int count) {
    const size_t at = ((static_cast<size_t>(s) * kLayers + l) * kTokens + t0) * kN * 2;
    return raw[i].substr(at, static_cast<size_t>(count) * kN * 2);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  double err[kLayers] = {}, sum[kLayers] = {}, lerr[kLayers] = {}, lsum[kLayers] = {}, diff = 0, dsum = 0;
  absl::StatusOr<DQuantCodec> codec = absl::InvalidArgumentError("unused");
  if (absl::GetFlag(FLAGS_local_check)) {
    DQuantConfig c;
    c.kv_heads = kKvHeads;
    c.head_dim = kD;
    c.key_levels = info->key_levels();
    c.value_levels = info->value_levels();
    c.key_bytes = info->key_payload_bytes();
    c.value_bytes = info->value_payload_bytes();
    c.alpha = info->alpha();
    c.mean_window = info->page_tokens();
    codec = DQuantCodec::Create(c);
    if (!codec.ok()) return Fail(codec.status());
  }
  const int p = info->page_tokens(), r = info->window_tokens();
  auto t0 = Clock::now();
  double attend_s = 0;
  for (int s = 0; s < kSeqs; ++s) {
    const std::string seq = absl::StrCat("fixture-", s);
    // Prefill: fp16 bytes straight from the files, 128-token chunks, layer-wise.
    std::vector<v1::AppendChunk> chunks;
    for (int t = 0; t < prefill; t += 128) {
      for (int l = 0; l < kLayers; ++l) {
        const int c = std::min(128, prefill - t);
        v1::AppendChunk ch;
        ch.set_sequence_id(seq);
        ch.set_layer(l);
        ch.set_first_token(t);
        ch.set_token_count(c);
        ch.set_dtype(v1::DTYPE_FP16);
        ch.set_keys(layer_bytes(0, s, l, t, c));
        ch.set_values(layer_bytes(1, s, l, t, c));
        chunks.push_back(std::move(ch));
      }
    }
    absl::StatusOr<v1::AppendResponse> a = client.Append(chunks);
    if (!a.ok()) return Fail(a.status());
    // Originals in float, for the exact attention and the local replay.
    std::vector<std::vector<float>> k(kLayers), v(kLayers), q(kLayers);
    std::vector<std::vector<uint8_t>> kr(kLayers), vr(kLayers), mr(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      k[l].resize(kTokens * kN);
      v[l].resize(kTokens * kN);
      q[l].resize(kQueries * kQHeads * kD);
      TensorToFloat(layer_bytes(0, s, l, 0, kTokens), v1::DTYPE_FP16, k[l].size(), k[l].data());
      TensorToFloat(layer_bytes(1, s, l, 0, kTokens), v1::DTYPE_FP16, v[l].size(), v[l].data());
      TensorToFloat(raw[2].substr((static_cast<size_t>(s) * kLayers + l) * kQueries * kQHeads * kD * 2,
                                  q[l].size() * 2),
                    v1::DTYPE_FP16, q[l].size(), q[l].data());
      if (codec.ok()) {
        // The service encodes page j from the bf16 tokens [jP, (j+1)P).
        const int pages = kTokens / p;
        kr[l].resize(static_cast<size_t>(pages) * p * codec->key_stride());
        vr[l].resize(static_cast<size_t>(pages) * p * codec->value_stride());
        mr[l].resize(static_cast<size_t>(pages) * codec->mean_stride());
        const std::vector<float> kb = Bf16(k[l].data(), k[l].size()), vb = Bf16(v[l].data(), v[l].size());
        CodecScratch scratch;
        StreamStats ks, vs;
        for (int j = 0; j < pages; ++j) {
          absl::Status st = codec->EncodeWindow(kb.data() + static_cast<size_t>(j) * p * kN,
                                                vb.data() + static_cast<size_t>(j) * p * kN, p,
                                                kr[l].data() + static_cast<size_t>(j) * p * codec->key_stride(),
                                                vr[l].data() + static_cast<size_t>(j) * p * codec->value_stride(),
                                                mr[l].data() + j * codec->mean_stride(), &scratch, &ks, &vs);
          if (!st.ok()) return Fail(st);
        }
      }
    }
    Progress progress(absl::StrCat("fixture seq ", s), kQueries);
    AttentionScratch as;
    for (int i = 0; i < kQueries; ++i) {
      const int pos = prefill + i;
      v1::AttendRequest req;
      for (int l = 0; l < kLayers; ++l) {
        v1::AttendItem* it = req.add_items();
        it->set_sequence_id(seq);
        it->set_layer(l);
        it->set_dtype(v1::DTYPE_FP16);
        it->set_q_heads(kQHeads);
        // Query i of the fixture sits at position 896 + i; with another
        // --prefill it is reused at position prefill + i.
        it->set_query(raw[2].substr(((static_cast<size_t>(s) * kLayers + l) * kQueries + i) * kQHeads * kD * 2,
                                    kQHeads * kD * 2));
        it->set_new_key(layer_bytes(0, s, l, pos, 1));
        it->set_new_value(layer_bytes(1, s, l, pos, 1));
        it->set_new_token_index(pos);
      }
      const auto a = Clock::now();
      absl::StatusOr<v1::AttendResponse> resp = client.Attend(req);
      attend_s += SecondsSince(a);
      if (!resp.ok()) return Fail(resp.status());
      for (int l = 0; l < kLayers; ++l) {
        const std::vector<float> out = OutputFloats(resp->results(l));
        const float* qi = q[l].data() + static_cast<size_t>(i) * kQHeads * kD;
        AccumulateError(out, k[l].data(), v[l].data(), pos + 1, kKvHeads, kD, qi, kQHeads, scale, &err[l], &sum[l]);
        if (codec.ok()) {
          const int tokens = pos + 1;
          const int pages = tokens >= r + p ? (tokens - r) / p : 0;
          std::vector<CompressedBlock> blocks;
          for (int j = 0; j < pages; ++j) {
            blocks.push_back({kr[l].data() + static_cast<size_t>(j) * p * codec->key_stride(),
                              vr[l].data() + static_cast<size_t>(j) * p * codec->value_stride(),
                              mr[l].data() + j * codec->mean_stride(), p});
          }
          const int w = tokens - pages * p;
          std::vector<uint16_t> wk(static_cast<size_t>(w) * kN), wv(wk.size());
          for (size_t e = 0; e < wk.size(); ++e) {
            wk[e] = FloatToBf16(k[l][static_cast<size_t>(pages) * p * kN + e]);
            wv[e] = FloatToBf16(v[l][static_cast<size_t>(pages) * p * kN + e]);
          }
          std::vector<float> local(kQHeads * kD), lse(kQHeads);
          absl::Status st = CompressedAttention(*codec, blocks, Bf16Tokens{wk.data(), wv.data(), w}, qi, kQHeads,
                                                static_cast<float>(scale), local.data(), lse.data(), &as);
          if (!st.ok()) return Fail(st);
          AccumulateError(local, k[l].data(), v[l].data(), pos + 1, kKvHeads, kD, qi, kQHeads, scale, &lerr[l],
                          &lsum[l]);
          for (size_t e = 0; e < out.size(); ++e) {
            diff += (out[e] - local[e]) * (out[e] - local[e]);
            dsum += local[e] * local[e];
          }
        }
      }
      progress.Update(i + 1);
    }
    progress.Done();
    if (!client.Release(seq).ok()) return 1;
  }
  double te = 0, ts = 0, tle = 0, tls = 0;
  std::printf("fixture %s: 2 sequences x 4 layers, prefill %d tokens, %d decode steps (new token + query each)\n",
              absl::GetFlag(FLAGS_fixture).c_str(), prefill, kQueries);
  for (int l = 0; l < kLayers; ++l) {
    std::printf("  layer %d: service attn_rel_err %.5f", l, std::sqrt(err[l] / sum[l]));
    if (codec.ok()) std::printf(", in-process codec replay %.5f", std::sqrt(lerr[l] / lsum[l]));
    std::printf("\n");
    te += err[l];
    ts += sum[l];
    tle += lerr[l];
    tls += lsum[l];
  }
  std::printf("  all layers: service attn_rel_err %.5f", std::sqrt(te / ts));
  if (codec.ok()) {
    std::printf(", in-process codec replay %.5f, service vs replay relative L2 difference %.3g",
                std::sqrt(tle / tls), std::sqrt(diff / dsum));
  }
  std::printf("\n  %.2f s total, Attend %.2f ms per call of 4 items on average\n", SecondsSince(t0),
              attend_s / (kSeqs * kQueries) * 1e3);
  return 0;
}

}  // namespace cli
}  // namespace driftkv
