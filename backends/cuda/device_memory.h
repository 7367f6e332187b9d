// Device and pinned host buffers of the CUDA backend, and CUDA errors as
// statuses.
#ifndef DRIFTKV_BACKENDS_CUDA_DEVICE_MEMORY_H_
#define DRIFTKV_BACKENDS_CUDA_DEVICE_MEMORY_H_

#include <algorithm>
#include <cstddef>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace driftkv {
namespace cuda_backend {

// Internal naming the call when `e` is an error.
inline absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(e)));
}

// Where a GrowableBuffer lives. Pinned staging grows by half again, so that
// slowly growing batches reallocate rarely; device scratch grows to fit.
struct DeviceMemory {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMalloc(p, bytes); }
  static void Free(void* p) { cudaFree(p); }
  static constexpr const char* kWhat = "cudaMalloc (scratch)";
  static constexpr bool kGrowByHalf = false;
};
// Device memory that starts zeroed (the merge counters of the level
// kernel, which each launch leaves zero again). The memset waits for the
// device: allocation is rare, and the buffer is used only after it.
struct ZeroedDeviceMemory {
  static cudaError_t Alloc(void** p, size_t bytes) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) e = cudaMemset(*p, 0, bytes);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e;
  }
  static void Free(void* p) { cudaFree(p); }
  static constexpr const char* kWhat = "cudaMalloc (zeroed scratch)";
  static constexpr bool kGrowByHalf = false;
};
struct PinnedHostMemory {
  static cudaError_t Alloc(void** p, size_t bytes) { return cudaMallocHost(p, bytes); }
  static void Free(void* p) { cudaFreeHost(p); }
  static constexpr const char* kWhat = "cudaMallocHost (staging)";
  static constexpr bool kGrowByHalf = true;
};

// A buffer that only grows; freed with the backend.
template <typename Memory>
class GrowableBuffer {
 public:
  ~GrowableBuffer() { Memory::Free(ptr_); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    const size_t want = Memory::kGrowByHalf ? std::max(bytes, size_ + size_ / 2) : bytes;
    Memory::Free(ptr_);
    ptr_ = nullptr;
    size_ = 0;
    absl::Status st = Cuda(Memory::Alloc(&ptr_, want), Memory::kWhat);
    if (st.ok()) size_ = want;
    return st;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};
using Scratch = GrowableBuffer<DeviceMemory>;
using ZeroedScratch = GrowableBuffer<ZeroedDeviceMemory>;
using PinnedScratch = GrowableBuffer<PinnedHostMemory>;

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_DEVICE_MEMORY_H_
