// Registers the CUDA backend (backends/cuda/cuda_backend.h) as "cuda" for
// driftkv-server-cuda: `--backend cuda` (or backend: "cuda" in the config).
// With several devices (config devices, --devices) one CUDA backend per
// device behind backends/multi_device.h, peer access enabled between them
// (the owner of a sequence reads NCCL staging on the first device).
// Linked with alwayslink so that the static initializer runs.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/multi_device.h"
#include "backends/registry.h"

namespace driftkv {
namespace {

const bool kCudaRegistered =
    RegisterBackend("cuda", [](const BackendArgs& a) -> absl::StatusOr<std::unique_ptr<Backend>> {
      absl::StatusOr<const DQuantCodec*> codec = ServedDQuant("cuda", a);
      if (!codec.ok()) return codec.status();
      const size_t cold_scratch = a.device_cold_scratch_bytes >= 0 ? static_cast<size_t>(a.device_cold_scratch_bytes)
                                                                   : kDefaultColdScratchBytes;
      if (a.devices.size() <= 1) {
        const int device = a.devices.empty() ? 0 : a.devices[0];  // config devices / --devices
        return MakeCudaBackend(*codec, a.pool, device, a.transforms, a.values_folded,
                               a.device_window_cache_bytes > 0 ? a.device_window_cache_bytes : kDefaultWindowCacheBytes,
                               a.hot_pool, 0, cold_scratch);
      }
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
      for (size_t k = 0; k < a.devices.size(); ++k) {
        if (a.devices[k] >= count) {
          return absl::InvalidArgumentError(
              absl::StrCat("devices[", k, "] ", a.devices[k], ": this machine has ", count, " CUDA devices"));
        }
      }
      for (int x : a.devices) {
        for (int y : a.devices) {
          int can = 0;
          if (x != y && cudaDeviceCanAccessPeer(&can, x, y) == cudaSuccess && can) {
            cudaSetDevice(x);
            cudaDeviceEnablePeerAccess(y, 0);
            cudaGetLastError();  // "already enabled" is fine
          }
        }
      }
      std::vector<std::unique_ptr<Backend>> inner;
      for (size_t k = 0; k < a.devices.size(); ++k) {
        absl::StatusOr<std::unique_ptr<Backend>> b =
            MakeCudaBackend(*codec, a.pool, a.devices[k], a.transforms, a.values_folded,
                            a.device_window_cache_bytes > 0 ? a.device_window_cache_bytes : kDefaultWindowCacheBytes,
                            a.hot_pool, static_cast<int>(k), cold_scratch);
        if (!b.ok())
          return absl::Status(b.status().code(), absl::StrCat("device ", a.devices[k], ": ", b.status().message()));
        inner.push_back(*std::move(b));
      }
      return MakeMultiDeviceBackend(std::move(inner), a.pool, a.hot_pool, a.attend_batching, a.attend_observer);
    });

}  // namespace
}  // namespace driftkv
