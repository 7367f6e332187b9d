#include "backends/registry.h"

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace driftkv {
namespace {

struct Registry {
  absl::Mutex mu;
  std::map<std::string, BackendFactory> factories ABSL_GUARDED_BY(mu);
};

// Never destroyed: registrations may run from static initializers of any
// translation unit, and lookups until exit.
Registry& GetRegistry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

bool RegisterBackend(const std::string& name, BackendFactory factory) {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  r.factories[name] = std::move(factory);
  return true;
}

std::vector<std::string> BackendNames() {
  Registry& r = GetRegistry();
  absl::MutexLock lock(&r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& name, const BackendArgs& args) {
  BackendFactory factory;
  {
    Registry& r = GetRegistry();
    absl::MutexLock lock(&r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    return absl::InvalidArgumentError(absl::StrCat("backend \"", name,
                                                   "\" is not available in this build (available: ",
                                                   absl::StrJoin(BackendNames(), ", "), ")"));
  }
  return factory(args);
}

}  // namespace driftkv
