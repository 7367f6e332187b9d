// Registers the CPU backend as "cpu" (backends/registry.h). Linked with
// alwayslink so that the static initializer runs.
#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"

namespace driftkv {
namespace {

const bool kCpuRegistered = RegisterBackend("cpu", [](const BackendArgs& a) { return MakeCpuBackend(a); });

}  // namespace
}  // namespace driftkv
