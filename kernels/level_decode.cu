// The level decoders' exhaustive self-test on the device
// (kernels/level_decode.cuh): every (lower, upper) byte pair of values and
// every key field position, against the levels they stand for.
#include <cstdint>

#include "absl/status/statusor.h"
#include "kernels/device_common.cuh"
#include "kernels/level_decode.cuh"
#include "kernels/level_decode.h"

namespace driftkv {
namespace gpu {
namespace {

// Counts wrong levels into *bad.
__global__ void DecodeSelfTestKernel(int* bad) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const DecodeConsts dc = MakeDecodeConsts();
  if (i < 216 * 216) {
    const uint32_t lo = i % 216, hi = i / 216;
    for (int k = 0; k < 2; ++k) {
      const uint32_t word = k == 0 ? (lo | (hi << 16)) : ((lo << 8) | (hi << 24));
      uint32_t d[3];
      if (k == 0) {
        Triple<0x4240u>(word, dc, d[0], d[1], d[2]);
      } else {
        Triple<0x4341u>(word, dc, d[0], d[1], d[2]);
      }
      uint32_t plo = lo, phi = hi;
      for (int j = 0; j < 3; ++j, plo /= 6, phi /= 6) {
        const uint32_t want =
            __half_as_ushort(__float2half_rn(static_cast<float>(plo % 6))) |
            (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(static_cast<float>(phi % 6)))) << 16);
        if (d[j] != want) atomicAdd(bad, 1);
      }
    }
  }
  if (i < 64 * 16) {
    // Levels a (lower) and b (upper) at pair e of a key group, other pairs 7.
    const uint32_t a = i % 8, b = (i / 8) % 8, e = i / 64;
    uint32_t w[3] = {0, 0, 0};
    for (int q = 0; q < 16; ++q) {
      const uint32_t la = q == static_cast<int>(e) ? a : 7u, lb = q == static_cast<int>(e) ? b : 7u;
      if (q < 15) {
        w[q / 5] |= (la << (3 * (q % 5))) | (lb << (16 + 3 * (q % 5)));
      } else {
        for (int bit = 0; bit < 3; ++bit) w[bit] |= (((la >> bit) & 1u) << 15) | (((lb >> bit) & 1u) << 31);
      }
    }
    uint32_t pr[16];
    KeyGroupPairs(w[0], w[1], w[2], pr);
    for (int q = 0; q < 16; ++q) {
      const uint32_t la = q == static_cast<int>(e) ? a : 7u, lb = q == static_cast<int>(e) ? b : 7u;
      // The fp16 subnormals level * 2^(p - 24): the levels' bits at p.
      const uint32_t want = (la << kKeyPairPos[q]) | (lb << (16 + kKeyPairPos[q]));
      if (pr[q] != want) atomicAdd(bad, 1);
    }
  }
}

}  // namespace

absl::StatusOr<int> LevelDecodeSelfTest() {
  int* bad = nullptr;
  cudaError_t e = cudaMalloc(&bad, sizeof(int));
  if (e != cudaSuccess) return CudaStatus(e, "cudaMalloc");
  int h = 0;
  e = cudaMemset(bad, 0, sizeof(int));
  if (e == cudaSuccess) {
    DecodeSelfTestKernel<<<(216 * 216 + 255) / 256, 256>>>(bad);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(&h, bad, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(bad);
  if (e != cudaSuccess) return CudaStatus(e, "level decode self-test");
  return h;
}

}  // namespace gpu
}  // namespace driftkv
