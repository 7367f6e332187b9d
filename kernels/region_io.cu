// Gather and scatter of client tensors (kernels/region_io.h): blockIdx.y is
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
        if (!isfinite(x[k])) bad = min(bad, c * per + k);
      }
    }
  } else {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < io.elements; i += gridDim.x * blockDim.x) {
      const float x = LoadAsFloat(io.src, i, io.src_dtype);
      if (dst != nullptr) dst[i] = x;
      if (!isfinite(x)) bad = min(bad, i);
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

__global__ void ScatterKernel(ScatterParams p) {
  const RegionIoItem io = p.items_dev[blockIdx.y];
  const float* out = p.out_dev + static_cast<size_t>(io.row) * p.stride;
  const int per = io.dst_dtype == kRegionBf16 ? 8 : 4;  // elements per 16 bytes
  const bool vec = Aligned16(io.dst) && Aligned16(out) && io.elements % per == 0;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; vec && c < io.elements / per; c += gridDim.x * blockDim.x) {
    const float4* o = reinterpret_cast<const float4*>(out + static_cast<size_t>(c) * per);
    const float4 a = o[0];
    if (per == 4) {
      static_cast<float4*>(io.dst)[c] = a;
      continue;
    }
    const float4 b = o[1];
    const float x[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    uint32_t w[4];
    for (int k = 0; k < 4; ++k)
      w[k] = static_cast<uint32_t>(ToBf16(x[2 * k])) | (static_cast<uint32_t>(ToBf16(x[2 * k + 1])) << 16);
    static_cast<uint4*>(io.dst)[c] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; !vec && i < io.elements; i += gridDim.x * blockDim.x) {
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
