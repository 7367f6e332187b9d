#include "transport/transport.h"

#include <atomic>

namespace driftkv {
namespace {

std::atomic<TransportFactory*>& Slot() {
  static std::atomic<TransportFactory*> slot{nullptr};
  return slot;
}

}  // namespace

TransportFactory* DefaultTransportFactory() {
  return Slot().load();
}

bool RegisterDefaultTransportFactory(TransportFactory* factory) {
  Slot().store(factory);
  return true;
}

}  // namespace driftkv
