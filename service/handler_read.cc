// Handler::Read: streams decoded pages and the bf16 window.
#include "service/handler.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "service/handler_internal.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {

using handler_internal::Quoted;

absl::Status Handler::Read(const v1::ReadRequest& request, const std::function<bool(const v1::ReadChunk&)>& sink,
                           const std::string& tenant) {
  absl::Status st = CheckSequenceId("sequence_id", request.sequence_id());
  if (st.ok()) st = CheckLayer("layer", request.layer());
  const int dtype = request.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32 : request.dtype();
  if (st.ok() && DTypeBytes(dtype) == 0) {
    st = absl::InvalidArgumentError(absl::StrCat("dtype ", request.dtype(), " is not one of BF16, FP16, F32"));
  }
  if (!st.ok()) return st;
  SequencePtr seq = table_->Find(TenantKey(tenant, request.sequence_id()));
  if (seq == nullptr) {
    return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found"));
  }
  // Its pages stay in the pool until the last chunk is read.
  std::vector<SpillPin> pins;
  st = Resident(seq.get(), request.sequence_id(), &pins);
  if (!st.ok()) return st;
  const size_t n = this->n();
  const int64_t p = pool_->page_tokens();
  uint64_t end = 0;
  {
    absl::ReaderMutexLock lock(&seq->mu);
    if (seq->released) {
      return absl::NotFoundError(absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " not found (released)"));
    }
    LayerState& layer = seq->layers[request.layer()];
    absl::ReaderMutexLock layer_lock(&layer.mu);
    const uint64_t length = layer.length;
    if (request.first_token() > length) {
      return absl::OutOfRangeError(absl::StrCat("first_token ", request.first_token(), " is past the end of layer ",
                                                request.layer(), " (", length, " tokens)"));
    }
    end = request.token_count() == 0 ? length : request.first_token() + request.token_count();
    if (request.token_count() > length || end > length) {
      return absl::OutOfRangeError(absl::StrCat("first_token ", request.first_token(), " + token_count ",
                                                request.token_count(), " exceeds the length of layer ", request.layer(),
                                                " (", length, " tokens)"));
    }
  }
  std::vector<float> keys, values;
  for (uint64_t pos = request.first_token(); pos < end;) {
    const int64_t count = std::min<uint64_t>(end - pos, options_.read_chunk_tokens);
    keys.resize(count * n);
    values.resize(count * n);
    int64_t compressed = 0;
    {
      absl::ReaderMutexLock lock(&seq->mu);
      if (seq->released) {
        return absl::AbortedError(
            absl::StrCat("sequence_id ", Quoted(request.sequence_id()), " was released during Read"));
      }
      LayerState& layer = seq->layers[request.layer()];
      absl::ReaderMutexLock layer_lock(&layer.mu);
      const int64_t paged = static_cast<int64_t>(layer.pages.size()) * p;
      const LayerName name{request.sequence_id(), static_cast<int>(request.layer())};
      std::vector<PageChecksum> joined;
      absl::StatusOr<absl::Span<const PageChecksum>> hot_sums =
          layer.hot ? layer.hot_sums.View(&joined) : absl::Span<const PageChecksum>();
      if (!hot_sums.ok()) return hot_sums.status();
      for (int64_t t = 0; t < count;) {
        const int64_t tok = static_cast<int64_t>(pos) + t;
        if (tok < paged) {
          const int64_t in_page = tok % p;
          const int64_t run = std::min(count - t, p - in_page);
          // Each page in the form it is decoded from: a cold page's host
          // bytes (what DecodeTokens decodes), a hot page's level form as
          // the backend holds it (service/page_verifier.h, WHICH COPY).
          const size_t i = static_cast<size_t>(tok / p);
          st = layer.hot ? verifier_->VerifyHotPages(absl::MakeConstSpan(&layer.pages[i], 1), hot_sums->subspan(i, 1),
                                                     i, name, kCheckRead)
                         : verifier_->VerifyColdPages(absl::MakeConstSpan(&layer.pages[i], 1),
                                                      absl::MakeConstSpan(&layer.page_sums[i], 1), i,
                                                      PageVerifier::Copy::kHost, name, kCheckRead);
          if (!st.ok()) return st;
          // The tier can change between chunks; each chunk reads it under the lock.
          st = layer.hot ? backend_->DecodeHotTokens(layer.pages[tok / p], static_cast<int>(request.layer()),
                                                     static_cast<int>(in_page), static_cast<int>(run),
                                                     keys.data() + t * n, values.data() + t * n)
                         : backend_->DecodeTokens(layer.pages[tok / p], static_cast<int>(request.layer()),
                                                  static_cast<int>(in_page), static_cast<int>(run), keys.data() + t * n,
                                                  values.data() + t * n);
          if (!st.ok()) return st;
          compressed += run;
          t += run;
        } else {
          st = verifier_->VerifyWindow(layer, tok - paged, tok - paged + 1, name, "served");
          if (!st.ok()) return st;
          const size_t w = static_cast<size_t>(tok - paged) * n;
          for (size_t j = 0; j < n; ++j) {
            keys[t * n + j] = Bf16ToFloat(layer.window_keys[w + j]);
            values[t * n + j] = Bf16ToFloat(layer.window_values[w + j]);
          }
          ++t;
        }
      }
    }
    table_->Touch(seq.get());
    v1::ReadChunk chunk;
    chunk.set_first_token(pos);
    chunk.set_token_count(static_cast<uint32_t>(count));
    chunk.set_dtype(static_cast<v1::DType>(dtype));
    chunk.set_compressed_tokens(static_cast<uint32_t>(compressed));
    FloatToTensor(keys.data(), keys.size(), dtype, chunk.mutable_keys());
    FloatToTensor(values.data(), values.size(), dtype, chunk.mutable_values());
    if (!sink(chunk)) return absl::CancelledError("the client stopped reading");
    pos += count;
  }
  return absl::OkStatus();
}

}  // namespace driftkv
