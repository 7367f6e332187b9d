// The hot tier on the device (HOT TIER in backends/backend.h): a second
// arena of level pages with the host hot pool's ids. Pages are promoted
// and demoted on the device (kernels/level_promote.h, level_demote.h) and
// never copied back eagerly: Read and a demotion the device refuses
// download the page first (a page is 96 KB; an 8K-token sequence's 2048
// pages would take far longer to copy than to promote). The host hot
// pool's arena stays unused on this backend.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/host_decode.h"
#include "kernels/codec_bridge.h"
#include "kernels/level_demote.h"
#include "kernels/page_crc.h"

namespace driftkv {
namespace cuda_backend {

absl::Status CudaBackend::InitLevelPages() {
  absl::StatusOr<LevelPageLayout> hl = MakeLevelPageLayout(codec_);
  // Without level pages for this shape a hot tier cannot be; the cold
  // launches do without their scratch (hot_layout_.page_bytes stays 0).
  if (!hl.ok()) return hot_pool_ != nullptr ? hl.status() : absl::OkStatus();
  const std::vector<uint32_t> raw = gpu::PromoteDecodeTables(codec_);
  absl::Status st = raw_tables_.Reserve(raw.size() * 4);
  if (st.ok())
    st = Cuda(cudaMemcpy(raw_tables_.get<void>(), raw.data(), raw.size() * 4, cudaMemcpyHostToDevice),
              "upload rANS tables");
  if (st.ok()) hot_layout_ = *hl;
  return st;
}

absl::Status CudaBackend::InitHotTier() {
  if (hot_pool_->page_stride() != hot_layout_.page_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("hot pool stride ", hot_pool_->page_stride(),
                                                      " is not the level page size ", hot_layout_.page_bytes));
  }
  // This device's partition of the hot pool only (all of it on one device).
  const size_t bytes = static_cast<size_t>(hot_end_ - hot_base_) * hot_layout_.page_bytes;
  return Cuda(cudaMalloc(&hot_arena_, bytes), "cudaMalloc (hot arena)");
}

absl::Status CudaBackend::MoveIds(absl::Span<const TierMove> moves, bool to_hot, std::vector<int32_t>* ids) const {
  const size_t count = moves.size();
  ids->resize(3 * count);
  for (size_t i = 0; i < count; ++i) {
    const PageId cold = to_hot ? moves[i].from : moves[i].to, hot = to_hot ? moves[i].to : moves[i].from;
    if (absl::Status st = CheckOnArena(cold); !st.ok()) return st;
    if (absl::Status st = CheckOnHotArena(hot); !st.ok()) return st;
    (*ids)[to_hot ? i : count + i] = cold - base_;
    (*ids)[to_hot ? count + i : i] = hot - hot_base_;
    (*ids)[2 * count + i] = moves[i].tokens;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::PromotePages(absl::Span<const TierMove> moves) {
  if (hot_pool_ == nullptr) return Backend::PromotePages(moves);
  if (moves.empty()) return absl::OkStatus();
  const int count = static_cast<int>(moves.size());
  std::vector<int32_t> ids;  // cold ids, hot ids, tokens
  if (absl::Status st = MoveIds(moves, /*to_hot=*/true, &ids); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  absl::Status st = promote_ids_.Reserve(4 * ids.size() + 4 * count);
  if (st.ok())
    st = Cuda(cudaMemcpyAsync(promote_ids_.get<void>(), ids.data(), 4 * ids.size(), cudaMemcpyHostToDevice, stream_),
              "upload page ids");
  if (!st.ok()) return st;
  const gpu::PromoteParams pp = PromoteParamsFor(promote_ids_.get<int32_t>(), count);
  st = gpu::LaunchPromote(pp, stream_);
  std::vector<int32_t> status(count);
  if (st.ok())
    st = Cuda(cudaMemcpyAsync(status.data(), pp.status_dev, 4 * count, cudaMemcpyDeviceToHost, stream_),
              "download promotion status");
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "promote");
  if (!st.ok()) return st;
  return PromotionStatus(moves, status.data());
}

absl::Status CudaBackend::PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold,
                                              const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums) {
  if (hot_pool_ == nullptr || &cold != &pool_ || &hot != hot_pool_) {
    return Backend::PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
  }
  if (moves.empty()) return absl::OkStatus();
  const int count = static_cast<int>(moves.size());
  std::vector<int32_t> ids;  // cold ids, hot ids, tokens
  if (absl::Status st = MoveIds(moves, /*to_hot=*/true, &ids); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  std::vector<int32_t> back;
  absl::Status st = EnqueueCheckedPromotionLocked(ids, count, &back);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "promote");
  if (!st.ok()) return st;
  return CheckedPromotionResult(moves, back, cold_sums, hot_sums);
}

absl::Status CudaBackend::PromotePagesCheckedLater(absl::Span<const TierMove> moves, const PagePool& cold,
                                                   const PagePool& hot, PageChecksum* cold_sums, PageChecksum* hot_sums,
                                                   std::shared_ptr<PendingChecksums>* later) {
  later->reset();
  if (hot_pool_ == nullptr || &cold != &pool_ || &hot != hot_pool_ || sums_stream_ == nullptr) {
    return PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
  }
  if (moves.empty()) return absl::OkStatus();
  const int count = static_cast<int>(moves.size());
  std::vector<int32_t> ids;  // cold ids, hot ids, tokens
  if (absl::Status st = MoveIds(moves, /*to_hot=*/true, &ids); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  // The previous promotion's sums leave pending_dev_ for their owner
  // first, and this one's words go there only after any earlier sums'
  // kernel (one whose promotion failed has no owner to settle it).
  if (pending_ != nullptr) {
    pending_->Settle();
    pending_.reset();
  }
  absl::Status st = Cuda(cudaStreamWaitEvent(stream_, sums_done_, 0), "wait for earlier level sums");
  std::vector<int32_t> back;
  if (st.ok()) st = EnqueueCheckedPromotionLocked(ids, count, &back, /*sums_later=*/true);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "promote");
  if (!st.ok()) return st;
  std::memcpy(cold_sums, back.data() + count, 4 * static_cast<size_t>(count));
  st = PromotionStatus(moves, back.data());
  if (!st.ok()) return st;
  pending_ = std::make_shared<PendingLevelSums>(device_, sums_done_, pending_dev_.get<uint32_t>() + count, count);
  *later = pending_;
  return absl::OkStatus();
}

absl::Status CudaBackend::EncodeLevelPages(absl::Span<EncodeJob> jobs, absl::Span<const PageId> hot_pages,
                                           const PagePool& cold, const PagePool& hot, PageChecksum* cold_sums,
                                           PageChecksum* hot_sums) {
  if (hot_pool_ == nullptr || &cold != &pool_ || &hot != hot_pool_) {
    return Backend::EncodeLevelPages(jobs, hot_pages, cold, hot, cold_sums, hot_sums);
  }
  if (jobs.empty()) return absl::OkStatus();
  for (const EncodeJob& j : jobs) {
    if (absl::Status st = CheckLayer(j.layer); !st.ok()) return st;
  }
  const int count = static_cast<int>(jobs.size());
  std::vector<TierMove> moves(count);
  for (int i = 0; i < count; ++i) moves[i] = TierMove{jobs[i].page, hot_pages[i], pool_.page_tokens()};
  std::vector<int32_t> ids;  // cold ids, hot ids, tokens
  if (absl::Status st = MoveIds(moves, /*to_hot=*/true, &ids); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  std::vector<int32_t> back;
  absl::Status st = UploadJobsLocked(jobs);
  if (st.ok()) st = EnqueueEncodeLocked(keys_in_.get<float>(), values_in_.get<float>(), jobs);
  if (st.ok()) st = EnqueueCheckedPromotionLocked(ids, count, &back);
  // Waits for the stream: the encoding's failures first (a page that was
  // not encoded has no meaningful level form).
  if (st.ok()) st = FinishEncodeLocked(jobs);
  if (!st.ok()) return st;
  return CheckedPromotionResult(moves, back, cold_sums, hot_sums);
}

absl::Status CudaBackend::EnqueueCheckedPromotionLocked(const std::vector<int32_t>& ids, int count,
                                                        std::vector<int32_t>* back, bool sums_later) {
  // Device words: the ids, then what comes back: status, cold sums, hot sums.
  absl::Status st = promote_ids_.Reserve(4 * 6 * static_cast<size_t>(count));
  int32_t* dev = promote_ids_.get<int32_t>();
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(dev, ids.data(), 4 * ids.size(), cudaMemcpyHostToDevice, stream_), "upload page ids");
  }
  gpu::PageCrcParams c;
  c.arena_dev = static_cast<const uint8_t*>(arena_);
  c.page_bytes = layout_.page_bytes;
  c.pages_dev = dev;
  c.pages = count;
  c.sums_dev = reinterpret_cast<uint32_t*>(dev + 4 * count);
  // All three in turn on one stream: the cold sums on a second stream
  // beside the promotion took longer (2,048 pages on the H200: 0.893
  // against 0.848 ms, bench_gpu's "Checksums" line), as both kernels
  // fill every SM.
  if (st.ok()) st = gpu::LaunchPageCrc(c, stream_);
  if (st.ok()) st = gpu::LaunchPromote(PromoteParamsFor(dev, count), stream_);
  gpu::PageCrcParams h;
  h.arena_dev = static_cast<const uint8_t*>(hot_arena_);
  h.page_bytes = hot_layout_.page_bytes;
  h.pages_dev = dev + count;
  h.pages = count;
  h.sums_dev = reinterpret_cast<uint32_t*>(dev + 5 * count);
  if (sums_later) {
    // The hot ids copied out of promote_ids_ on stream_ (the next
    // promotion's upload overwrites it there), then the sums on
    // sums_stream_ once the promotion is done.
    if (st.ok()) st = pending_dev_.Reserve(4 * 2 * static_cast<size_t>(count));
    int32_t* own = pending_dev_.get<int32_t>();
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(own, dev + count, 4 * static_cast<size_t>(count), cudaMemcpyDeviceToDevice, stream_),
                "copy hot page ids");
    }
    if (st.ok()) st = Cuda(cudaEventRecord(sums_promoted_, stream_), "record promotion");
    if (st.ok()) st = Cuda(cudaStreamWaitEvent(sums_stream_, sums_promoted_, 0), "wait for promotion");
    h.pages_dev = own;
    h.sums_dev = reinterpret_cast<uint32_t*>(own + count);
    if (st.ok()) st = gpu::LaunchPageCrc(h, sums_stream_);
    if (st.ok()) st = Cuda(cudaEventRecord(sums_done_, sums_stream_), "record level sums");
  } else if (st.ok()) {
    st = gpu::LaunchPageCrc(h, stream_);
  }
  back->resize((sums_later ? 2 : 3) * static_cast<size_t>(count));
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(back->data(), dev + 3 * count, 4 * back->size(), cudaMemcpyDeviceToHost, stream_),
              "download promotion status and checksums");
  }
  return st;
}

absl::Status CudaBackend::CheckedPromotionResult(absl::Span<const TierMove> moves, const std::vector<int32_t>& back,
                                                 PageChecksum* cold_sums, PageChecksum* hot_sums) {
  const size_t count = moves.size();
  static_assert(sizeof(PageChecksum) == sizeof(int32_t), "the kernel's sums are CRC-32C words");
  std::memcpy(cold_sums, back.data() + count, 4 * count);
  std::memcpy(hot_sums, back.data() + 2 * count, 4 * count);
  return PromotionStatus(moves, back.data());
}

gpu::PromoteParams CudaBackend::PromoteBase() const {
  gpu::PromoteParams pp;
  pp.cold_pool_dev = static_cast<const uint8_t*>(arena_);
  pp.cold = layout_;
  pp.hot_pool_dev = static_cast<uint8_t*>(hot_arena_);
  pp.hot = hot_layout_;
  gpu::SetPromoteCodec(codec_, raw_tables_.get<uint32_t>(), &pp);
  return pp;
}

gpu::PromoteParams CudaBackend::PromoteParamsFor(int32_t* ids, int count) const {
  gpu::PromoteParams pp = PromoteBase();
  pp.pages = count;
  pp.cold_pages_dev = ids;
  pp.hot_pages_dev = ids + count;
  pp.tokens_dev = ids + 2 * count;
  pp.status_dev = ids + 3 * count;
  return pp;
}

absl::Status CudaBackend::PromotionStatus(absl::Span<const TierMove> moves, const int32_t* status) {
  for (size_t i = 0; i < moves.size(); ++i) {
    if (status[i] != 0) {
      return absl::DataLossError(
          absl::StrCat("page ", moves[i].from, " token ", status[i] - 1, ": record does not decode (promotion)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::DemotePages(absl::Span<const TierMove> moves) {
  if (hot_pool_ == nullptr) return Backend::DemotePages(moves);
  if (moves.empty()) return absl::OkStatus();
  const int count = static_cast<int>(moves.size());
  std::vector<int32_t> ids;  // hot ids, cold ids, tokens
  if (absl::Status st = MoveIds(moves, /*to_hot=*/false, &ids); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  absl::Status st = promote_ids_.Reserve(4 * 4 * static_cast<size_t>(count));
  int32_t* dev = promote_ids_.get<int32_t>();
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(dev, ids.data(), 4 * ids.size(), cudaMemcpyHostToDevice, stream_), "upload page ids");
  }
  gpu::DemoteParams dp;
  dp.hot_pool_dev = static_cast<const uint8_t*>(hot_arena_);
  dp.hot = hot_layout_;
  dp.cold_pool_dev = static_cast<uint8_t*>(arena_);
  dp.cold = layout_;
  gpu::SetDemoteTables(codec_, &dp);
  dp.pages = count;
  dp.hot_pages_dev = dev;
  dp.cold_pages_dev = dev + count;
  dp.tokens_dev = dev + 2 * count;
  dp.status_dev = dev + 3 * count;
  if (st.ok()) st = gpu::LaunchDemote(dp, stream_);
  if (st.ok()) {
    // A demotion's cold pages are one fresh reservation: mostly one run.
    std::vector<PageId> cold(count);
    for (int i = 0; i < count; ++i) cold[i] = moves[i].to;
    st = EnqueueMirror(std::move(cold), stream_);
  }
  std::vector<int32_t> status(count);
  if (st.ok()) {
    st = Cuda(
        cudaMemcpyAsync(status.data(), dp.status_dev, 4 * static_cast<size_t>(count), cudaMemcpyDeviceToHost, stream_),
        "download demotion status");
  }
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "demote");
  if (!st.ok()) return st;
  for (int i = 0; i < count; ++i) {
    if (status[i] == 0) continue;
    std::vector<uint8_t> level(hot_layout_.page_bytes), cold(layout_.page_bytes);
    st = DownloadHotPage(moves[i].from, level.data());
    if (!st.ok()) return st;
    st = DemotePage(codec_, hot_layout_, level.data(), moves[i].tokens, cold.data(), cold.data() + layout_.value_offset,
                    cold.data() + layout_.mean_offset);
    if (st.ok()) {
      return absl::InternalError(absl::StrCat("hot page ", moves[i].from, ": the device refused record ", status[i] - 1,
                                              " that the host demotes"));
    }
    return absl::DataLossError(absl::StrCat("hot page ", moves[i].from, ": ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) {
  if (hot_pool_ == nullptr) return Backend::DecodeHotTokens(page, layer, first, count, keys, values);
  absl::Status st = CheckLayer(layer);
  if (st.ok()) st = CheckOnHotArena(page);
  if (!st.ok()) return st;
  // Into a buffer of this call's own: concurrent Reads of one layer must
  // not write the same host bytes while the other decodes them.
  std::vector<uint8_t> level(hot_layout_.page_bytes);
  {
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    st = DownloadHotPage(page, level.data());
  }
  if (!st.ok()) return st;
  CodecScratch scratch;
  return DecodeLevelPageTokens(codec_, hot_layout_, level.data(), page, first, count,
                               transforms_ != nullptr ? &host_transforms_[layer] : nullptr, values_folded_, keys,
                               values, &scratch);
}

absl::Status CudaBackend::DownloadHotPage(PageId page, uint8_t* dst) {
  absl::Status st = Cuda(
      cudaMemcpyAsync(
          dst, static_cast<const uint8_t*>(hot_arena_) + static_cast<size_t>(page - hot_base_) * hot_layout_.page_bytes,
          hot_layout_.page_bytes, cudaMemcpyDeviceToHost, stream_),
      "download hot page");
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "download hot page");
  return st;
}

}  // namespace cuda_backend
}  // namespace driftkv
