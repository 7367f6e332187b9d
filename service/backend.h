// The compute backend of the service: encodes pages, decodes tokens and runs
// batched decode attention over pages of a PagePool plus bf16 windows.
//
// The handler owns all state and locking; a backend is stateless between
// calls apart from caches it keeps for itself, and its methods may be called
// concurrently from many RPC threads (on disjoint pages when writing).
// Pointers are host memory: the CPU backend computes in place; a device
// backend (CUDA, kernels/) mirrors the arena on the device and uses the same
// page ids and layout (see page_pool.h).
#ifndef DRIFTKV_SERVICE_BACKEND_H_
#define DRIFTKV_SERVICE_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/attention.h"
#include "codec/kv_codec.h"
#include "codec/transforms_file.h"
#include "service/page_pool.h"

namespace driftkv {

// TRANSFORMS. With BackendArgs::transforms set (WUSH-KV, issue 6) the codec
// was built with rotation "identity" and the backend owns the transform
// stage of codec/transform.h, using layer `layer` of the set: keys are
// stored as T_K k and values as T_V v (values untouched when values_folded);
// DecodeTokens returns the model domain (T^-1 applied); Attend scores the
// pages with q' = T_K^-T q, maps the pages' output back with T_V^-1 and
// attends the bf16 window (model domain) with q itself, merging the two by
// their log-sum-exp (codec/transform_attention.h). Without transforms the
// layer fields are ignored.

// Encode P = page_tokens tokens into one page.
struct EncodeJob {
  const float* keys = nullptr;    // [P][kv_heads][head_dim], host
  const float* values = nullptr;  // same shape
  PageId page = -1;
  int layer = 0;                  // selects the transform; see TRANSFORMS
  CodecStats stats;               // out: this page's stream statistics
  // out, optional: each stream's rANS bytes used / payload bytes, keys and
  // values (P each); a backend that leaves them empty reports only `stats`.
  std::vector<float> key_utilization, value_utilization;
};

// One decode-attention item.
struct AttendJob {
  absl::Span<const PageId> pages;  // full pages, oldest first
  Bf16Tokens window;               // the newest tokens, after the pages
  // Names the window's content for backends that keep windows on the
  // device between calls: window_id is nonzero and unique to one (sequence,
  // layer) for the process's life, window_first is the absolute index of
  // window.keys[0] in that layer. A stored token never changes, so (id,
  // first, tokens) determines the content. 0: nothing to cache.
  uint64_t window_id = 0;
  int64_t window_first = 0;
  const float* query = nullptr;    // [q_heads][head_dim]
  int q_heads = 0;
  float softmax_scale = 0.0f;
  int layer = 0;                   // selects the transform; see TRANSFORMS
  float* out = nullptr;            // [q_heads][head_dim]
  float* lse = nullptr;            // [q_heads]
  absl::Status status;             // out
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Encodes every job; returns the first failure (InvalidArgument naming the
  // token). Pages of failed jobs hold garbage; the caller frees them.
  virtual absl::Status EncodePages(absl::Span<EncodeJob> jobs) = 0;

  // Reconstructs tokens [first, first + count) of a page of layer `layer`
  // into float [count][kv_heads][head_dim] arrays (model domain). DataLoss
  // on a corrupt record.
  virtual absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys,
                                    float* values) = 0;

  // Runs every job; each job's status says how it went.
  virtual void Attend(absl::Span<AttendJob> jobs) = 0;

  // True when one Attend over many jobs costs much less than several over
  // few (one kernel launch each): the handler then merges concurrent calls
  // (service/attend_batcher.h).
  virtual bool PrefersBatchedAttend() const { return false; }
};

// The CPU backend without transforms; codec and pool must outlive it.
// `threads` bounds the threads one call fans out to (0: hardware
// concurrency). The BackendArgs overload below also takes transforms.
std::unique_ptr<Backend> MakeCpuBackend(const DQuantCodec* codec, const PagePool* pool,
                                        int threads = 0);

// Backends by name, for ServiceOptions::backend / --backend. "cpu" is always
// there; another backend registers itself from its library, e.g. with a
// static initializer in a cc_library(alwayslink = True) that a server binary
// links:
//   static const bool kRegistered = RegisterBackend("cuda", [](const BackendArgs& a) {
//     return MakeCudaBackend(a.codec, a.pool);
//   });
struct BackendArgs {
  const DQuantCodec* codec = nullptr;  // must outlive the backend
  const PagePool* pool = nullptr;      // must outlive the backend
  int threads = 0;                     // ServiceOptions::backend_threads
  // WUSH-KV transforms (see TRANSFORMS), or null for the codec's own
  // rotation. Must outlive the backend; its kv_heads/head_dim match the
  // codec's and it has a matrix set for every layer the handler serves.
  const TransformSet* transforms = nullptr;
  bool values_folded = false;          // T_V is folded into the model's weights
};
using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendArgs&)>;

// The CPU backend ("cpu") with everything BackendArgs carries; with
// transforms it precomputes each layer's LayerTransform (InvalidArgument if
// the set's shape differs from the codec's or the codec rotates).
absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const BackendArgs& args);
// Returns true (for use in static initializers); a second registration of a
// name replaces the first.
bool RegisterBackend(const std::string& name, BackendFactory factory);
// InvalidArgument naming the registered backends when `name` is unknown;
// otherwise what the factory returns.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& name, const BackendArgs& args);
std::vector<std::string> BackendNames();

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_BACKEND_H_
