// Page copies on the device (kernels/page_copy.h) against the bytes they
// copy: host slots (page-locked, mapped) to a device arena with a mirror in
// a second host block, and back, for page sizes that are and are not
// multiples of 16 bytes (the byte path), sources at odd addresses, pages in
// any order, and more pages than one block row; nothing outside the pages
// is written.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/page_copy.h"
#include "kernels/testing/gpu_test_util.h"

namespace driftkv {
namespace gpu {
namespace {

struct Pinned {
  explicit Pinned(size_t bytes) : size(bytes) {
    if (cudaHostAlloc(reinterpret_cast<void**>(&p), bytes, cudaHostAllocMapped) != cudaSuccess) p = nullptr;
  }
  ~Pinned() { cudaFreeHost(p); }
  uint8_t* p = nullptr;
  size_t size;
};

TEST(PageCopyTest, PagesGoBothWaysWithTheirMirrorAndNothingElseIsWritten) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(11);
  for (size_t page_bytes : {size_t{74304}, size_t{16}, size_t{4099}, size_t{1}}) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      SCOPED_TRACE(::testing::Message() << "page_bytes " << page_bytes << " offset " << offset);
      constexpr int kPages = 300;  // a page smaller than a chunk: one block each
      const size_t bytes = page_bytes * kPages + offset;
      Pinned host(bytes), mirror(bytes), back(bytes);
      ASSERT_NE(host.p, nullptr);
      ASSERT_NE(mirror.p, nullptr);
      ASSERT_NE(back.p, nullptr);
      for (size_t i = 0; i < bytes; ++i) host.p[i] = static_cast<uint8_t>(rng());
      std::memset(mirror.p, 0xEE, bytes);
      std::memset(back.p, 0xEE, bytes);
      uint8_t* dev = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), bytes + 64), cudaSuccess);
      ASSERT_EQ(cudaMemset(dev, 0xEE, bytes + 64), cudaSuccess);
      // Page i of the host block goes to arena page order[i]; a few pages
      // are left out, and must keep their fill.
      std::vector<int> order(kPages);
      for (int i = 0; i < kPages; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      const int copied = kPages - 7;
      std::vector<uint8_t*> table(3 * static_cast<size_t>(copied));
      for (int i = 0; i < copied; ++i) {
        table[i] = host.p + offset + static_cast<size_t>(i) * page_bytes;
        table[copied + i] = dev + offset + static_cast<size_t>(order[i]) * page_bytes;
        table[2 * copied + i] = mirror.p + offset + static_cast<size_t>(order[i]) * page_bytes;
      }
      uint8_t** table_dev = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&table_dev), table.size() * 8), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(table_dev, table.data(), table.size() * 8, cudaMemcpyHostToDevice), cudaSuccess);
      PageCopyParams up;
      up.src_dev = table_dev;
      up.dst_dev = table_dev + copied;
      up.mirror_dev = table_dev + 2 * copied;
      up.page_bytes = page_bytes;
      up.pages = copied;
      ASSERT_TRUE(LaunchPageCopy(up, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<uint8_t> arena(bytes + 64);
      ASSERT_EQ(cudaMemcpy(arena.data(), dev, arena.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<bool> written(kPages, false);
      for (int i = 0; i < copied; ++i) {
        written[order[i]] = true;
        const size_t at = offset + static_cast<size_t>(order[i]) * page_bytes;
        ASSERT_EQ(std::memcmp(arena.data() + at, table[i], page_bytes), 0) << "page " << i;
        ASSERT_EQ(std::memcmp(mirror.p + at, table[i], page_bytes), 0) << "mirror of page " << i;
      }
      for (size_t b = 0; b < offset; ++b) ASSERT_EQ(arena[b], 0xEE);
      for (size_t b = bytes; b < arena.size(); ++b) ASSERT_EQ(arena[b], 0xEE);
      for (int p = 0; p < kPages; ++p) {
        if (written[p]) continue;
        const size_t at = offset + static_cast<size_t>(p) * page_bytes;
        for (size_t b = 0; b < page_bytes; ++b) ASSERT_EQ(arena[at + b], 0xEE) << "page " << p << " not copied";
      }
      // And back: arena pages to the slots of a third block, no mirror.
      for (int i = 0; i < copied; ++i) table[i] = back.p + offset + static_cast<size_t>(i) * page_bytes;
      ASSERT_EQ(cudaMemcpy(table_dev, table.data(), copied * 8, cudaMemcpyHostToDevice), cudaSuccess);
      PageCopyParams down;
      down.src_dev = table_dev + copied;
      down.dst_dev = table_dev;
      down.page_bytes = page_bytes;
      down.pages = copied;
      ASSERT_TRUE(LaunchPageCopy(down, nullptr).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(std::memcmp(back.p + offset, host.p + offset, static_cast<size_t>(copied) * page_bytes), 0);
      for (size_t b = offset + static_cast<size_t>(copied) * page_bytes; b < bytes; ++b) ASSERT_EQ(back.p[b], 0xEE);
      cudaFree(table_dev);
      cudaFree(dev);
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
