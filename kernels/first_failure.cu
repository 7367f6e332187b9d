#include "kernels/first_failure.cuh"

namespace driftkv {
namespace gpu {
namespace {

__global__ void ResetKernel(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) s[i] = kNoFailure;
}
__global__ void FinishKernel(int32_t* s, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && s[i] == kNoFailure) s[i] = 0;
}

}  // namespace

void LaunchFirstFailureReset(int32_t* status_dev, int pages, cudaStream_t stream) {
  if (status_dev != nullptr && pages > 0) ResetKernel<<<(pages + 255) / 256, 256, 0, stream>>>(status_dev, pages);
}
void LaunchFirstFailureFinish(int32_t* status_dev, int pages, cudaStream_t stream) {
  if (status_dev != nullptr && pages > 0) FinishKernel<<<(pages + 255) / 256, 256, 0, stream>>>(status_dev, pages);
}

}  // namespace gpu
}  // namespace driftkv
