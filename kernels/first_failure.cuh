// Per-page "first failure" words that a kernel fills with atomicMin (nvcc
// only): promotion and demotion report, for each page of a launch, 0 or
// 1 + the index of its first record that failed. Before the kernel every
// word is set to "no failure" (the largest value, so that atomicMin keeps
// the smallest index); after it, words still saying so become 0.
#ifndef DRIFTKV_KERNELS_FIRST_FAILURE_CUH_
#define DRIFTKV_KERNELS_FIRST_FAILURE_CUH_

#include <cstdint>

#include <cuda_runtime.h>

namespace driftkv {
namespace gpu {

constexpr int32_t kNoFailure = 0x7fffffff;

void LaunchFirstFailureReset(int32_t* status_dev, int pages, cudaStream_t stream);
void LaunchFirstFailureFinish(int32_t* status_dev, int pages, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_FIRST_FAILURE_CUH_
