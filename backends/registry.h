// Backends by name, for the config's `backend` field and --backend.
//
// Each backend lives in its own folder (backends/cpu/, backends/cuda/) and
// registers itself from a cc_library(alwayslink = True) registration target
// that a server binary links, with one static initializer:
//   static const bool kRegistered = RegisterBackend("cuda", [](const BackendArgs& a) {
//     return MakeCudaBackend(a);
//   });
// The service links //backends/cpu:registration always, so "cpu" is always
// there; driftkv-server-cuda also links //backends/cuda:registration.
#ifndef DRIFTKV_BACKENDS_REGISTRY_H_
#define DRIFTKV_BACKENDS_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "backends/page_format.h"
#include "backends/page_pool.h"
#include "codec/dquant_kv_codec.h"
#include "codec/kv_codec.h"
#include "codec/transform/transforms_file.h"

namespace driftkv {

// What a backend is built from. A backend serves the codecs and page
// formats it has kernels for and refuses others (InvalidArgument naming
// them); both of today's serve D-Quant (DQuantKvCodec) in "container" pages.
struct BackendArgs {
  const KvCodec* codec = nullptr;                  // must outlive the backend
  std::string page_format = kContainerPageFormat;  // backends/page_format.h
  const PagePool* pool = nullptr;                  // must outlive the backend; pages of page_format
  int threads = 0;                                 // ServiceOptions::backend_threads
  // WUSH-KV transforms (see TRANSFORMS in backend.h), or null for the
  // codec's own rotation. Must outlive the backend; its kv_heads/head_dim
  // match the codec's and it has a matrix set for every layer the handler
  // serves.
  const TransformSet* transforms = nullptr;
  bool values_folded = false;  // T_V is folded into the model's weights
  // The hot tier's pool of level pages (HOT TIER in backend.h), or null when
  // the service runs without one. Must outlive the backend.
  const PagePool* hot_pool = nullptr;
  // Several devices (a multi-GPU server): the pool has one partition per
  // entry (PARTITIONS in page_pool.h) and the backend serves partition k on
  // devices[k]. Empty: one device, the backend's default.
  std::vector<int> devices;
  // ServiceOptions::attend_batching and the batch observer (metrics): a
  // multi-device backend batches each device on its own (multi_device.h).
  bool attend_batching = true;
  // CUDA: bytes of device memory for bf16 windows (0: the default).
  uint64_t device_window_cache_bytes = 0;
  // CUDA: bytes of device memory for cold launches' level pages (-1: the
  // default; 0: none).
  int64_t device_cold_scratch_bytes = -1;
  std::function<void(int calls, int jobs)> attend_observer;
};
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendArgs&)>;

// Returns true (for use in static initializers); a second registration of a
// name replaces the first.
bool RegisterBackend(const std::string& name, BackendFactory factory);
// InvalidArgument naming the registered backends when `name` is unknown;
// otherwise what the factory returns.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& name, const BackendArgs& args);

// For a backend that serves D-Quant in "container" pages only: the codec,
// or InvalidArgument naming the backend and what it was asked to serve.
absl::StatusOr<const DQuantCodec*> ServedDQuant(const std::string& backend, const BackendArgs& args);
std::vector<std::string> BackendNames();

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_REGISTRY_H_
