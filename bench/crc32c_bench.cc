// CRC-32C of wire/crc32c.h (three crc32 chains a round) beside one chain
// of the same instruction over the same bytes, in one run: ns per call and
// GB/s at each size, and a check that both give the same value.
//
//   crc32c_bench [--bytes=2048] [--megabytes=200]
#include <nmmintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench/flags.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace {

using bench::IntFlag;

// The single chain: what Crc32cExtend did before its three lanes.
uint32_t OneChain(uint32_t crc, const unsigned char* p, size_t size) {
  uint64_t c = ~crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; size > 0; --size, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

int Run(int argc, char** argv) {
  const size_t n = static_cast<size_t>(IntFlag(argc, argv, "bytes", 2048));
  const double total = IntFlag(argc, argv, "megabytes", 200) * 1e6;
  std::vector<unsigned char> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(i * 131 + 7);
  const int reps = static_cast<int>(total / static_cast<double>(n)) + 1;
  using Clock = std::chrono::steady_clock;
  uint32_t lanes = 0, chain = 0;
  for (int round = 0; round < 2; ++round) {  // alternating
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) lanes = Crc32cExtend(lanes, b.data(), n);
    const double s_lanes = std::chrono::duration<double>(Clock::now() - t0).count();
    t0 = Clock::now();
    for (int i = 0; i < reps; ++i) chain = OneChain(chain, b.data(), n);
    const double s_chain = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("%zu bytes, round %d: three lanes %.1f ns (%.2f GB/s), one chain %.1f ns (%.2f GB/s), %.2fx\n", n,
                round, s_lanes / reps * 1e9, reps * n / s_lanes / 1e9, s_chain / reps * 1e9, reps * n / s_chain / 1e9,
                s_chain / s_lanes);
  }
  if (lanes != chain) {
    std::fprintf(stderr, "the two disagree: %08x vs %08x\n", lanes, chain);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Run(argc, argv);
}
