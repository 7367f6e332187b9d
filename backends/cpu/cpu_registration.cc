// Registers the CPU backend as "cpu" (backends/registry.h). Linked with
// alwayslink so that the static initializer runs.
#include "backends/cpu/cpu_backend.h"
#include "backends/multi_device.h"
#include "backends/registry.h"

namespace driftkv {
namespace {

// With `devices` (tests of a multi-device server without GPUs): one CPU
// backend per pool partition behind backends/multi_device.h.
const bool kCpuRegistered =
    RegisterBackend("cpu", [](const BackendArgs& a) -> absl::StatusOr<std::unique_ptr<Backend>> {
      if (a.devices.size() <= 1) return MakeCpuBackend(a);
      std::vector<std::unique_ptr<Backend>> inner;
      for (size_t k = 0; k < a.devices.size(); ++k) {
        absl::StatusOr<std::unique_ptr<Backend>> b = MakeCpuBackend(a);
        if (!b.ok()) return b.status();
        inner.push_back(*std::move(b));
      }
      return MakeMultiDeviceBackend(std::move(inner), a.pool, a.hot_pool);
    });

}  // namespace
}  // namespace driftkv
