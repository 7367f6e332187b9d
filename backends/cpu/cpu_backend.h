// The CPU backend ("cpu"): codec calls on the host, fanned out over a pool
// of threads shared by all calls when a call carries more than one page or
// item. With WUSH transforms (backends/backend.h, TRANSFORMS) it runs the
// transform stage of codec/transform/transform.h around the codec, with one
// LayerTransform per layer built at construction, and attends through
// TransformedCompressedAttention. With BackendArgs::hot_pool (HOT TIER in
// backends/backend.h) the hot pool is host memory too: pages move with
// codec/level_page.h's PromotePage/DemotePage and hot jobs attend through
// LevelAttention (TransformedLevelAttention with transforms), split over
// threads exactly like cold jobs, so both tiers give the same bits.
#ifndef DRIFTKV_BACKENDS_CPU_CPU_BACKEND_H_
#define DRIFTKV_BACKENDS_CPU_CPU_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/page_pool.h"
#include "backends/registry.h"
#include "codec/dquant_codec.h"

namespace driftkv {

// Without transforms; codec and pool must outlive the backend. `threads`
// bounds the threads one call fans out to (0: hardware concurrency, at
// most 16).
std::unique_ptr<Backend> MakeCpuBackend(const DQuantCodec* codec, const PagePool* pool, int threads = 0);

// With everything BackendArgs carries; with transforms it precomputes each
// layer's LayerTransform (InvalidArgument if the set's shape differs from
// the codec's or the codec rotates). InvalidArgument too when hot_pool is
// set and the codec has no level page or the pool's pages are not its
// level pages.
absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const BackendArgs& args);

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CPU_CPU_BACKEND_H_
