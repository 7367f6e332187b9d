#include "backends/cuda/ipc_regions.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/cuda/device_memory.h"

namespace driftkv {
namespace cuda_backend {
namespace {

// The device of every open IPC pointer.
struct OpenIpc {
  absl::Mutex mu;
  absl::flat_hash_map<void*, int> device ABSL_GUARDED_BY(mu);
};

OpenIpc& Open() {
  static OpenIpc* open = new OpenIpc();
  return *open;
}

// cuMemGetAddressRange through the runtime's driver entry point (no link
// against libcuda): CUresult (CUdeviceptr* base, size_t* size, CUdeviceptr).
using GetAddressRange = int (*)(unsigned long long*, size_t*, unsigned long long);

GetAddressRange AddressRangeFunction() {
  static GetAddressRange fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<GetAddressRange>(nullptr);
    }
    return reinterpret_cast<GetAddressRange>(f);
  }();
  return fn;
}

}  // namespace

absl::StatusOr<void*> OpenIpcMemory(const void* handle, size_t handle_bytes, int device, size_t size) {
  if (handle_bytes != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc_handle has ", handle_bytes,
                                                   " bytes; a cudaIpcMemHandle_t has ", sizeof(cudaIpcMemHandle_t)));
  }
  int count = 0;
  if (absl::Status st = Cuda(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !st.ok()) return st;
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " out of range [0, ", count, ")"));
  }
  if (absl::Status st = Cuda(cudaSetDevice(device), "cudaSetDevice"); !st.ok()) return st;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  void* p = nullptr;
  if (absl::Status st = Cuda(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
      !st.ok()) {
    return st;
  }
  if (GetAddressRange range = AddressRangeFunction(); range != nullptr) {
    unsigned long long base = 0;
    size_t bytes = 0;
    if (range(&base, &bytes, reinterpret_cast<uintptr_t>(p)) == 0) {
      const uint64_t room = bytes - (reinterpret_cast<uintptr_t>(p) - base);
      if (size > room) {
        cudaIpcCloseMemHandle(p);
        return absl::OutOfRangeError(
            absl::StrCat("size ", size, " is past the end of the IPC allocation (", room, " bytes)"));
      }
    }
  }
  absl::MutexLock lock(&Open().mu);
  Open().device[p] = device;
  return p;
}

void CloseIpcMemory(void* dev_ptr) {
  int device = -1;
  {
    absl::MutexLock lock(&Open().mu);
    auto it = Open().device.find(dev_ptr);
    if (it == Open().device.end()) return;
    device = it->second;
    Open().device.erase(it);
  }
  cudaSetDevice(device);
  cudaIpcCloseMemHandle(dev_ptr);
}

absl::Status PinHostMemory(void* p, size_t bytes) {
  // Mapped as well as page-locked: the attention path's gather and merge
  // kernels read queries from and write outputs to host regions in place
  // (CLIENT MEMORY in backends/backend.h), at the host address, which
  // needs unified addressing (every 64-bit Linux CUDA device).
  absl::Status st = Cuda(cudaHostRegister(p, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped),
                         "cudaHostRegister of a host region");
  if (!st.ok()) return st;
  void* dev = nullptr;
  st = Cuda(cudaHostGetDevicePointer(&dev, p, 0), "cudaHostGetDevicePointer of a host region");
  if (st.ok() && dev != p) {
    st = absl::FailedPreconditionError(
        "this device does not address registered host memory at its host address (no unified addressing)");
  }
  if (!st.ok()) cudaHostUnregister(p);
  return st;
}

void UnpinHostMemory(void* p) {
  cudaHostUnregister(p);
}

}  // namespace cuda_backend
}  // namespace driftkv
