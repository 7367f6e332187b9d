#include "service/call_trace.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace driftkv {

std::unique_ptr<CallTrace> CallTrace::FromEnv() {
  const char* path = std::getenv("DRIFTKV_ATTEND_TRACE");
  if (path == nullptr || *path == '\0') return nullptr;
  return std::make_unique<CallTrace>(path);
}

CallTrace::CallTrace(std::string path) : path_(std::move(path)) {
  calls_.reserve(4096);
}

CallTrace::~CallTrace() {
  std::FILE* f = std::fopen(path_.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "driftkv-server: cannot write the call trace to %s\n", path_.c_str());
    return;
  }
  std::fprintf(f, "arrived_ns,served_ns,finished_ns,phases_ns\n");
  for (const Call& c : calls_) {
    std::fprintf(f, "%lld,%lld,%lld,%lld\n", static_cast<long long>(c.arrived_ns), static_cast<long long>(c.served_ns),
                 static_cast<long long>(c.finished_ns), static_cast<long long>(c.phases_ns));
  }
  std::fclose(f);
}

void CallTrace::Record(const Call& call) {
  std::lock_guard<std::mutex> lock(mu_);
  if (calls_.size() < kMaxCalls) calls_.push_back(call);
}

}  // namespace driftkv
