// The CUDA backend's class (backends/cuda/cuda_backend.h makes it): its
// state and the files that define its parts, one job each:
//   cuda_backend.cc   set-up, attention, integrity sums, the host level's
//                     copies, client memory
//   cuda_hot_tier.cc  the hot tier on the device: promotion, demotion and
//                     reading level pages back
//   cuda_encode.cc    encoding on the device, device ingest, and the host
//                     mirror of encoded pages
// Internal to backends/cuda.
#ifndef DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_
#define DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "backends/backend.h"
#include "backends/cuda/attend_launcher.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/host_level_copy.h"
#include "backends/cuda/ipc_regions.h"
#include "backends/cuda/pending_level_sums.h"
#include "backends/page_pool.h"
#include "codec/dquant_codec.h"
#include "codec/level_page.h"
#include "codec/transform/transform.h"
#include "kernels/encode.h"
#include "kernels/level_promote.h"

namespace driftkv {
namespace cuda_backend {

class CudaBackend : public Backend {
 public:
  CudaBackend(const DQuantCodec* codec, const PagePool* pool, const PagePool* hot_pool, int device,
              const TransformSet* transforms, bool values_folded, size_t window_cache_bytes, PageId base, PageId end,
              PageId hot_base = 0, PageId hot_end = 0, size_t cold_scratch_bytes = 0)
      : codec_(*codec),
        pool_(*pool),
        hot_pool_(hot_pool),
        device_(device),
        transforms_(transforms),
        values_folded_(values_folded),
        window_cache_bytes_(window_cache_bytes),
        cold_scratch_bytes_(cold_scratch_bytes),
        base_(base),
        end_(end),
        hot_base_(hot_base),
        hot_end_(hot_end) {}
  // The device arena: pages [base_, end_) of the pool, page p at
  // (p - base_) * page_bytes.
  size_t arena_bytes() const { return static_cast<size_t>(end_ - base_) * pool_.page_stride(); }
  ~CudaBackend() override;
  absl::Status Init();
  bool SupportsHotTier() const override { return hot_pool_ != nullptr; }
  absl::Status PromotePages(absl::Span<const TierMove> moves) override;
  // One upload, the cold pages summed, the promotion, the hot pages summed,
  // one download and one synchronisation.
  absl::Status PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                   PageChecksum* cold_sums, PageChecksum* hot_sums) override;
  // The same, returning once the status and the cold sums are back: the
  // level pages are summed on sums_stream_ beside what stream_ does next
  // (the Attend that asked for the promotion), their words left in
  // pending_dev_ for *later (cuda_backend::PendingLevelSums), which the
  // next such promotion first settles.
  absl::Status PromotePagesCheckedLater(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                        PageChecksum* cold_sums, PageChecksum* hot_sums,
                                        std::shared_ptr<PendingChecksums>* later) override;
  // The encoding and the checked promotion of PromotePagesChecked queued
  // together: one upload of the tokens and one of the page ids, one
  // synchronisation; the records stay in the reserved cold pages on the
  // device (no copy to the host mirror).
  absl::Status EncodeLevelPages(absl::Span<EncodeJob> jobs, absl::Span<const PageId> hot_pages, const PagePool& cold,
                                const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums) override;
  // Demotion on the device: one upload of the page lists, the kernel
  // (kernels/level_demote.h, DemotePage's bytes), the cold pages copied to
  // the host mirror, one synchronisation. A page the kernel refuses
  // (corrupt levels or headers) is demoted again on the host for
  // DemotePage's own message.
  absl::Status DemotePages(absl::Span<const TierMove> moves) override;
  absl::Status UploadPages(absl::Span<const PageId> pages) override;
  // THE HOST LEVEL (backends/backend.h): one launch each way between the
  // device arena and the level's page-locked slots; restores write the
  // host mirror in the same launch (or on the host when it is not mapped).
  absl::Status PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                           absl::Span<uint8_t* const> dst) override;
  absl::Status PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src, absl::Span<const PageId> pages,
                             PageChecksum* sums) override;
  // INTEGRITY (backends/backend.h): each page as the device arena holds it
  // (the cold arena for the cold pool, the hot arena for the hot pool),
  // summed on the device (kernels/page_crc.h: wire/crc32c.h's checksum of
  // the same bytes); only the sums come back. The host pool is a mirror
  // (cold) or unused (hot): what the kernels read is the device's copy, so
  // that is what a check must see.
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override;
  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override;
  std::string name() const override { return "cuda"; }
  bool PrefersBatchedAttend() const override { return true; }
  bool AddressesClientMemory() const override { return true; }
  absl::Status ReadClientTensors(absl::Span<ClientRead> reads) override {
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);
    return launcher_.ReadClientTensors(reads);
  }
  // MEMORY REGIONS (backends/backend.h): backends/cuda/ipc_regions.h.
  absl::StatusOr<void*> OpenIpcRegion(const void* handle, size_t handle_bytes, int device, size_t size) override {
    return cuda_backend::OpenIpcMemory(handle, handle_bytes, device, size);
  }
  void CloseIpcRegion(void* dev_ptr) override { cuda_backend::CloseIpcMemory(dev_ptr); }
  absl::Status PinHostRegion(void* p, size_t bytes) override { return cuda_backend::PinHostMemory(p, bytes); }
  void UnpinHostRegion(void* p) override { cuda_backend::UnpinHostMemory(p); }
  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override;
  // DEVICE INGEST (backends/backend.h): staging buffers are device memory
  // of this GPU; values are checked and rounded to bf16 by
  // kernels/ingest.h and encoded from there.
  int staging_device() const override { return device_; }
  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override;
  absl::Status CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) override;
  absl::Status CheckStaged(const StagedTokens& t, int n, float limit) override;
  absl::Status EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                            absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                            absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                            std::vector<uint16_t>* tail_values) override;
  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override;
  absl::Status CacheWindows(absl::Span<const AttendJob> jobs) override {
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    return launcher_.CacheWindows(jobs);
  }
  void Attend(absl::Span<AttendJob> jobs) override;

 private:
  // The launcher's buffers and the promotion's page ids, sized at start
  // for the warm batch (cuda_backend::kWarmItems ...).
  absl::Status WarmBuffers();
  // The level page layout of the codec's shape and the rANS tables the
  // promotion reads, for the hot tier and the cold launches' scratch
  // (nothing when the shape has no level pages); then the hot tier's
  // arena (its moves: cuda_hot_tier.cc).
  absl::Status InitLevelPages();
  absl::Status InitHotTier();
  // A promotion from the cold arena into the hot one with the codec's
  // tables, its pages not yet named.
  gpu::PromoteParams PromoteBase() const;
  // The launch of a promotion whose device words `ids` hold the cold ids,
  // the hot ids, the tokens and room for the status, [count] each.
  gpu::PromoteParams PromoteParamsFor(int32_t* ids, int count) const;
  // A tier move's device words: [from][to][tokens], each page as its arena
  // indexes it (cold: less base_, hot: less hot_base_), after checking
  // that both are on this device. `to_hot`: a promotion (from is cold).
  absl::Status MoveIds(absl::Span<const TierMove> moves, bool to_hot, std::vector<int32_t>* ids) const;
  // DATA_LOSS naming the first move whose page did not decode.
  static absl::Status PromotionStatus(absl::Span<const TierMove> moves, const int32_t* status);
  // A checked promotion's words (EnqueueCheckedPromotionLocked) into the
  // caller's sums, and PromotionStatus.
  static absl::Status CheckedPromotionResult(absl::Span<const TierMove> moves, const std::vector<int32_t>& back,
                                             PageChecksum* cold_sums, PageChecksum* hot_sums);
  cuda_backend::DeviceArena Arena() const;
  // Internal unless cold page p is on this device's arena (PARTITIONS).
  absl::Status CheckOnArena(PageId p) const {
    if (p >= base_ && p < end_) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("page ", p, " is not on this device's arena"));
  }
  // The same for hot page p on this device's hot arena.
  absl::Status CheckOnHotArena(PageId p) const {
    if (p >= hot_base_ && p < hot_end_) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("hot page ", p, " is not on this device's hot arena"));
  }
  absl::Status CheckOnArena(absl::Span<const PageId> pages) const {
    for (PageId p : pages) {
      if (absl::Status st = CheckOnArena(p); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // The device's hot page into `dst` (host); the page's layer is locked by
  // the caller (Read or demotion), so the page does not change meanwhile.
  absl::Status DownloadHotPage(PageId page, uint8_t* dst) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status InitTransforms();
  absl::Status CheckLayer(int layer) const {
    if (transforms_ == nullptr || (layer >= 0 && layer < transforms_->layers)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " has no transform (the set has ", transforms_->layers, " layers)"));
  }
  // x [rows][kv_heads][head_dim] on the device <- matrix m of each row's layer.
  absl::Status TransformOnDevice(float* x_dev, int rows, const int32_t* layer_dev, int rows_per_layer, int m);
  // Mirrors encoded pages into the host arena, one copy per run of
  // consecutive ids (a fresh reservation is one run), on the calling
  // thread's own stream and without mu_: the copies of one call overlap the
  // next call's encoding. REQUIRES: their encoding has completed.
  absl::Status MirrorPages(absl::Span<const EncodeJob> jobs);
  // Queues on `stream` the copies of the device arena's `pages` to their
  // host mirror, one copy per run of consecutive ids.
  absl::Status EnqueueMirror(std::vector<PageId> pages, cudaStream_t stream);
  // The jobs' host keys and values into keys_in_ / values_in_, job after
  // job, on stream_.
  absl::Status UploadJobsLocked(absl::Span<const EncodeJob> jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues on stream_ the encoding of jobs[j] from tokens [j P, (j + 1) P)
  // of keys_dev/values_dev (device floats, model domain; transformed in
  // place with WUSH) into its page of the device arena.
  absl::Status EnqueueEncodeLocked(float* keys_dev, float* values_dev, absl::Span<const EncodeJob> jobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for stream_ and hands each job its statistics; InvalidArgument
  // naming the token whose values could not be encoded. The caller mirrors
  // the pages (MirrorPages) after releasing mu_, if it keeps them.
  absl::Status FinishEncodeLocked(absl::Span<EncodeJob> jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues on stream_ a checked promotion (PromotePagesChecked): the move
  // words `ids` (MoveIds) uploaded, the cold pages summed, promoted, the
  // level pages summed, and the status, cold sums and hot sums ([count]
  // each) downloaded into *back. Valid once stream_ is synchronised. With
  // `sums_later` the level pages are summed on sums_stream_ into
  // pending_dev_ instead (sums_done_ recorded after), and *back gets the
  // status and the cold sums only.
  absl::Status EnqueueCheckedPromotionLocked(const std::vector<int32_t>& ids, int count, std::vector<int32_t>* back,
                                             bool sums_later = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DQuantCodec& codec_;
  const PagePool& pool_;
  const PagePool* const hot_pool_;  // null: no hot tier
  const int device_;
  const TransformSet* const transforms_;  // null: the codec's Hadamard
  const bool values_folded_;
  const size_t window_cache_bytes_;
  const size_t cold_scratch_bytes_;
  const PageId base_, end_;                      // the pages of this device (PARTITIONS in page_pool.h)
  const PageId hot_base_, hot_end_;              // and its level pages of the hot pool
  std::vector<LayerTransform> host_transforms_;  // for DecodeTokens
  PageLayout layout_;
  // The level pages of this shape (the hot tier's and the cold scratch's);
  // page_bytes 0 when the kernels have none for it.
  LevelPageLayout hot_layout_;
  void* hot_arena_ = nullptr;
  Scratch raw_tables_;  // the promotion's rANS decode tables
  Scratch promote_ids_;
  Scratch crc_;  // ChecksumPages: page ids, then their sums
  gpu::EncodeParams encode_;
  cudaStream_t stream_ = nullptr;
  void* arena_ = nullptr;
  bool host_registered_ = false;            // the host arena is page-locked
  uint8_t* host_mirror_dev_ = nullptr;      // and mapped here (null: not mapped)
  cuda_backend::HostLevelCopy host_level_;  // under mu_
  absl::Mutex mu_;
  // PromotePagesCheckedLater's level sums: their stream, the event they
  // wait for (the promotion on stream_) and the one after them, the hot
  // ids then the sums ([count] words each), and the promotion whose sums
  // these are.
  cudaStream_t sums_stream_ = nullptr;
  cudaEvent_t sums_promoted_ = nullptr, sums_done_ = nullptr;
  Scratch pending_dev_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<cuda_backend::PendingLevelSums> pending_ ABSL_GUARDED_BY(mu_);
  Scratch transforms_dev_, tables_, keys_in_, values_in_, pages_, stats_;
  // CheckStaged runs on its own stream under its own lock.
  absl::Mutex check_mu_;
  cudaStream_t check_stream_ = nullptr;
  Scratch bad_ ABSL_GUARDED_BY(check_mu_);
  cuda_backend::AttendLauncher launcher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace cuda_backend
}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_CUDA_CUDA_BACKEND_IMPL_H_
