// Handler's hooks into the hot tier (service/hot_tier.h) and its state for
// tests and tools. Attend brings its layers to the tier (handler_attend.cc).
#include "service/handler.h"

namespace driftkv {

void Handler::DrainPromotions() {
  if (hot_ != nullptr) hot_->DrainPromotions();
}

bool Handler::LayerIsHot(const std::string& sequence_id, uint32_t layer) {
  SequencePtr seq = table_->Find(sequence_id);
  if (seq == nullptr || layer >= seq->layers.size()) return false;
  absl::ReaderMutexLock seq_lock(&seq->mu);
  if (seq->released) return false;
  absl::ReaderMutexLock layer_lock(&seq->layers[layer].mu);
  return seq->layers[layer].hot;
}

bool Handler::WithLayerForTest(const std::string& key, uint32_t layer, const std::function<void(LayerState&)>& fn) {
  SequencePtr seq = table_->Find(key);
  if (seq == nullptr || layer >= seq->layers.size()) return false;
  absl::ReaderMutexLock seq_lock(&seq->mu);
  if (seq->released) return false;
  absl::MutexLock layer_lock(&seq->layers[layer].mu);
  fn(seq->layers[layer]);
  return true;
}

}  // namespace driftkv
