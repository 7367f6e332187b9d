// The host level's copies on the device, each way and with the copy
// engines beside them, in one run (docs/tiers.md, "The host level on the
// CUDA backend"): --pages pages of --page_bytes between page-locked, mapped
// host slots and a device arena, in shuffled order (a sequence's pages are
// scattered in both). Medians of --reps, wall time around one
// synchronisation each:
//   engine H2D / D2H        one cudaMemcpyAsync of all the bytes (the link's rate)
//   engine H2D per page     a cudaMemcpyAsync per page
//   kernel H2D              kernels/page_copy.h, host slots -> device
//   kernel H2D + mirror     the same, each page also to a second host block
//   kernel D2H              device -> host slots
//   kernel H2D || engine D2H  a restore and a move down at once, two streams
//
//   page_copy_bench [--pages=2048] [--page_bytes=74304] [--reps=10]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "bench/check.h"
#include "bench/flags.h"
#include "kernels/page_copy.h"

namespace driftkv {
namespace {

void Cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int Main(int argc, char** argv) {
  const int pages = bench::IntFlag(argc, argv, "pages", 2048);
  const size_t page_bytes = static_cast<size_t>(bench::IntFlag(argc, argv, "page_bytes", 74304));
  const int reps = bench::IntFlag(argc, argv, "reps", 10);
  const size_t bytes = static_cast<size_t>(pages) * page_bytes;
  uint8_t *host = nullptr, *mirror = nullptr, *dev = nullptr;
  Cu(cudaHostAlloc(reinterpret_cast<void**>(&host), bytes, cudaHostAllocMapped | cudaHostAllocPortable), "host");
  Cu(cudaHostAlloc(reinterpret_cast<void**>(&mirror), bytes, cudaHostAllocMapped | cudaHostAllocPortable), "mirror");
  Cu(cudaMalloc(reinterpret_cast<void**>(&dev), bytes), "device");
  std::memset(host, 0x5a, bytes);
  cudaStream_t s, t;
  Cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
  Cu(cudaStreamCreateWithFlags(&t, cudaStreamNonBlocking), "stream");
  std::vector<int> perm_host(pages), perm_dev(pages);
  std::iota(perm_host.begin(), perm_host.end(), 0);
  std::iota(perm_dev.begin(), perm_dev.end(), 0);
  std::mt19937 rng(7);
  std::shuffle(perm_host.begin(), perm_host.end(), rng);
  std::shuffle(perm_dev.begin(), perm_dev.end(), rng);
  // Pointer tables on the device: host slots, device pages, mirror pages.
  std::vector<uint8_t*> tables(3 * static_cast<size_t>(pages));
  for (int i = 0; i < pages; ++i) {
    tables[i] = host + static_cast<size_t>(perm_host[i]) * page_bytes;
    tables[pages + i] = dev + static_cast<size_t>(perm_dev[i]) * page_bytes;
    tables[2 * pages + i] = mirror + static_cast<size_t>(perm_dev[i]) * page_bytes;
  }
  uint8_t** tables_dev = nullptr;
  Cu(cudaMalloc(reinterpret_cast<void**>(&tables_dev), tables.size() * 8), "tables");
  Cu(cudaMemcpy(tables_dev, tables.data(), tables.size() * 8, cudaMemcpyHostToDevice), "tables");

  auto time = [&](const char* name, const std::function<void()>& run) {
    run();
    Cu(cudaDeviceSynchronize(), name);
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      const auto a = std::chrono::steady_clock::now();
      run();
      Cu(cudaDeviceSynchronize(), name);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
    }
    std::sort(ms.begin(), ms.end());
    const double p50 = ms[ms.size() / 2];
    std::printf("%-28s p50 %7.3f ms  min %7.3f ms  %6.1f GB/s\n", name, p50, ms.front(), bytes / p50 / 1e6);
  };
  gpu::PageCopyParams h2d;
  h2d.src_dev = tables_dev;
  h2d.dst_dev = tables_dev + pages;
  h2d.page_bytes = page_bytes;
  h2d.pages = pages;
  gpu::PageCopyParams h2d_mirror = h2d;
  h2d_mirror.mirror_dev = tables_dev + 2 * pages;
  gpu::PageCopyParams d2h;
  d2h.src_dev = tables_dev + pages;
  d2h.dst_dev = tables_dev;
  d2h.page_bytes = page_bytes;
  d2h.pages = pages;
  std::printf("%d pages of %zu bytes: %.1f MB, shuffled\n", pages, page_bytes, bytes / 1e6);
  time("engine H2D", [&] { Cu(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s), "h2d"); });
  time("engine D2H", [&] { Cu(cudaMemcpyAsync(mirror, dev, bytes, cudaMemcpyDeviceToHost, s), "d2h"); });
  time("engine H2D per page", [&] {
    for (int i = 0; i < pages; ++i) {
      Cu(cudaMemcpyAsync(tables[pages + i], tables[i], page_bytes, cudaMemcpyHostToDevice, s), "h2d page");
    }
  });
  time("kernel H2D", [&] { CHECK_OK(gpu::LaunchPageCopy(h2d, s)); });
  time("kernel H2D + mirror", [&] { CHECK_OK(gpu::LaunchPageCopy(h2d_mirror, s)); });
  time("kernel D2H", [&] { CHECK_OK(gpu::LaunchPageCopy(d2h, s)); });
  time("kernel H2D || engine D2H", [&] {
    CHECK_OK(gpu::LaunchPageCopy(h2d, s));
    Cu(cudaMemcpyAsync(mirror, dev, bytes, cudaMemcpyDeviceToHost, t), "d2h");
  });
  // The copies' bytes: the device pages equal the host slots they came from.
  std::vector<uint8_t> back(page_bytes);
  CHECK_OK(gpu::LaunchPageCopy(h2d_mirror, s));
  Cu(cudaStreamSynchronize(s), "check");
  for (int i = 0; i < pages; i += std::max(1, pages / 16)) {
    Cu(cudaMemcpy(back.data(), tables[pages + i], page_bytes, cudaMemcpyDeviceToHost), "check");
    if (std::memcmp(back.data(), tables[i], page_bytes) != 0 ||
        std::memcmp(tables[2 * pages + i], tables[i], page_bytes)) {
      std::fprintf(stderr, "page %d differs after the copy\n", i);
      return 1;
    }
  }
  std::printf("copies checked: device pages and mirrors equal their slots\n");
  return 0;
}

}  // namespace
}  // namespace driftkv

int main(int argc, char** argv) {
  return driftkv::Main(argc, argv);
}
