// The gather of client tensors against the host's conversions
// (wire/half.h), bit for bit: every dtype, in device memory and in mapped
// host memory, at 16-byte aligned addresses (moved 16 bytes at a time) and
// at merely element-aligned ones (moved element by element), with the
// lowest non-finite element of each item found (flags stored in device or
// mapped host memory, nothing reset before).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/region_io.h"
#include "kernels/testing/device_buffer.h"
#include "kernels/testing/gpu_test_util.h"
#include "wire/half.h"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kItems = 3;
constexpr int kStride = 4096;

// Wire bytes of `x` in `dtype`.
std::vector<uint8_t> ToWire(const std::vector<float>& x, int dtype) {
  std::vector<uint8_t> out(x.size() * (dtype == kRegionF32 ? 4 : 2));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == kRegionF32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h = dtype == kRegionBf16 ? FloatToBf16(x[i]) : FloatToHalf(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

float FromWire(const uint8_t* p, int i, int dtype) {
  if (dtype == kRegionF32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dtype == kRegionBf16 ? Bf16ToFloat(h) : HalfToFloat(h);
}

// Client memory of either kind, `bytes` long.
struct ClientMemory {
  ClientMemory(size_t bytes, bool host) : host(host) {
    if (host) {
      EXPECT_EQ(cudaHostAlloc(&ptr, bytes, cudaHostAllocMapped), cudaSuccess);
    } else {
      EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    }
  }
  ~ClientMemory() { host ? cudaFreeHost(ptr) : cudaFree(ptr); }
  void Write(size_t at, const std::vector<uint8_t>& b) {
    ASSERT_EQ(cudaMemcpy(static_cast<uint8_t*>(ptr) + at, b.data(), b.size(), cudaMemcpyDefault), cudaSuccess);
  }
  std::vector<uint8_t> Read(size_t at, size_t n) const {
    std::vector<uint8_t> b(n);
    EXPECT_EQ(cudaMemcpy(b.data(), static_cast<const uint8_t*>(ptr) + at, n, cudaMemcpyDefault), cudaSuccess);
    return b;
  }
  bool host;
  void* ptr = nullptr;
};

std::vector<float> Values(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(RegionIoTest, GatherConvertsAndChecksBitForBit) {
  SKIP_WITHOUT_GPU();
  for (const int dtype : {kRegionBf16, kRegionFp16, kRegionF32}) {
    for (const bool host : {false, true}) {
      for (const int shift : {0, 1}) {  // elements off a 16-byte boundary
        const size_t eb = dtype == kRegionF32 ? 4 : 2;
        const size_t item_bytes = (kStride + 8) * eb;
        ClientMemory mem(kItems * item_bytes + 64, host);
        std::vector<RegionIoItem> items(kItems);
        std::vector<std::vector<float>> want(kItems);
        const int bad_at[kItems] = {-1, 37, kStride - 1};
        for (int i = 0; i < kItems; ++i) {
          std::vector<float> x = Values(kStride, 100 * dtype + 10 * i + shift);
          if (bad_at[i] >= 0) {
            x[bad_at[i]] = std::numeric_limits<float>::quiet_NaN();
            if (bad_at[i] + 50 < kStride) x[bad_at[i] + 50] = std::numeric_limits<float>::infinity();
          }
          const size_t at = i * item_bytes + shift * eb;
          const std::vector<uint8_t> wire = ToWire(x, dtype);
          mem.Write(at, wire);
          for (int e = 0; e < kStride; ++e) want[i].push_back(FromWire(wire.data(), e, dtype));
          items[i].src = static_cast<uint8_t*>(mem.ptr) + at;
          items[i].src_dtype = dtype;
          items[i].row = kItems - 1 - i;  // rows need not follow items
          items[i].elements = kStride;
        }
        DeviceBuffer items_dev, rows(kItems * kStride * 4);
        ASSERT_TRUE(items_dev.Upload(items));
        // The flags in the client's kind of memory, every byte zero first:
        // a flag the gather did not store would read "bad at 0".
        const size_t flag_bytes = kItems * kGatherBlocks * 4;
        ClientMemory bad(flag_bytes, host);
        bad.Write(0, std::vector<uint8_t>(flag_bytes, 0));
        GatherParams p;
        p.items_dev = items_dev.get<RegionIoItem>();
        p.items = kItems;
        p.stride = kStride;
        p.dst_dev = rows.get<float>();
        p.bad_dev = static_cast<int32_t*>(bad.ptr);
        ASSERT_TRUE(LaunchGather(p, nullptr).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> got;
        ASSERT_TRUE(rows.Download(&got));
        const std::vector<uint8_t> flag_bytes_got = bad.Read(0, flag_bytes);
        std::vector<int32_t> flags(kItems * kGatherBlocks);
        std::memcpy(flags.data(), flag_bytes_got.data(), flag_bytes);
        const std::string what = ::testing::PrintToString(std::vector<int>{dtype, host, shift});
        for (int i = 0; i < kItems; ++i) {
          int differ = 0;
          for (int e = 0; e < kStride; ++e) {
            const float g = got[items[i].row * kStride + e], w = want[i][e];
            // NaN payloads are not part of the contract (a NaN query is refused).
            if (std::isnan(g) && std::isnan(w)) continue;
            differ += std::memcmp(&g, &w, 4) != 0;
          }
          EXPECT_EQ(differ, 0) << what << " item " << i;
          EXPECT_EQ(GatherBad(flags.data(), i), bad_at[i] < 0 ? kNoBadElement : bad_at[i]) << what << " item " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace driftkv
