// The CUDA backend of the service (backends/backend.h): the page arena is
// mirrored in device memory (one cudaMalloc, same page ids and layout as the
// host PagePool), pages are encoded on the GPU (kernels/encode.h) and copied
// back to the host arena so that host readers (DecodeTokens, persistence, the
// CPU backend) see the same bytes, and Attend runs all jobs of a call as one
// launch of the fused D-Quant kernel (kernels/attention.h). CUDA errors
// become statuses; nothing aborts. Calls are serialized on one stream.
//
// With WUSH transforms the keys/values are transformed on the GPU before
// the encoder, queries before the fused kernel and outputs in its merge
// (kernels/transform.h), bit-identically to the CPU's LayerTransform; Read
// (DecodeTokens) decodes and inverts on the host.
#ifndef DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_H_
#define DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/page_pool.h"
#include "codec/dquant_codec.h"

namespace driftkv {

// codec and pool (and transforms, if given) must outlive the backend. Fails
// (FailedPrecondition) when no GPU is usable, when the pool's layout is not
// one the kernels take, or when `transforms` (WUSH-KV, backends/backend.h
// TRANSFORMS) does not match the codec (shape, rotation "identity").
// `window_cache_bytes` of device memory keep the bf16 windows between calls
// (backends/cuda/window_cache.h; 0: upload every window with every
// launch).
constexpr size_t kDefaultWindowCacheBytes = size_t{1} << 30;
// `hot_pool` (level pages, HOT TIER in backends/backend.h) enables the hot
// tier: a device arena of the same ids, promotion on the device, the
// level-page attention kernel for hot jobs.
// `cold_scratch_bytes` of device memory (allocated at start) hold level
// pages that a cold launch's pages are promoted into before the level
// kernel attends them (backends/cuda/cold_levels.h); a launch with more
// pages goes through them in chunks, an item with more through the fused
// cold kernel; 0: every cold launch fused.
constexpr size_t kDefaultColdScratchBytes = size_t{512} << 20;
// `partition` (PARTITIONS in backends/page_pool.h): the backend owns that
// partition's pages only, and its device arena holds just those (a
// multi-GPU server, backends/multi_device.h); with `hot_pool`, partitioned
// alike, its hot arena holds that partition's level pages.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const DQuantCodec* codec, const PagePool* pool, int device = 0,
                                                         const TransformSet* transforms = nullptr,
                                                         bool values_folded = false,
                                                         size_t window_cache_bytes = kDefaultWindowCacheBytes,
                                                         const PagePool* hot_pool = nullptr, int partition = 0,
                                                         size_t cold_scratch_bytes = kDefaultColdScratchBytes);

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_H_
