#include "backends/registry.h"

#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "codec/dquant_kv_codec.h"

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
    return absl::InvalidArgumentError(absl::StrCat("backend \"", name, "\" is not available in this build (available: ",
                                                   absl::StrJoin(BackendNames(), ", "), ")"));
  }
  return factory(args);
}

absl::StatusOr<const DQuantCodec*> ServedDQuant(const std::string& backend, const BackendArgs& args) {
  const auto* dq = dynamic_cast<const DQuantKvCodec*>(args.codec);
  if (dq == nullptr || args.page_format != kContainerPageFormat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backend \"", backend, "\" serves codec \"dquant\" in page format \"", kContainerPageFormat, "\", not codec \"",
        args.codec == nullptr ? "" : args.codec->name(), "\" in \"", args.page_format, "\""));
  }
  return &dq->codec();
}

}  // namespace driftkv
