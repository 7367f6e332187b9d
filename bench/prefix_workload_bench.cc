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
//
// With --chats=C: multi-turn chats instead. C chats share the --prompt
// system prompt; in each of --turns turns (the chats interleaved, as a
// server sees them) a chat sends its whole history plus a --user-token
// message, as a chat client does, then decodes a --reply-token answer.
// Each turn is a new sequence: Lookup, Fork from the longest prefix held
// (the system prompt, then the previous turn's pages), Append of the
// rest and of the reply with token ids; the previous turn's sequence is
// then released (the index keeps its pages). Prints the pool against the
// pages the chats' last turns hold (each chat's history once, the prompt
// once over all chats) and the prefill tokens the forks saved against
// resending every history whole.
//
//   prefix_workload_bench --chats=200 [--turns=8] [--user=96] [--reply=160] [--prompt=2048]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
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

// Token ids of chat or request `r`: the prompt's are everyone's, the rest its own.
uint32_t TokenId(int r, int prompt, int t) {
  return t < prompt ? static_cast<uint32_t>(t * 31 % 128000) : static_cast<uint32_t>((r * 7919 + t * 13) % 128000);
}

// Appends tokens [from, end) of `r`'s sequence `id` to every layer, with
// their ids; CHECK-fails on an error.
void Push(Handler& h, const std::string& id, int r, int prompt, int from, int end, int layers, int n) {
  std::vector<uint32_t> ids;
  for (int t = from; t < end; ++t) ids.push_back(TokenId(r, prompt, t));
  for (int l = 0; l < layers; ++l) {
    v1::AppendChunk c;
    c.set_sequence_id(id);
    c.set_layer(l);
    c.set_first_token(from);
    c.set_token_count(end - from);
    c.set_dtype(v1::DTYPE_BF16);
    c.set_keys(Tokens(r, prompt, from, end - from, n, 1 + l));
    c.set_values(Tokens(r, prompt, from, end - from, n, 100 + l));
    c.mutable_token_ids()->Add(ids.begin(), ids.end());
    v1::AppendResponse totals;
    CHECK_OK(h.Append(c, &totals));
  }
}

// What a client of the cache does before its prefill: Lookup of the ids,
// then Fork of `id` from the prefix held, if any. Returns the tokens the
// fork took (0 without one), adding to the timings and the fork count.
struct ForkTimes {
  double lookup_us = 0, fork_us = 0;
  int64_t forks = 0;
};
int LookupAndFork(Handler& h, const std::string& id, const google::protobuf::RepeatedField<uint32_t>& ids,
                  ForkTimes* times) {
  v1::LookupRequest lr;
  *lr.mutable_token_ids() = ids;
  v1::LookupResponse found;
  auto t0 = std::chrono::steady_clock::now();
  CHECK_OK(h.Lookup(lr, &found));
  times->lookup_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  if (found.pages() == 0) return 0;
  v1::ForkRequest f;
  f.set_sequence_id(id);
  *f.mutable_prefix_token_ids() = ids;
  v1::ForkResponse fr;
  t0 = std::chrono::steady_clock::now();
  CHECK_OK(h.Fork(f, &fr));
  times->fork_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  ++times->forks;
  return static_cast<int>(fr.tokens());
}

// A handler of `layers` x `kv_heads` x 64 whose pool holds `pages` pages
// and a tenth more; *stride: the page's bytes.
std::unique_ptr<Handler> MakeHandler(int layers, int kv_heads, int sequences, int64_t pages, Metrics* metrics,
                                     size_t* stride) {
  ServiceOptions o;
  o.layers = layers;
  o.codec.kv_heads = kv_heads;
  o.codec.head_dim = kD;
  o.codec.mean_window = kPageTokens;
  o.window_tokens = kPageTokens;
  o.max_sequences = sequences + 1;
  o.backend_threads = 2;
  {
    Metrics m;
    o.pool_bytes = 64ull << 20;
    auto probe = Handler::Create(o, &m);
    CHECK_OK(probe.status());
    *stride = (*probe)->pool().page_stride();
  }
  o.pool_bytes = static_cast<uint64_t>(pages + pages / 10 + 64) * *stride;
  auto made = Handler::Create(o, metrics);
  CHECK_OK(made.status());
  return *std::move(made);
}

int Chats(int argc, char** argv) {
  const int chats = IntFlag(argc, argv, "chats", 200), turns = IntFlag(argc, argv, "turns", 8);
  const int user = IntFlag(argc, argv, "user", 96), reply = IntFlag(argc, argv, "reply", 160);
  const int prompt = IntFlag(argc, argv, "prompt", 2048), layers = IntFlag(argc, argv, "layers", 2);
  const int kv_heads = IntFlag(argc, argv, "kv_heads", 2);
  const int n = kv_heads * kD, final_len = prompt + turns * (user + reply);
  // What the pool must hold in the end, per layer: the prompt's pages
  // once, and each chat's pages past them (its last turn's paged tokens;
  // the last window stays bf16 in host memory).
  const int64_t prompt_pages = prompt / kPageTokens;
  const int64_t chat_pages = (final_len - kPageTokens) / kPageTokens - prompt_pages;
  const int64_t ideal_pages = layers * (prompt_pages + chats * chat_pages);
  Metrics metrics;
  size_t stride = 0;
  std::unique_ptr<Handler> made = MakeHandler(layers, kv_heads, 2 * chats, ideal_pages, &metrics, &stride);
  Handler& h = *made;
  int64_t pushed = 0, saved = 0, resent = 0;
  ForkTimes times;
  const auto start = std::chrono::steady_clock::now();
  for (int turn = 0; turn < turns; ++turn) {
    for (int c = 0; c < chats; ++c) {
      const std::string id = absl::StrCat("chat", c, ".", turn);
      const int request = prompt + turn * (user + reply) + user;  // history + the new message
      google::protobuf::RepeatedField<uint32_t> ids;
      for (int t = 0; t < request; ++t) ids.Add(TokenId(c, prompt, t));
      const int from = LookupAndFork(h, id, ids, &times);
      Push(h, id, c, prompt, from, request, layers, n);             // the turn's prefill
      Push(h, id, c, prompt, request, request + reply, layers, n);  // its reply, decoded
      pushed += static_cast<int64_t>(request - from) * layers;
      saved += static_cast<int64_t>(from) * layers;
      resent += static_cast<int64_t>(request) * layers;
      v1::LengthRequest q;
      q.set_sequence_id(id);
      v1::LengthResponse len;
      CHECK_OK(h.Length(q, &len));
      for (const v1::LayerLength& l : len.layers()) {
        if (l.tokens() != static_cast<uint64_t>(request + reply)) CHECK_OK(absl::InternalError("wrong length"));
      }
      if (turn > 0) {
        v1::ReleaseRequest rel;
        rel.set_sequence_id(absl::StrCat("chat", c, ".", turn - 1));
        v1::ReleaseResponse rr;
        CHECK_OK(h.Release(rel, &rr));
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t in_use = h.pool().pages_in_use();
  const double pool = static_cast<double>(in_use) * stride, ideal = static_cast<double>(ideal_pages) * stride;
  // Every turn a sequence of its own holding its whole history's pages.
  int64_t unshared_pages = 0;
  for (int turn = 0; turn < turns; ++turn) {
    unshared_pages += (prompt + (turn + 1) * (user + reply) - kPageTokens) / kPageTokens;
  }
  unshared_pages *= static_cast<int64_t>(layers) * chats;
  std::printf(
      "%d chats x %d turns (%d-token system prompt shared; %d user + %d reply tokens a turn), %d layers of %d x %d, "
      "pages of %d tokens (%zu bytes)\n",
      chats, turns, prompt, user, reply, layers, kv_heads, kD, kPageTokens, stride);
  std::printf("pool: %lld pages, %.1f MiB\n", static_cast<long long>(in_use), pool / (1 << 20));
  std::printf("prompt once + each chat's history once: %lld pages, %.1f MiB; pool / that = %.4f\n",
              static_cast<long long>(ideal_pages), ideal / (1 << 20), pool / ideal);
  std::printf("every turn's history held apart: %.1f MiB (%.2fx the pool)\n",
              static_cast<double>(unshared_pages) * stride / (1 << 20), unshared_pages * stride / pool);
  std::printf(
      "prefill tokens pushed %lld, saved by %lld forks %lld (%.1f%% of the %lld a client resending its history "
      "pushes)\n",
      static_cast<long long>(pushed), static_cast<long long>(times.forks), static_cast<long long>(saved),
      100.0 * saved / resent, static_cast<long long>(resent));
  std::printf("index entries %lld; mean Lookup %.1f us, mean Fork %.1f us; %.1f s in all\n",
              static_cast<long long>(h.prefix_index().entries()), times.lookup_us / (chats * turns),
              times.forks > 0 ? times.fork_us / times.forks : 0.0, seconds);
  return 0;
}

int Main(int argc, char** argv) {
  if (IntFlag(argc, argv, "chats", 0) > 0) return Chats(argc, argv);
  const int sequences = IntFlag(argc, argv, "sequences", 1000), prompt = IntFlag(argc, argv, "prompt", 2048);
  const int suffix = IntFlag(argc, argv, "suffix", 512), layers = IntFlag(argc, argv, "layers", 2);
  const int kv_heads = IntFlag(argc, argv, "kv_heads", 2);
  const int n = kv_heads * kD, total = prompt + suffix;
  // Pages of one request: (total - R) / P, of which the prompt's P-aligned part is shared.
  const int64_t seq_pages = (total - kPageTokens) / kPageTokens, prompt_pages = prompt / kPageTokens;
  const int64_t suffix_pages = seq_pages - prompt_pages;

  const int64_t shared_pages = layers * (prompt_pages + sequences * suffix_pages);
  Metrics metrics;
  size_t stride = 0;
  std::unique_ptr<Handler> made = MakeHandler(layers, kv_heads, sequences, shared_pages, &metrics, &stride);
  Handler& h = *made;

  int64_t pushed = 0, saved = 0;
  ForkTimes times;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < sequences; ++r) {
    const std::string id = absl::StrCat("req", r);
    google::protobuf::RepeatedField<uint32_t> ids;
    for (int t = 0; t < total; ++t) ids.Add(TokenId(r, prompt, t));
    const int from = LookupAndFork(h, id, ids, &times);
    Push(h, id, r, prompt, from, total, layers, n);
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
              static_cast<long long>(times.forks), static_cast<long long>(saved), 100.0 * saved / (pushed + saved),
              static_cast<long long>(pushed + saved));
  std::printf("index entries %lld; mean Lookup %.1f us, mean Fork %.1f us; %.1f s in all\n",
              static_cast<long long>(h.prefix_index().entries()), times.lookup_us / sequences,
              times.forks > 0 ? times.fork_us / times.forks : 0.0, seconds);
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
