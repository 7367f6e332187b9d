// Handler::Length: the token counts of every layer of one sequence.
#include "absl/strings/str_cat.h"
#include "service/handler.h"
#include "service/handler_internal.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::Length(const v1::LengthRequest& request, v1::LengthResponse* response,
                             const std::string& tenant) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (!st.ok()) return st;
  SequencePtr seq = table_->Find(TenantKey(tenant, request.sequence_id()));
  if (seq == nullptr) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  absl::ReaderMutexLock seq_lock(&seq->mu);
  if (seq->released) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
  }
  response->clear_layers();
  // One layer at a time, in ascending order (the lock order of handler.h):
  // each count is a consistent snapshot of its layer. Pages count the same
  // in either tier.
  const int64_t p = pool_->page_tokens();
  for (LayerState& layer : seq->layers) {
    absl::ReaderMutexLock layer_lock(&layer.mu);
    v1::LayerLength* l = response->add_layers();
    const uint64_t compressed = static_cast<uint64_t>(layer.pages.size()) * p;
    l->set_tokens(layer.length);
    l->set_compressed_tokens(compressed);
    l->set_window_tokens(layer.length - compressed);
  }
  return absl::OkStatus();
}

}  // namespace driftkv
