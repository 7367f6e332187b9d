// Minimal RAII device allocation for tests and benchmarks (plain cudaMalloc).
#ifndef DRIFTKV_KERNELS_TESTING_DEVICE_BUFFER_H_
#define DRIFTKV_KERNELS_TESTING_DEVICE_BUFFER_H_

#include <cstddef>
#include <vector>

#include <cuda_runtime.h>

namespace driftkv {
namespace gpu {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) { Resize(bytes); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool Resize(size_t bytes) {
    cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = bytes;
    return cudaMalloc(&ptr_, bytes > 0 ? bytes : 1) == cudaSuccess;
  }
  template <typename T>
  bool Upload(const std::vector<T>& v) {
    if (!Resize(v.size() * sizeof(T))) return false;
    return cudaMemcpy(ptr_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
  }
  template <typename T>
  bool Download(std::vector<T>* v) const {
    v->resize(bytes_ / sizeof(T));
    return cudaMemcpy(v->data(), ptr_, v->size() * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_TESTING_DEVICE_BUFFER_H_
