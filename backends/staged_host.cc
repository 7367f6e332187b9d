// The host-memory defaults of Backend's DEVICE INGEST methods
// (backends/backend.h): staging is host memory, values are checked and
// rounded to bf16 on the host, pages go through EncodePages.
#include <cstring>
#include <vector>

#include "backends/backend.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

class HostStaging : public StagingBuffer {
 public:
  explicit HostStaging(size_t bytes) : data_(new uint8_t[bytes]), bytes_(bytes) {}
  void* data() override { return data_.get(); }
  size_t bytes() const override { return bytes_; }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t bytes_;
};

absl::string_view AsBytes(const void* p, size_t bytes) {
  return absl::string_view(static_cast<const char*>(p), bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StagingBuffer>> Backend::AllocateStaging(size_t bytes) {
  return std::unique_ptr<StagingBuffer>(new HostStaging(bytes));
}

absl::Status Backend::CheckStaged(const StagedTokens& t, int n, float limit) {
  const size_t elements = static_cast<size_t>(t.tokens) * n, bytes = elements * DTypeBytes(t.dtype);
  std::vector<float> x(elements);
  TensorToFloat(AsBytes(t.keys, bytes), t.dtype, elements, x.data());
  absl::Status st = CheckValues("keys", x.data(), elements, limit);
  if (!st.ok()) return st;
  TensorToFloat(AsBytes(t.values, bytes), t.dtype, elements, x.data());
  return CheckValues("values", x.data(), elements, limit);
}

absl::Status Backend::CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) {
  const size_t elements = static_cast<size_t>(count) * n, bytes = elements * DTypeBytes(t.dtype);
  TensorToFloat(AsBytes(t.keys, bytes), t.dtype, elements, keys);
  TensorToFloat(AsBytes(t.values, bytes), t.dtype, elements, values);
  return absl::OkStatus();
}

absl::Status Backend::EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                                   absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                                   absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                                   std::vector<uint16_t>* tail_values) {
  const size_t prefix = prefix_keys.size() / n, total = prefix + static_cast<size_t>(fresh);
  const size_t eb = DTypeBytes(t.dtype), off = static_cast<size_t>(skip) * n * eb;
  const size_t fresh_elements = static_cast<size_t>(fresh) * n;
  std::vector<float> k(total * n), v(total * n);
  TensorToFloat(AsBytes(static_cast<const uint8_t*>(t.keys) + off, fresh_elements * eb), t.dtype, fresh_elements,
                k.data() + prefix * n);
  TensorToFloat(AsBytes(static_cast<const uint8_t*>(t.values) + off, fresh_elements * eb), t.dtype, fresh_elements,
                v.data() + prefix * n);
  std::vector<uint16_t> bk(total * n), bv(total * n);
  if (prefix > 0) {  // an empty window's data() may be null, which memcpy may not take
    std::memcpy(bk.data(), prefix_keys.data(), prefix * n * 2);
    std::memcpy(bv.data(), prefix_values.data(), prefix * n * 2);
  }
  for (size_t i = prefix * n; i < total * n; ++i) {
    bk[i] = FloatToBf16(k[i]);
    bv[i] = FloatToBf16(v[i]);
  }
  const size_t encoded = jobs.size() * static_cast<size_t>(page_tokens) * n;
  if (encoded > total * n) return absl::InternalError("EncodeStaged: more pages than tokens");
  for (size_t i = 0; i < encoded; ++i) {
    k[i] = Bf16ToFloat(bk[i]);
    v[i] = Bf16ToFloat(bv[i]);
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    jobs[j].keys = k.data() + j * page_tokens * n;
    jobs[j].values = v.data() + j * page_tokens * n;
  }
  if (!jobs.empty()) {
    absl::Status st = EncodePages(jobs);
    if (!st.ok()) return st;
  }
  tail_keys->assign(bk.begin() + encoded, bk.end());
  tail_values->assign(bv.begin() + encoded, bv.end());
  return absl::OkStatus();
}

}  // namespace driftkv
