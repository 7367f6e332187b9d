// Handler::Prefetch: gets one sequence ready for its first Attend: its
// pages back from a level below, its layers hot, its windows on the
// device.
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::Prefetch(const v1::PrefetchRequest& request, v1::PrefetchResponse* response,
                               const std::string& tenant) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (!st.ok()) return st;
  SequencePtr seq = table_->Find(TenantKey(tenant, request.sequence_id()));
  auto not_found = [&](absl::string_view why) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found", why));
  };
  if (seq == nullptr) return not_found("");
  // An access, like the Attend it announces: the sequence becomes the most
  // recently used (the last to move down again) and its TTL restarts.
  table_->Touch(seq.get());
  std::vector<SpillPin> pins;
  int64_t restored = 0;
  st = Resident(seq.get(), request.sequence_id(), &pins, &restored);
  if (!st.ok()) return st;
  response->set_pages_restored(static_cast<uint64_t>(restored));
  const int layers = static_cast<int>(seq->layers.size());
  // The hot tier: every layer that holds tokens, promoted as an Attend of
  // all of them would (sync: together, in one device round trip; async:
  // queued, and layers_promoted counts none).
  if (hot_ != nullptr) {
    std::vector<std::pair<SequencePtr, int>> wanted;
    absl::flat_hash_set<uint64_t> ids;
    int hot_before = 0;
    {
      absl::ReaderMutexLock lock(&seq->mu);
      if (seq->released) return not_found(" (released)");
      for (int l = 0; l < layers; ++l) {
        LayerState& layer = seq->layers[l];
        absl::ReaderMutexLock layer_lock(&layer.mu);
        if (layer.hot) ++hot_before;
        if (!layer.pages.empty()) {
          wanted.emplace_back(seq, l);
          ids.insert(layer.id);
        }
      }
    }
    // A corrupt cold page: DATA_LOSS naming its page and layer; the layers
    // before it stay promoted.
    st = hot_->Prepare(wanted, ids);
    if (!st.ok()) return st;
    // Async: the background thread's promotions are not this call's (it
    // may have done some by now), so none is counted.
    if (options_.hot_promotion == HotPromotion::kSync) {
      int hot_after = 0;
      absl::ReaderMutexLock lock(&seq->mu);
      for (LayerState& layer : seq->layers) {
        absl::ReaderMutexLock layer_lock(&layer.mu);
        if (layer.hot) ++hot_after;
      }
      response->set_layers_promoted(static_cast<uint64_t>(std::max(0, hot_after - hot_before)));
    }
  }
  // The windows on the device, under every layer's read lock (the order of
  // an Attend's locks: the sequence, then its layers in address order).
  absl::ReaderMutexLock lock(&seq->mu);
  if (seq->released) return not_found(" (released)");
  std::vector<std::unique_ptr<absl::ReaderMutexLock>> layer_locks;
  std::vector<AttendJob> jobs;
  for (LayerState& layer : seq->layers) {
    layer_locks.push_back(std::make_unique<absl::ReaderMutexLock>(&layer.mu));
    if (layer.window_keys.empty()) continue;
    handler_internal::SetLayerTokens(layer, n(), pool_->page_tokens(), &jobs.emplace_back());
  }
  if (!jobs.empty()) st = backend_->CacheWindows(jobs);
  if (!st.ok()) return st;
  return absl::OkStatus();
}

}  // namespace driftkv
