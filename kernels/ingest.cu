#include "kernels/ingest.h"

#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {
namespace {

__device__ __forceinline__ float LoadValue(const void* src, int dtype, size_t i) {
  if (dtype == 3) return static_cast<const float*>(src)[i];
  const uint16_t b = static_cast<const uint16_t*>(src)[i];
  if (dtype == 1) return __uint_as_float(static_cast<uint32_t>(b) << 16);
  return __half2float(__ushort_as_half(b));
}

// wire/half.h FloatToBf16, then back to float.
__device__ __forceinline__ float RoundBf16(float f) {
  return Bf16ToFloatDev(FloatToBf16Dev(f));
}

__global__ void IngestKernel(IngestParams p) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.elements; i += stride) {
    const float x = LoadValue(p.src_dev, p.dtype, i);
    if (p.first_bad_dev != nullptr && (!isfinite(x) || fabsf(x) > p.limit)) {
      atomicMin(p.first_bad_dev, static_cast<unsigned long long>(i));
    }
    if (p.out_dev != nullptr) p.out_dev[i] = RoundBf16(x);
  }
}

}  // namespace

absl::Status LaunchIngest(const IngestParams& p, cudaStream_t stream) {
  if (p.elements == 0) return absl::OkStatus();
  if (p.dtype < 1 || p.dtype > 3) return absl::InvalidArgumentError(absl::StrCat("ingest: dtype ", p.dtype));
  const int threads = 256;
  const size_t want = (p.elements + threads - 1) / threads;
  const int blocks = static_cast<int>(want < 132 * 16 ? want : 132 * 16);
  IngestKernel<<<blocks, threads, 0, stream>>>(p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return absl::InternalError(absl::StrCat("ingest launch: ", cudaGetErrorString(e)));
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace driftkv
