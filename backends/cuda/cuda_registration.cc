// Registers the CUDA backend (backends/cuda/cuda_backend.h) as "cuda" for
// driftkv-server-cuda: `--backend cuda` (or backend: "cuda" in the config).
// Linked with alwayslink so that the static initializer runs.
#include "absl/flags/flag.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"

ABSL_FLAG(int, device, 0, "CUDA device index for --backend cuda");

namespace driftkv {
namespace {

const bool kCudaRegistered = RegisterBackend("cuda", [](const BackendArgs& a) -> absl::StatusOr<std::unique_ptr<Backend>> {
  absl::StatusOr<const DQuantCodec*> codec = ServedDQuant("cuda", a);
  if (!codec.ok()) return codec.status();
  return MakeCudaBackend(*codec, a.pool, absl::GetFlag(FLAGS_device), a.transforms, a.values_folded,
                         kDefaultWindowCacheBytes, a.hot_pool);
});

}  // namespace
}  // namespace driftkv
