// `driftkv demo`: one sequence of synthetic context, decode steps, the
// service's attention against exact float64 attention (the definition of
// `driftkv-codec eval`: attn_rel_err = sqrt(sum (o - ref)^2 / sum ref^2)
// over all queries and heads), compression and metrics.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "wire/tensor.h"

namespace driftkv {
namespace cli {

int Demo(Client& client) {
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  const int layers = info->layers(), kv_heads = info->kv_heads(), d = info->head_dim();
  const size_t n = static_cast<size_t>(kv_heads) * d;
  const int q_heads = absl::GetFlag(FLAGS_q_heads) > 0 ? absl::GetFlag(FLAGS_q_heads) : 2 * kv_heads;
  const int tokens = absl::GetFlag(FLAGS_tokens), steps = absl::GetFlag(FLAGS_steps);
  const int chunk = absl::GetFlag(FLAGS_chunk_tokens);
  const std::string seq = absl::GetFlag(FLAGS_sequence);
  std::printf(
      "driftkv demo: server %s (%s backend, %d layers x %d kv_heads x %d head_dim, dquant %.2f/%.2f bits "
      "per key/value, pages of %u tokens, bf16 window %u tokens)\n",
      absl::GetFlag(FLAGS_server).c_str(), info->backend().c_str(), layers, kv_heads, d, info->key_bits_per_value(),
      info->value_bits_per_value(), info->page_tokens(), info->window_tokens());
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
      chunks.back().set_new_incarnation(t == 0);  // an earlier run released the same id
    }
  }
  auto t0 = Clock::now();
  absl::StatusOr<v1::AppendResponse> pushed = client.AppendConcurrently(chunks, absl::GetFlag(FLAGS_streams));
  if (!pushed.ok()) return Fail(pushed.status());
  const double push_s = SecondsSince(t0);
  const double raw = 2.0 * layers * tokens * n * 2;
  std::printf(
      "1. pushed %d tokens x %d layers of synthetic keys/values (%.1f MB bf16) in %.3f s: %.1f MB/s, "
      "%.0f tokens/s\n",
      tokens, layers, raw / 1e6, push_s, raw / push_s / 1e6, tokens / push_s);

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
      AccumulateError(OutputFloats(r->results(l)), keys[l].data(), values[l].data(), pos + 1, kv_heads, d, qs[l].data(),
                      q_heads, 1.0 / std::sqrt(static_cast<double>(d)), &err, &sum);
    }
    progress.Update(step + 1);
  }
  progress.Done();
  const double rel = std::sqrt(err / std::max(sum, 1e-300));
  std::printf(
      "2. %d decode steps x %d layers: attention vs exact float64 attention on the original keys/values: "
      "relative L2 error %.4f\n",
      steps, layers, rel);
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
  // Gaussian values at ~1.9 bits: about 0.5 (the unbiased value grid trades
  // some of this error for reconstructions that are not contracted, see
  // docs/quality.md); a broken codec gives >= 1.
  if (!(rel < 0.6)) {
    std::printf("demo FAILED: error %.4f is not that of a working codec\n", rel);
    return 1;
  }
  std::printf("demo OK\n");
  return 0;
}

}  // namespace cli
}  // namespace driftkv
