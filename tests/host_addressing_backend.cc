#include "tests/host_addressing_backend.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/registry.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace testing {

std::atomic<int> g_pins{0}, g_unpins{0}, g_queries_read_in_place{0}, g_outputs_written_in_place{0};

namespace {

// The CPU backend, reading queries at query_dev and writing outputs at
// out_dev/lse_dev in the wire dtypes, as the CUDA backend's gather and
// scatter do; pins are counted.
class HostAddressingBackend : public Backend {
 public:
  HostAddressingBackend(std::unique_ptr<Backend> inner, int head_dim) : inner_(std::move(inner)), d_(head_dim) {}
  std::string name() const override { return "host_addressing"; }
  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override { return inner_->EncodePages(jobs); }
  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeTokens(page, layer, first, count, keys, values);
  }
  bool SupportsHotTier() const override { return inner_->SupportsHotTier(); }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override { return inner_->PromotePages(moves); }
  absl::Status DemotePages(absl::Span<const TierMove> moves) override { return inner_->DemotePages(moves); }
  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeHotTokens(page, layer, first, count, keys, values);
  }
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override {
    return inner_->ChecksumPages(pool, pages, sums);
  }
  bool AddressesClientMemory() const override { return true; }
  absl::Status PinHostRegion(void*, size_t) override {
    ++g_pins;
    return absl::OkStatus();
  }
  void UnpinHostRegion(void*) override { ++g_unpins; }
  absl::Status ReadClientTensors(absl::Span<ClientRead> reads) override {
    for (ClientRead& r : reads) {
      r.bad = FirstOutOfRange(r.src_dev, r.dtype, r.elements, r.limit);
      if (r.host != nullptr) {
        TensorToFloat(absl::string_view(static_cast<const char*>(r.src_dev), r.elements * DTypeBytes(r.dtype)), r.dtype,
                      r.elements, r.host);
      }
    }
    return absl::OkStatus();
  }
  void Attend(absl::Span<AttendJob> jobs) override {
    std::vector<AttendJob> inner(jobs.begin(), jobs.end());
    std::vector<std::vector<float>> q(jobs.size()), out(jobs.size()), lse(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      AttendJob& j = inner[i];
      const size_t qe = static_cast<size_t>(j.q_heads) * d_;
      if (j.query_dev != nullptr) {
        ++g_queries_read_in_place;
        q[i].resize(qe);
        TensorToFloat(absl::string_view(static_cast<const char*>(j.query_dev), qe * DTypeBytes(j.query_dtype)),
                      j.query_dtype, qe, q[i].data());
        j.query = q[i].data();
        j.query_dev = nullptr;
      }
      if (j.out_dev != nullptr) {
        out[i].resize(qe);
        lse[i].resize(j.q_heads);
        j.out = out[i].data();
        j.lse = lse[i].data();
        j.out_dev = nullptr;
        j.lse_dev = nullptr;
      }
    }
    inner_->Attend(absl::MakeSpan(inner));
    for (size_t i = 0; i < jobs.size(); ++i) {
      AttendJob& j = jobs[i];
      j.status = inner[i].status;
      j.query_bad = inner[i].query_bad;
      if (j.out_dev == nullptr) continue;
      ++g_outputs_written_in_place;
      const size_t qe = static_cast<size_t>(j.q_heads) * d_;
      if (j.out_dtype == v1::DTYPE_BF16) {
        FloatsToBf16(out[i].data(), qe, static_cast<uint16_t*>(j.out_dev));
      } else {
        std::memcpy(j.out_dev, out[i].data(), qe * 4);
      }
      std::memcpy(j.lse_dev, lse[i].data(), lse[i].size() * 4);
    }
  }

 private:
  std::unique_ptr<Backend> inner_;
  const int d_;
};

}  // namespace

const bool kHostAddressingRegistered = RegisterBackend("host_addressing", [](const BackendArgs& args) {
  absl::StatusOr<std::unique_ptr<Backend>> cpu = MakeBackend("cpu", args);
  if (!cpu.ok()) return cpu;
  return absl::StatusOr<std::unique_ptr<Backend>>(
      std::make_unique<HostAddressingBackend>(*std::move(cpu), args.codec->head_dim()));
});

}  // namespace testing
}  // namespace driftkv
