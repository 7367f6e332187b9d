// Gather and scatter of client tensors (kernels/region_io.h): blockIdx.y is
// the item, threads stride its elements. Accesses are element-wide, not
// 16-byte: a client's offset need only be element-aligned.
#include "kernels/region_io.h"

#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Blocks per item: keeps enough loads in flight for 4K-element queries.
constexpr int kBlocksPerItem = 4;

__device__ __forceinline__ float LoadAsFloat(const void* p, int i, int dtype) {
  switch (dtype) {
    case kRegionBf16: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16);
    case kRegionFp16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(p)[i]));
    default: return static_cast<const float*>(p)[i];
  }
}

// wire/half.h FloatToBf16, bit for bit.
__device__ __forceinline__ uint16_t ToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
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

__global__ void ResetBad(int32_t* bad, int items) {
  for (int i = threadIdx.x; i < items; i += blockDim.x) bad[i] = kNoBadElement;
}

__global__ void GatherKernel(GatherParams p) {
  const RegionIoItem io = p.items_dev[blockIdx.y];
  float* dst = p.dst_dev == nullptr ? nullptr : p.dst_dev + static_cast<size_t>(io.row) * p.stride;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < io.elements; i += gridDim.x * blockDim.x) {
    const float x = LoadAsFloat(io.src, i, io.src_dtype);
    if (dst != nullptr) dst[i] = x;
    if (p.bad_dev != nullptr && !isfinite(x)) atomicMin(p.bad_dev + blockIdx.y, i);
  }
}

__global__ void ScatterKernel(ScatterParams p) {
  const RegionIoItem io = p.items_dev[blockIdx.y];
  const float* out = p.out_dev + static_cast<size_t>(io.row) * p.stride;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < io.elements; i += gridDim.x * blockDim.x) {
    if (io.dst_dtype == kRegionBf16) {
      static_cast<uint16_t*>(io.dst)[i] = ToBf16(out[i]);
    } else {
      static_cast<float*>(io.dst)[i] = out[i];
    }
  }
  if (blockIdx.x == 0 && io.lse != nullptr) {
    for (int h = threadIdx.x; h < p.q_heads; h += blockDim.x) {
      io.lse[h] = p.lse_dev[static_cast<size_t>(io.row) * p.q_heads + h];
    }
  }
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
  if (p.bad_dev != nullptr && !p.bad_ready) ResetBad<<<1, 256, 0, stream>>>(p.bad_dev, p.items);
  GatherKernel<<<dim3(kBlocksPerItem, p.items), kThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "gather launch");
}

absl::Status LaunchScatter(const ScatterParams& p, cudaStream_t stream) {
  if (p.items <= 0 || p.items > 65535 || p.stride <= 0 || p.items_dev == nullptr || p.out_dev == nullptr ||
      p.lse_dev == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("scatter of ", p.items, " items, rows of ", p.stride));
  }
  ScatterKernel<<<dim3(kBlocksPerItem, p.items), kThreads, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "scatter launch");
}

}  // namespace gpu
}  // namespace driftkv
