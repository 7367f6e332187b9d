#include "backends/multi_device.h"

#include <future>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/attend_batcher.h"

namespace driftkv {
namespace {

class MultiDeviceBackend : public Backend {
 public:
  MultiDeviceBackend(std::vector<std::unique_ptr<Backend>> inner, const PagePool* pool, const PagePool* hot_pool,
                     bool batched)
      : inner_(std::move(inner)), pool_(*pool), hot_pool_(hot_pool), batched_(batched) {}

  std::string name() const override { return inner_[0]->name(); }
  bool PrefersBatchedAttend() const override { return !batched_ && inner_[0]->PrefersBatchedAttend(); }

  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override {
    // Runs of jobs of one device (an Append's jobs are all one sequence's).
    size_t begin = 0;
    while (begin < jobs.size()) {
      const int k = Owner(jobs[begin].page);
      size_t end = begin + 1;
      while (end < jobs.size() && Owner(jobs[end].page) == k) ++end;
      absl::Status st = inner_[k]->EncodePages(jobs.subspan(begin, end - begin));
      if (!st.ok()) return st;
      begin = end;
    }
    return absl::OkStatus();
  }

  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_[Owner(page)]->DecodeTokens(page, layer, first, count, keys, values);
  }

  // THE HOT TIER: each move on the device of its cold page, in one call
  // per device (a batch's moves may alternate between devices).
  bool SupportsHotTier() const override { return hot_pool_ != nullptr && inner_[0]->SupportsHotTier(); }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override {
    return ByMoveDevice(moves, /*cold_is_from=*/true, [&](int k, absl::Span<const TierMove> mine, const auto&) {
      return inner_[k]->PromotePages(mine);
    });
  }
  absl::Status PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                   PageChecksum* cold_sums, PageChecksum* hot_sums) override {
    return ByMoveDevice(moves, /*cold_is_from=*/true,
                        [&](int k, absl::Span<const TierMove> mine, const std::vector<size_t>& at) {
                          std::vector<PageChecksum> c(mine.size()), h(mine.size());
                          absl::Status st = inner_[k]->PromotePagesChecked(mine, cold, hot, c.data(), h.data());
                          // The sums of a move that failed to decode still say what was read.
                          for (size_t i = 0; i < at.size(); ++i) {
                            cold_sums[at[i]] = c[i];
                            hot_sums[at[i]] = h[i];
                          }
                          return st;
                        });
  }
  // Each job on the device of its cold page, whose partition of the hot
  // pool its hot page comes from.
  absl::Status EncodeLevelPages(absl::Span<EncodeJob> jobs, absl::Span<const PageId> hot_pages, const PagePool& cold,
                                const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums) override {
    size_t begin = 0;
    while (begin < jobs.size()) {
      const int k = Owner(jobs[begin].page);
      size_t end = begin + 1;
      while (end < jobs.size() && Owner(jobs[end].page) == k) ++end;
      absl::Status st =
          inner_[k]->EncodeLevelPages(jobs.subspan(begin, end - begin), hot_pages.subspan(begin, end - begin), cold,
                                      hot, cold_sums + begin, hot_sums + begin);
      if (!st.ok()) return st;
      begin = end;
    }
    return absl::OkStatus();
  }
  absl::Status DemotePages(absl::Span<const TierMove> moves) override {
    return ByMoveDevice(moves, /*cold_is_from=*/false, [&](int k, absl::Span<const TierMove> mine, const auto&) {
      return inner_[k]->DemotePages(mine);
    });
  }
  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    return inner_[HotOwner(page)]->DecodeHotTokens(page, layer, first, count, keys, values);
  }

  // Restored pages (a snapshot's) to the device that holds each.
  absl::Status UploadPages(absl::Span<const PageId> pages) override {
    return ByOwner(pages,
                   [&](int k, size_t begin, size_t n) { return inner_[k]->UploadPages(pages.subspan(begin, n)); });
  }

  // The host level's copies, each run of pages by the device that holds it.
  absl::Status PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                           absl::Span<uint8_t* const> dst) override {
    return ByOwner(pages, [&](int k, size_t begin, size_t n) {
      return inner_[k]->PagesToHost(pool, pages.subspan(begin, n), dst.subspan(begin, n));
    });
  }
  absl::Status PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src, absl::Span<const PageId> pages,
                             PageChecksum* sums) override {
    return ByOwner(pages, [&](int k, size_t begin, size_t n) {
      return inner_[k]->PagesFromHost(pool, src.subspan(begin, n), pages.subspan(begin, n), sums + begin);
    });
  }

  // Each page from the device that holds it (the cold pool's or the hot
  // pool's partition; another pool's pages from device 0).
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override {
    auto owner = [&](PageId p) { return &pool == &pool_ ? Owner(p) : (&pool == hot_pool_ ? HotOwner(p) : 0); };
    size_t begin = 0;
    while (begin < pages.size()) {
      const int k = owner(pages[begin]);
      size_t end = begin + 1;
      while (end < pages.size() && owner(pages[end]) == k) ++end;
      absl::Status st = inner_[k]->ChecksumPages(pool, pages.subspan(begin, end - begin), sums + begin);
      if (!st.ok()) return st;
      begin = end;
    }
    return absl::OkStatus();
  }

  // Each window to the device its job's Attend runs on.
  absl::Status CacheWindows(absl::Span<const AttendJob> jobs) override {
    std::vector<std::vector<AttendJob>> split(inner_.size());
    for (const AttendJob& j : jobs) split[DeviceOf(j)].push_back(j);
    for (size_t k = 0; k < split.size(); ++k) {
      if (split[k].empty()) continue;
      absl::Status st = inner_[k]->CacheWindows(split[k]);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  void Attend(absl::Span<AttendJob> jobs) override {
    const int n = static_cast<int>(inner_.size());
    std::vector<std::vector<AttendJob>> split(n);
    std::vector<std::vector<size_t>> index(n);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const int k = DeviceOf(jobs[i]);
      split[k].push_back(jobs[i]);
      index[k].push_back(i);
    }
    // Every device but the last busy one on its own thread; that one here.
    std::vector<std::future<void>> running;
    int last = -1;
    for (int k = 0; k < n; ++k) {
      if (!split[k].empty()) last = k;
    }
    for (int k = 0; k < n; ++k) {
      if (split[k].empty() || k == last) continue;
      running.push_back(
          std::async(std::launch::async, [this, k, &split] { inner_[k]->Attend(absl::MakeSpan(split[k])); }));
    }
    if (last >= 0) inner_[last]->Attend(absl::MakeSpan(split[last]));
    for (std::future<void>& f : running) f.get();
    for (int k = 0; k < n; ++k) {
      for (size_t j = 0; j < split[k].size(); ++j) {
        CopyAttendOutcome(split[k][j], &jobs[index[k][j]]);
      }
    }
  }

  int staging_device() const override { return inner_[0]->staging_device(); }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override {
    return inner_[0]->AllocateStaging(bytes);
  }
  absl::Status CheckStaged(const StagedTokens& t, int n, float limit) override {
    return inner_[0]->CheckStaged(t, n, limit);
  }
  absl::Status CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) override {
    return inner_[0]->CopyStagedToHost(t, n, count, keys, values);
  }
  absl::Status EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                            absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                            absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                            std::vector<uint16_t>* tail_values) override {
    const int k = jobs.empty() ? 0 : Owner(jobs[0].page);
    for (const EncodeJob& j : jobs) {
      if (Owner(j.page) != k) return absl::InternalError("EncodeStaged: pages of several devices");
    }
    return inner_[k]->EncodeStaged(t, n, page_tokens, skip, fresh, prefix_keys, prefix_values, jobs, tail_keys,
                                   tail_values);
  }
  // MEMORY REGIONS: IPC memory is opened by the process (any inner backend
  // opens it on any device) and host memory is pinned for every device
  // (cudaHostRegisterPortable): inner backend 0 serves both.
  absl::StatusOr<void*> OpenIpcRegion(const void* handle, size_t handle_bytes, int device, size_t size) override {
    return inner_[0]->OpenIpcRegion(handle, handle_bytes, device, size);
  }
  void CloseIpcRegion(void* dev_ptr) override { inner_[0]->CloseIpcRegion(dev_ptr); }
  absl::Status PinHostRegion(void* p, size_t bytes) override { return inner_[0]->PinHostRegion(p, bytes); }
  void UnpinHostRegion(void* p) override { inner_[0]->UnpinHostRegion(p); }

 private:
  int Owner(PageId p) const { return pool_.partition_of(p); }
  int HotOwner(PageId p) const { return hot_pool_->partition_of(p); }
  // Calls run(device, its moves, their indices in `moves`) once for each
  // device that has moves; a move's device is its cold page's owner.
  template <typename Run>
  absl::Status ByMoveDevice(absl::Span<const TierMove> moves, bool cold_is_from, Run run) const {
    if (moves.empty()) return absl::OkStatus();
    const int n = static_cast<int>(inner_.size());
    std::vector<std::vector<TierMove>> split(n);
    std::vector<std::vector<size_t>> index(n);
    for (size_t i = 0; i < moves.size(); ++i) {
      const int k = Owner(cold_is_from ? moves[i].from : moves[i].to);
      split[k].push_back(moves[i]);
      index[k].push_back(i);
    }
    for (int k = 0; k < n; ++k) {
      if (split[k].empty()) continue;
      if (absl::Status st = run(k, absl::MakeConstSpan(split[k]), index[k]); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // Calls run(device, begin, count) for each run of pages one device holds.
  template <typename Run>
  absl::Status ByOwner(absl::Span<const PageId> pages, Run run) const {
    size_t begin = 0;
    while (begin < pages.size()) {
      const int k = Owner(pages[begin]);
      size_t end = begin + 1;
      while (end < pages.size() && Owner(pages[end]) == k) ++end;
      if (absl::Status st = run(k, begin, end - begin); !st.ok()) return st;
      begin = end;
    }
    return absl::OkStatus();
  }
  // The device an Attend job runs on: its pages' (a job without pages, a
  // window alone, the first device's).
  int DeviceOf(const AttendJob& j) const {
    if (j.pages.empty()) return 0;
    return j.hot ? HotOwner(j.pages[0]) : Owner(j.pages[0]);
  }

  std::vector<std::unique_ptr<Backend>> inner_;
  const PagePool& pool_;
  const PagePool* const hot_pool_;  // null: no hot tier
  const bool batched_;              // each inner backend has its own Attend queue
};

}  // namespace

std::unique_ptr<Backend> MakeMultiDeviceBackend(std::vector<std::unique_ptr<Backend>> inner, const PagePool* pool,
                                                const PagePool* hot_pool, bool batch_per_device,
                                                std::function<void(int calls, int jobs)> observer) {
  bool batched = false;
  if (batch_per_device) {
    for (std::unique_ptr<Backend>& b : inner) {
      if (!b->PrefersBatchedAttend()) continue;
      b = std::make_unique<BatchingBackend>(std::move(b), observer);
      batched = true;
    }
  }
  return std::make_unique<MultiDeviceBackend>(std::move(inner), pool, hot_pool, batched);
}

}  // namespace driftkv
