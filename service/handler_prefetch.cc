// Handler::Prefetch: brings one sequence's pages back from the disk level.
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
  if (seq == nullptr) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  // An access, like the Attend it announces: the sequence becomes the most
  // recently used (the last to move down again) and its TTL restarts.
  table_->Touch(seq.get());
  std::vector<SpillPin> pins;
  int64_t restored = 0;
  st = Resident(seq.get(), request.sequence_id(), &pins, &restored);
  if (!st.ok()) return st;
  {
    absl::ReaderMutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
    }
  }
  response->set_pages_restored(static_cast<uint64_t>(restored));
  return absl::OkStatus();
}

}  // namespace driftkv
