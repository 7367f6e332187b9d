// Memory regions of the CUDA backend (MEMORY REGIONS in backends/backend.h):
// clients' device allocations opened through CUDA IPC, and host regions
// page-locked for full-speed copies.
//
// IPC mappings belong to the process, not to one backend (CUDA opens a
// handle once per process), so the device each pointer was opened on is
// kept here, process-wide, for the close.
#ifndef DRIFTKV_BACKENDS_CUDA_IPC_REGIONS_H_
#define DRIFTKV_BACKENDS_CUDA_IPC_REGIONS_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace driftkv {
namespace cuda_backend {

// cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) of the 64-byte
// `handle` on `device`; the result is the device pointer of the
// allocation's base. Where the driver reports the allocation's range
// (cuMemGetAddressRange), a `size` past its end is OutOfRange and nothing
// stays open. InvalidArgument for a handle of another length or a device
// out of range; Internal with CUDA's words for the rest (a handle of a
// dead process, one opened already by this process).
absl::StatusOr<void*> OpenIpcMemory(const void* handle, size_t handle_bytes, int device, size_t size);
// cudaIpcCloseMemHandle on the device it was opened on. REQUIRES: from
// OpenIpcMemory, not closed yet.
void CloseIpcMemory(void* dev_ptr);

// cudaHostRegister(Portable) of [p, p + bytes); cudaHostUnregister.
absl::Status PinHostMemory(void* p, size_t bytes);
void UnpinHostMemory(void* p);

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_IPC_REGIONS_H_
