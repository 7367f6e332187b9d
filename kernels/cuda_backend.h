// The CUDA backend of the service (service/backend.h): the page arena is
// mirrored in device memory (one cudaMalloc, same page ids and layout as the
// host PagePool), pages are encoded on the GPU (kernels/encode.h) and copied
// back to the host arena so that host readers (DecodeTokens, persistence, the
// CPU backend) see the same bytes, and Attend runs all jobs of a call as one
// launch of the fused D-Quant kernel (kernels/attention.h). CUDA errors
// become statuses; nothing aborts. Calls are serialized on one stream.
//
// Wiring `driftkv-server --backend cuda` to MakeCudaBackend is left to
// service/ (not part of this change).
#ifndef DRIFTKV_KERNELS_CUDA_BACKEND_H_
#define DRIFTKV_KERNELS_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "codec/dquant_codec.h"
#include "service/backend.h"
#include "service/page_pool.h"

namespace driftkv {

// codec and pool must outlive the backend. Fails (FailedPrecondition) when no
// GPU is usable, or when the pool's layout is not one the kernels take.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const DQuantCodec* codec, const PagePool* pool,
                                                         int device = 0);

}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_CUDA_BACKEND_H_
