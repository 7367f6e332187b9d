// Batches concurrent Attend calls into one backend call: concurrent Attend
// RPCs that arrive together share one launch on a backend that prefers
// batches (Backend::PrefersBatchedAttend).
//
// A combining queue, no timer: a call that finds the backend idle runs at
// once, alone (no added latency when idle). Calls that arrive while a batch
// is running queue up; when it finishes, the thread that ran it takes every
// queued call as the next batch and runs their jobs as one Backend::Attend
// (one kernel launch on the CUDA backend), then wakes their callers. Under
// load, launches grow with the arrival rate instead of queueing one per RPC.
// The jobs' pointers are the callers' and stay valid: each caller waits for
// its own jobs.
#ifndef DRIFTKV_BACKENDS_ATTEND_BATCHER_H_
#define DRIFTKV_BACKENDS_ATTEND_BATCHER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "backends/backend.h"

namespace driftkv {

// Wraps `inner`; EncodePages, DecodeTokens, the hot tier, ChecksumPages,
// CacheWindows, DEVICE INGEST and MEMORY REGIONS pass through.
class BatchingBackend : public Backend {
 public:
  // Called once per inner Attend with the number of calls and jobs merged
  // (for metrics); may be empty.
  using BatchObserver = std::function<void(int calls, int jobs)>;

  BatchingBackend(std::unique_ptr<Backend> inner, BatchObserver observer)
      : inner_(std::move(inner)), observer_(std::move(observer)) {}

  std::string name() const override { return inner_->name(); }
  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override { return inner_->EncodePages(jobs); }
  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeTokens(page, layer, first, count, keys, values);
  }
  void Attend(absl::Span<AttendJob> jobs) override;
  bool PrefersBatchedAttend() const override { return true; }
  // The hot tier passes through (a merged batch may mix hot and cold jobs).
  absl::Status UploadPages(absl::Span<const PageId> pages) override { return inner_->UploadPages(pages); }
  absl::Status PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                           absl::Span<uint8_t* const> dst) override {
    return inner_->PagesToHost(pool, pages, dst);
  }
  absl::Status PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src, absl::Span<const PageId> pages,
                             PageChecksum* sums) override {
    return inner_->PagesFromHost(pool, src, pages, sums);
  }
  absl::Status CacheWindows(absl::Span<const AttendJob> jobs) override { return inner_->CacheWindows(jobs); }
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override {
    return inner_->ChecksumPages(pool, pages, sums);
  }
  bool SupportsHotTier() const override { return inner_->SupportsHotTier(); }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override { return inner_->PromotePages(moves); }
  absl::Status PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                   PageChecksum* cold_sums, PageChecksum* hot_sums) override {
    return inner_->PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
  }
  absl::Status PromotePagesCheckedLater(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                        PageChecksum* cold_sums, PageChecksum* hot_sums,
                                        std::shared_ptr<PendingChecksums>* later) override {
    return inner_->PromotePagesCheckedLater(moves, cold, hot, cold_sums, hot_sums, later);
  }
  absl::Status DemotePages(absl::Span<const TierMove> moves) override { return inner_->DemotePages(moves); }
  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_->DecodeHotTokens(page, layer, first, count, keys, values);
  }
  bool AddressesClientMemory() const override { return inner_->AddressesClientMemory(); }
  absl::Status ReadClientTensors(absl::Span<ClientRead> reads) override { return inner_->ReadClientTensors(reads); }
  int staging_device() const override { return inner_->staging_device(); }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override {
    return inner_->AllocateStaging(bytes);
  }
  absl::Status CheckStaged(const StagedTokens& t, int n, float limit) override {
    return inner_->CheckStaged(t, n, limit);
  }
  absl::Status CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) override {
    return inner_->CopyStagedToHost(t, n, count, keys, values);
  }
  absl::Status EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                            absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                            absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                            std::vector<uint16_t>* tail_values) override {
    return inner_->EncodeStaged(t, n, page_tokens, skip, fresh, prefix_keys, prefix_values, jobs, tail_keys,
                                tail_values);
  }
  // MEMORY REGIONS pass through.
  absl::StatusOr<void*> OpenIpcRegion(const void* handle, size_t handle_bytes, int device, size_t size) override {
    return inner_->OpenIpcRegion(handle, handle_bytes, device, size);
  }
  void CloseIpcRegion(void* dev_ptr) override { inner_->CloseIpcRegion(dev_ptr); }
  absl::Status PinHostRegion(void* p, size_t bytes) override { return inner_->PinHostRegion(p, bytes); }
  void UnpinHostRegion(void* p) override { inner_->UnpinHostRegion(p); }

  // Calls waiting for the running batch to finish (for tests).
  int queued() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(queue_.size());
  }

 private:
  struct Call {
    absl::Span<AttendJob> jobs;
    bool done = false;
  };

  // Runs `batch` as one inner call and marks its calls done. mu_ not held.
  void RunBatch(const std::deque<Call*>& batch);

  std::unique_ptr<Backend> inner_;
  BatchObserver observer_;
  absl::Mutex mu_;
  std::deque<Call*> queue_ ABSL_GUARDED_BY(mu_);
  bool running_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_ATTEND_BATCHER_H_
