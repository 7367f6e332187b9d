// The gather of client tensors (kernels/region_io.h): blockIdx.y is
// the item, threads stride its elements. A client's offset need only be
// element-aligned: a tensor at a 16-byte aligned address (the usual case)
// moves 16 bytes per thread and access, which matters most for host
// memory read over PCIe, where each access is a bus transaction; any other
// moves element by element. Both give the same values.
#include "kernels/region_io.h"

#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Blocks per item (kGatherBlocks): keeps enough loads in flight for
// 4K-element queries.
constexpr int kBlocksPerItem = kGatherBlocks;

__device__ __forceinline__ float LoadAsFloat(const void* p, int i, int dtype) {
  switch (dtype) {
    case kRegionBf16: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
    case kRegionFp16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(p)[i]));
    default: return static_cast<const float*>(p)[i];
  }
}

__global__ void CopySegmentsKernel(CopySegmentsParams p) {
  const CopySegment s = p.segments[blockIdx.x];
  const uintptr_t both = reinterpret_cast<uintptr_t>(s.src) | reinterpret_cast<uintptr_t>(s.dst) | s.bytes;
  if (both % 16 == 0) {
    const uint4* src = static_cast<const uint4*>(s.src);
    uint4* dst = static_cast<uint4*>(s.dst);
    for (uint32_t i = threadIdx.x; i < s.bytes / 16; i += blockDim.x) dst[i] = src[i];
  } else {
    const uint8_t* src = static_cast<const uint8_t*>(s.src);
    uint8_t* dst = static_cast<uint8_t*>(s.dst);
    for (uint32_t i = threadIdx.x; i < s.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__device__ __forceinline__ bool Aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// The 16 bytes at chunk c of src as floats: 8 of bf16 or fp16, 4 of f32.
__device__ __forceinline__ int LoadChunk(const void* src, int c, int dtype, float x[8]) {
  const uint4 raw = static_cast<const uint4*>(src)[c];
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  if (dtype == kRegionF32) {
    for (int k = 0; k < 4; ++k) x[k] = __uint_as_float(w[k]);
    return 4;
  }
  for (int k = 0; k < 4; ++k) {
    const uint16_t lo = static_cast<uint16_t>(w[k] & 0xffffu), hi = static_cast<uint16_t>(w[k] >> 16);
    if (dtype == kRegionBf16) {
      x[2 * k] = __uint_as_float(static_cast<uint32_t>(lo) << 16);
      x[2 * k + 1] = __uint_as_float(static_cast<uint32_t>(hi) << 16);
    } else {
      x[2 * k] = __half2float(__ushort_as_half(lo));
      x[2 * k + 1] = __half2float(__ushort_as_half(hi));
    }
  }
  return 8;
}

__global__ void GatherKernel(GatherParams p) {
  const RegionIoItem io = p.items_dev[blockIdx.y];
  float* dst = p.dst_dev == nullptr ? nullptr : p.dst_dev + static_cast<size_t>(io.row) * p.stride;
  const int per = io.src_dtype == kRegionF32 ? 4 : 8;  // elements per 16 bytes
  int32_t bad = kNoBadElement;                         // this thread's lowest
  if (Aligned16(io.src) && (dst == nullptr || Aligned16(dst)) && io.elements % per == 0) {
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < io.elements / per; c += gridDim.x * blockDim.x) {
      float x[8];
      LoadChunk(io.src, c, io.src_dtype, x);
      if (dst != nullptr) {
        float4* d = reinterpret_cast<float4*>(dst + static_cast<size_t>(c) * per);
        d[0] = make_float4(x[0], x[1], x[2], x[3]);
        if (per == 8) d[1] = make_float4(x[4], x[5], x[6], x[7]);
      }
      for (int k = per - 1; k >= 0; --k) {
        if (!(fabsf(x[k]) <= io.limit)) bad = min(bad, c * per + k);
      }
    }
  } else {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < io.elements; i += gridDim.x * blockDim.x) {
      const float x = LoadAsFloat(io.src, i, io.src_dtype);
      if (dst != nullptr) dst[i] = x;
      if (!(fabsf(x) <= io.limit)) bad = min(bad, i);
    }
  }
  if (p.bad_dev == nullptr) return;
  __shared__ int32_t block_bad;
  if (threadIdx.x == 0) block_bad = kNoBadElement;
  __syncthreads();
  if (bad != kNoBadElement) atomicMin(&block_bad, bad);
  __syncthreads();
  if (threadIdx.x == 0) p.bad_dev[blockIdx.y * kGatherBlocks + blockIdx.x] = block_bad;
}

}  // namespace

absl::Status LaunchCopySegments(const CopySegmentsParams& p, cudaStream_t stream) {
  if (p.count <= 0 || p.count > kMaxCopySegments) {
    return absl::InvalidArgumentError(absl::StrCat("copy of ", p.count, " segments (1 to ", kMaxCopySegments, ")"));
  }
  CopySegmentsKernel<<<p.count, 128, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "copy segments launch");
}

absl::Status LaunchGather(const GatherParams& p, cudaStream_t stream) {
  if (p.items <= 0 || p.items > 65535 || p.stride <= 0 || p.items_dev == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("gather of ", p.items, " items, rows of ", p.stride));
  }
  GatherKernel<<<dim3(kBlocksPerItem, p.items), kThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "gather launch");
}

}  // namespace gpu
}  // namespace driftkv
