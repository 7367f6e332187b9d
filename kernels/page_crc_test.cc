// Page checksums on the device against wire/crc32c.h's on the host, bit for
// bit: random pages of the cold and hot page sizes and of sizes that are
// not multiples of 16 (summed a byte at a time), in any order of ids.
#include <cstdint>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/page_crc.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/testing/gpu_test_util.h"
#include "wire/crc32c.h"

namespace driftkv {
namespace gpu {
namespace {

TEST(PageCrcTest, DeviceSumsAreTheHostsChecksums) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(7);
  // The service's cold and level pages (74,304 and 96,320 bytes); 8,208
  // bytes, where thread 0's two segments differ in length and most threads'
  // second one is empty; sizes no multiple of 16.
  for (size_t page_bytes : {size_t{74304}, size_t{96320}, size_t{73728}, size_t{48128}, size_t{8208}, size_t{4096},
                            size_t{4099}, size_t{100}, size_t{1}}) {
    SCOPED_TRACE(page_bytes);
    constexpr int kArenaPages = 37;
    std::vector<uint8_t> arena(page_bytes * kArenaPages);
    for (uint8_t& b : arena) b = static_cast<uint8_t>(rng());
    std::vector<int32_t> ids = {36, 0, 5, 5, 17, 1, 35};
    DeviceBuffer arena_dev, ids_dev, sums_dev(ids.size() * 4);
    ASSERT_TRUE(arena_dev.Upload(arena));
    ASSERT_TRUE(ids_dev.Upload(ids));
    PageCrcParams p;
    p.arena_dev = arena_dev.get<uint8_t>();
    p.page_bytes = page_bytes;
    p.pages_dev = ids_dev.get<int32_t>();
    p.pages = static_cast<int>(ids.size());
    p.sums_dev = sums_dev.get<uint32_t>();
    ASSERT_TRUE(LaunchPageCrc(p, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint32_t> sums;
    ASSERT_TRUE(sums_dev.Download(&sums));
    for (size_t i = 0; i < ids.size(); ++i) {
      const uint8_t* page = arena.data() + static_cast<size_t>(ids[i]) * page_bytes;
      EXPECT_EQ(sums[i], Crc32cExtend(0, page, page_bytes)) << "page " << ids[i];
    }
  }
}

TEST(PageCrcTest, NoPagesLaunchesNothing) {
  PageCrcParams p;
  EXPECT_TRUE(LaunchPageCrc(p, nullptr).ok());
  p.pages = -1;
  EXPECT_FALSE(LaunchPageCrc(p, nullptr).ok());
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
