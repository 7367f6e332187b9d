// What a process that serves sets before anything touches a device.
#ifndef DRIFTKV_SERVICE_PROCESS_ENV_H_
#define DRIFTKV_SERVICE_PROCESS_ENV_H_

namespace driftkv {

// Call first in main(), before any CUDA call. CUDA loads a kernel's module
// at the kernel's first launch unless told otherwise, so the first request
// to use a kernel (a sequence's first Attend: the promotion, checksum and
// attention kernels) would pay for loading it: ~0.5 ms on the H200
// (docs/hot_tier.md, "The first Attend"). A server loads every module when
// its CUDA context is made instead (CUDA_MODULE_LOADING=EAGER), unless the
// environment already chose.
void PrepareServerProcess();

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_PROCESS_ENV_H_
