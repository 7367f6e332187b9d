// The cost of page checksums (docs/reliability.md, "Cost"): CRC-32C
// throughput on cold pages, level (hot) pages and bf16 window tokens of the
// default shape, and Attend through the handler (CPU backend) on the cold
// and the hot tier with and without verify_pages_on_attend.
//
//   bazel run -c opt //bench:page_checksum_bench -- [tokens] [iterations]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/page_checksum.h"
#include "bench/check.h"
#include "codec/level_page.h"
#include "service/handler.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

double Seconds(std::chrono::steady_clock::time_point a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

double MedianAttendMs(bool verify, bool hot, int tokens, int iterations, size_t* page_bytes) {
  ServiceOptions o;
  o.layers = 1;
  o.codec.kv_heads = 8;
  o.codec.head_dim = 128;
  o.pool_bytes = 1ull << 30;
  o.backend_threads = 1;
  o.verify_pages_on_attend = verify;
  if (hot) o.hot_tier_bytes = (tokens / 128 + 2) * MakeLevelPageLayout(8, 128)->page_bytes;
  Metrics metrics;
  absl::StatusOr<std::unique_ptr<Handler>> h = Handler::Create(o, &metrics);
  CHECK_OK(h.status());
  *page_bytes = (*h)->pool().page_stride();
  const int n = 8 * 128;
  std::vector<float> kv(static_cast<size_t>(tokens) * n);
  uint32_t s = 1;
  for (float& x : kv) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(static_cast<int32_t>(s >> 8) % 2000) / 1000.0f;
  }
  v1::AppendChunk c;
  c.set_sequence_id("bench");
  c.set_token_count(tokens);
  c.set_dtype(v1::DTYPE_F32);
  FloatToTensor(kv.data(), kv.size(), v1::DTYPE_F32, c.mutable_keys());
  FloatToTensor(kv.data(), kv.size(), v1::DTYPE_F32, c.mutable_values());
  v1::AppendResponse r;
  CHECK_OK((*h)->Append(c, &r));
  v1::AttendRequest a;
  v1::AttendItem* it = a.add_items();
  it->set_sequence_id("bench");
  it->set_q_heads(32);
  it->set_dtype(v1::DTYPE_F32);
  std::vector<float> q(32 * 128, 0.01f);
  it->set_query(std::string(reinterpret_cast<const char*>(q.data()), q.size() * 4));
  std::vector<double> ms;
  for (int i = 0; i < iterations + 2; ++i) {  // the first promotes (hot)
    v1::AttendResponse resp;
    auto t = std::chrono::steady_clock::now();
    CHECK_OK((*h)->Attend(a, &resp));
    if (i >= 2) ms.push_back(1e3 * Seconds(t));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Microseconds per CRC-32C of `bytes`-byte blocks (64 distinct ones, so
// that the data is not all in L1).
double CrcMicros(size_t bytes, int reps, uint32_t* sink) {
  std::vector<uint8_t> data(bytes * 64);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  auto t = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    for (int p = 0; p < 64; ++p) *sink += Crc32c(data.data() + p * bytes, bytes);
  }
  return Seconds(t) / (reps * 64.0) * 1e6;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  const int tokens = argc > 1 ? std::atoi(argv[1]) : 8192;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 20;
  size_t page_bytes = 0;
  // Interleaved, cold and hot, so that drift of a shared machine hits all four alike.
  const double off = driftkv::MedianAttendMs(false, false, tokens, iterations, &page_bytes);
  const double on = driftkv::MedianAttendMs(true, false, tokens, iterations, &page_bytes);
  const double hot_off = driftkv::MedianAttendMs(false, true, tokens, iterations, &page_bytes);
  const double hot_on = driftkv::MedianAttendMs(true, true, tokens, iterations, &page_bytes);
  const size_t level_bytes = driftkv::MakeLevelPageLayout(8, 128)->page_bytes;
  const size_t token_bytes = 2 * 2 * 8 * 128;  // bf16 keys and values of one token
  uint32_t sink = 0;
  const double page_us = driftkv::CrcMicros(page_bytes, 200, &sink);
  const double level_us = driftkv::CrcMicros(level_bytes, 200, &sink);
  const double token_us = driftkv::CrcMicros(token_bytes, 20000, &sink);
  std::printf("crc32c: %zu-byte cold pages (8 kv heads x 128, 128 tokens): %.2f GB/s, %.2f us per page\n", page_bytes,
              page_bytes / page_us / 1e3, page_us);
  std::printf("crc32c: %zu-byte level (hot) pages: %.2f GB/s, %.2f us per page\n", level_bytes,
              level_bytes / level_us / 1e3, level_us);
  std::printf("crc32c: %zu-byte bf16 window tokens (one decode step of one layer): %.3f us per token (sink %08x)\n",
              token_bytes, token_us, sink);
  std::printf(
      "Attend, 1 item x %d tokens x 32 q_heads, CPU backend, 1 thread, median of %d: cold %.3f ms without "
      "verify_pages_on_attend, %.3f ms with (%+.1f%%); hot %.3f ms without, %.3f ms with (%+.1f%%)\n",
      tokens, iterations, off, on, 100.0 * (on - off) / off, hot_off, hot_on, 100.0 * (hot_on - hot_off) / hot_off);
  return 0;
}
