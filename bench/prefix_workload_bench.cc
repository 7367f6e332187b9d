// The prefix cache on a shared-prompt workload (docs/prefix_cache.md,
// "Workload"): --sequences requests, each a --prompt-token system prompt
// shared by all of them followed by a --suffix-token suffix of its own,
// through Handler calls in process (CPU backend; --layers layers of
// --kv_heads x 64, pages and window of 128 tokens). Each request does what
// a client of the cache does: Lookup of its token ids, Fork from the prefix
// when one is held, then Append of the rest with token ids (one chunk per
// layer). Prints the pool's bytes against those of the prompt's pages
// once plus every suffix's pages (the bar: within 1%), against what the
// same requests hold without sharing, and the prefill tokens the forks
// saved pushing. Every request's tokens are checked through Length.
//
//   prefix_workload_bench [--sequences=1000] [--prompt=2048] [--suffix=512] [--layers=2] [--kv_heads=2]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/check.h"
#include "bench/flags.h"
#include "service/handler.h"
#include "wire/half.h"

namespace driftkv {
namespace {

using bench::IntFlag;

constexpr int kD = 64, kPageTokens = 128;

// bf16 keys or values of tokens [first, first + count) of request `r`:
// the prompt's tokens are the same in every request, a suffix's its own.
std::string Tokens(int r, int prompt, int first, int count, int n, int salt) {
  std::string out(static_cast<size_t>(count) * n * 2, '\0');
  for (int t = 0; t < count; ++t) {
    const int token = first + t;
    const uint32_t owner = token < prompt ? 0u : static_cast<uint32_t>(r + 1);
    for (int i = 0; i < n; ++i) {
      uint32_t s = (owner * 1000003u + static_cast<uint32_t>(token)) * 2654435761u + i * 40503u + salt;
      s ^= s >> 15;
      const uint16_t b = FloatToBf16(static_cast<float>(s % 2001) / 1000.0f - 1.0f);
      std::memcpy(&out[(static_cast<size_t>(t) * n + i) * 2], &b, 2);
    }
  }
  return out;
}

int Main(int argc, char** argv) {
  const int sequences = IntFlag(argc, argv, "sequences", 1000), prompt = IntFlag(argc, argv, "prompt", 2048);
  const int suffix = IntFlag(argc, argv, "suffix", 512), layers = IntFlag(argc, argv, "layers", 2);
  const int kv_heads = IntFlag(argc, argv, "kv_heads", 2);
  const int n = kv_heads * kD, total = prompt + suffix;
  // Pages of one request: (total - R) / P, of which the prompt's P-aligned part is shared.
  const int64_t seq_pages = (total - kPageTokens) / kPageTokens, prompt_pages = prompt / kPageTokens;
  const int64_t suffix_pages = seq_pages - prompt_pages;

  ServiceOptions o;
  o.layers = layers;
  o.codec.kv_heads = kv_heads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = kPageTokens;
  o.max_sequences = sequences + 1;
  o.backend_threads = 2;
  size_t stride = 0;
  {
    Metrics m;
    o.pool_bytes = 64ull << 20;
    auto probe = Handler::Create(o, &m);
    CHECK_OK(probe.status());
    stride = (*probe)->pool().page_stride();
  }
  const int64_t shared_pages = layers * (prompt_pages + sequences * suffix_pages);
  o.pool_bytes = static_cast<uint64_t>(shared_pages + shared_pages / 10 + 64) * stride;
  Metrics metrics;
  auto made = Handler::Create(o, &metrics);
  CHECK_OK(made.status());
  Handler& h = **made;

  int64_t pushed = 0, saved = 0, forks = 0;
  double lookup_us = 0, fork_us = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < sequences; ++r) {
    const std::string id = absl::StrCat("req", r);
    std::vector<uint32_t> ids(total);
    for (int t = 0; t < total; ++t) {
      ids[t] =
          t < prompt ? static_cast<uint32_t>(t * 31 % 128000) : static_cast<uint32_t>((r * 7919 + t * 13) % 128000);
    }
    v1::LookupRequest lr;
    lr.mutable_token_ids()->Add(ids.begin(), ids.end());
    v1::LookupResponse found;
    auto t0 = std::chrono::steady_clock::now();
    CHECK_OK(h.Lookup(lr, &found));
    lookup_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    int from = 0;
    if (found.pages() > 0) {
      v1::ForkRequest f;
      f.set_sequence_id(id);
      f.mutable_prefix_token_ids()->Add(ids.begin(), ids.end());
      v1::ForkResponse fr;
      t0 = std::chrono::steady_clock::now();
      CHECK_OK(h.Fork(f, &fr));
      fork_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      from = static_cast<int>(fr.tokens());
      ++forks;
    }
    for (int l = 0; l < layers; ++l) {
      v1::AppendChunk c;
      c.set_sequence_id(id);
      c.set_layer(l);
      c.set_first_token(from);
      c.set_token_count(total - from);
      c.set_dtype(v1::DTYPE_BF16);
      c.set_keys(Tokens(r, prompt, from, total - from, n, 1 + l));
      c.set_values(Tokens(r, prompt, from, total - from, n, 100 + l));
      c.mutable_token_ids()->Add(ids.begin() + from, ids.end());
      v1::AppendResponse totals;
      CHECK_OK(h.Append(c, &totals));
    }
    pushed += static_cast<int64_t>(total - from) * layers;
    saved += static_cast<int64_t>(from) * layers;
    v1::LengthRequest q;
    q.set_sequence_id(id);
    v1::LengthResponse len;
    CHECK_OK(h.Length(q, &len));
    for (const v1::LayerLength& l : len.layers()) {
      if (l.tokens() != static_cast<uint64_t>(total)) CHECK_OK(absl::InternalError("wrong length"));
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t in_use = h.pool().pages_in_use();
  const double pool = static_cast<double>(in_use) * stride, ideal = static_cast<double>(shared_pages) * stride;
  const double unshared = static_cast<double>(layers) * sequences * seq_pages * stride;
  std::printf("%d requests of %d shared + %d own tokens, %d layers of %d x %d, pages of %d tokens (%zu bytes)\n",
              sequences, prompt, suffix, layers, kv_heads, kD, kPageTokens, stride);
  std::printf("pool: %lld pages, %.1f MiB\n", static_cast<long long>(in_use), pool / (1 << 20));
  std::printf("prompt once + suffixes: %lld pages, %.1f MiB; pool / that = %.4f\n",
              static_cast<long long>(shared_pages), ideal / (1 << 20), pool / ideal);
  std::printf("without sharing: %.1f MiB (%.2fx the pool)\n", unshared / (1 << 20), unshared / pool);
  std::printf("prefill tokens pushed %lld, saved by %lld forks %lld (%.1f%% of %lld)\n", static_cast<long long>(pushed),
              static_cast<long long>(forks), static_cast<long long>(saved), 100.0 * saved / (pushed + saved),
              static_cast<long long>(pushed + saved));
  std::printf("index entries %lld; mean Lookup %.1f us, mean Fork %.1f us; %.1f s in all\n",
              static_cast<long long>(h.prefix_index().entries()), lookup_us / sequences,
              forks > 0 ? fork_us / forks : 0.0, seconds);
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
