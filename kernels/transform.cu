#include "kernels/transform.h"

#include "absl/strings/str_cat.h"
#include "kernels/device_common.cuh"

namespace driftkv {
namespace gpu {
namespace {

constexpr int kMaxHeadDim = 128;

__global__ void __launch_bounds__(kMaxHeadDim) HeadTransformKernel(HeadTransformParams p) {
  __shared__ float x[kMaxHeadDim];
  const int row = blockIdx.x, h = blockIdx.y, i = threadIdx.x, d = p.head_dim;
  const size_t off = (static_cast<size_t>(row) * p.heads + h) * d;
  if (i < d) x[i] = p.in_dev[off + i];
  __syncthreads();  // the whole vector is read before any of it is overwritten
  if (i >= d) return;
  const int layer = p.layer_dev[row / p.rows_per_layer];
  if (layer < 0 || layer >= p.layers) {
    p.out_dev[off + i] = __int_as_float(0x7fc00000);
    return;
  }
  const int kv = h / (p.heads / p.kv_heads);
  p.out_dev[off + i] = TransformedChannel(TransformMatrixAt(p.mats_dev, layer, kv, p.matrix, p.kv_heads, d), x, i, d);
}

}  // namespace

absl::Status LaunchHeadTransform(const HeadTransformParams& p, cudaStream_t stream) {
  if (p.head_dim < 1 || p.head_dim > kMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim ", p.head_dim, " outside [1, ", kMaxHeadDim, "]"));
  }
  if (p.kv_heads < 1 || p.heads < p.kv_heads || p.heads % p.kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("heads ", p.heads, " not a multiple of kv_heads ", p.kv_heads));
  }
  if (p.rows_per_layer < 1) return absl::InvalidArgumentError("rows_per_layer < 1");
  if (p.rows <= 0) return absl::OkStatus();
  HeadTransformKernel<<<dim3(p.rows, p.heads), kMaxHeadDim, 0, stream>>>(p);
  return CudaStatus(cudaGetLastError(), "head transform launch");
}

}  // namespace gpu
}  // namespace driftkv
