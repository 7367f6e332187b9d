#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/cuda/attend_launcher.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/host_level_copy.h"
#include "backends/cuda/ipc_regions.h"
#include "backends/host_decode.h"
#include "codec/transform/transform.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/encode.h"
#include "kernels/ingest.h"
#include "kernels/level_demote.h"
#include "kernels/level_promote.h"
#include "kernels/page_crc.h"
#include "kernels/transform.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using cuda_backend::Cuda;
using cuda_backend::PinnedScratch;
using cuda_backend::Scratch;

// A staging buffer in device memory (DEVICE INGEST in backends/backend.h).
struct DeviceStaging : StagingBuffer {
  explicit DeviceStaging(int d) : device(d) {}
  ~DeviceStaging() override {
    if (ptr != nullptr) {
      cudaSetDevice(device);
      cudaFree(ptr);
    }
  }
  void* data() override { return ptr; }
  size_t bytes() const override { return size; }
  int device;
  void* ptr = nullptr;
  size_t size = 0;
};

class CudaBackend : public Backend {
 public:
  CudaBackend(const DQuantCodec* codec, const PagePool* pool, const PagePool* hot_pool, int device,
              const TransformSet* transforms, bool values_folded, size_t window_cache_bytes, PageId base, PageId end)
      : codec_(*codec),
        pool_(*pool),
        hot_pool_(hot_pool),
        device_(device),
        transforms_(transforms),
        values_folded_(values_folded),
        window_cache_bytes_(window_cache_bytes),
        base_(base),
        end_(end) {}
  // The device arena: pages [base_, end_) of the pool, page p at
  // (p - base_) * page_bytes.
  size_t arena_bytes() const { return static_cast<size_t>(end_ - base_) * pool_.page_stride(); }
  ~CudaBackend() override {
    if (host_registered_) cudaHostUnregister(pool_.page(base_));
    cudaFree(arena_);
    cudaFree(hot_arena_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (check_stream_ != nullptr) cudaStreamDestroy(check_stream_);
  }

  absl::Status Init() {
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (!st.ok()) return st;
    // The device arena has the host pool's layout (codec/page_layout.h).
    layout_ = pool_.layout();
    if (const std::string error = gpu::GpuPageLayoutError(layout_, gpu::PageUse::kAttend); !error.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("page layout unsupported by the CUDA kernels: ", error));
    }
    st = gpu::MakeEncodeAlphabets(codec_, &encode_);
    if (!st.ok()) return st;
    encode_.rotate = transforms_ == nullptr;
    if (transforms_ != nullptr) {
      st = InitTransforms();
      if (!st.ok()) return st;
    }
    std::vector<uint32_t> tables(512);
    gpu::PackDecodeTable(codec_.key_codec().table(), tables.data());
    gpu::PackDecodeTable(codec_.value_codec().table(), tables.data() + 256);
    st = Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (st.ok()) st = Cuda(cudaStreamCreateWithFlags(&check_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (st.ok()) st = Cuda(cudaMalloc(&arena_, arena_bytes()), "cudaMalloc (page arena)");
    // The host arena, page-locked: encoded pages are mirrored into it by
    // DMA at full speed (pageable memory goes through a bounce buffer).
    // Best effort: without it the copies are only slower.
    if (st.ok()) {
      // Mapped too: the host level's restores write the mirror in the
      // launch that fills the device arena (backends/cuda/host_level_copy.h).
      if (cudaHostRegister(pool_.page(base_), arena_bytes(), cudaHostRegisterMapped) == cudaSuccess) {
        host_registered_ = true;
        void* dev = nullptr;
        if (cudaHostGetDevicePointer(&dev, pool_.page(base_), 0) == cudaSuccess) {
          host_mirror_dev_ = static_cast<uint8_t*>(dev);
        } else {
          cudaGetLastError();
        }
      } else {
        cudaGetLastError();
      }
    }
    if (st.ok()) st = tables_.Reserve(tables.size() * 4);
    if (st.ok())
      st = Cuda(cudaMemcpy(tables_.get<void>(), tables.data(), tables.size() * 4, cudaMemcpyHostToDevice),
                "upload tables");
    if (st.ok() && hot_pool_ != nullptr) st = InitHotTier();
    if (st.ok()) st = WarmBuffers();
    return st;
  }

  // The launcher's buffers and the promotion's page ids, sized at start
  // for the warm batch (cuda_backend::kWarmItems ...).
  absl::Status WarmBuffers() {
    cuda_backend::AttendDevice d;
    d.stream = stream_;
    d.layout = layout_;
    d.page_tokens = pool_.page_tokens();
    d.base = base_;
    d.arena = arena_;
    d.tables_dev = tables_.get<uint32_t>();
    d.hot_arena = hot_arena_;
    d.hot_layout = hot_layout_;
    if (transforms_ != nullptr) {
      d.transforms_dev = transforms_dev_.get<float>();
      d.transform_layers = transforms_->layers;
    }
    d.values_folded = values_folded_;
    absl::Status st = launcher_.Init(d, window_cache_bytes_);
    const size_t pages = cuda_backend::kWarmTokens / pool_.page_tokens();
    if (st.ok() && hot_pool_ != nullptr) st = promote_ids_.Reserve(4 * 6 * cuda_backend::kWarmItems * pages);
    // The host level's copies, for a sequence of kWarmTokens in 64 layers.
    if (st.ok()) st = host_level_.Warm(64 * pages, stream_);
    return st;
  }

  // HOT TIER on the device: a second arena of level pages with the host hot
  // pool's ids. Pages are promoted on the device (kernels/level_promote.h)
  // and never copied back eagerly: Read and demotion of a hot page download
  // that page first (a page is 96 KB; an 8K-token sequence's 2048 pages
  // would take far longer to copy than to promote). The host hot pool's
  // arena stays unused on this backend.
  absl::Status InitHotTier() {
    absl::StatusOr<LevelPageLayout> hl = MakeLevelPageLayout(codec_);
    if (!hl.ok()) return hl.status();
    hot_layout_ = *hl;
    if (hot_pool_->page_stride() != hot_layout_.page_bytes) {
      return absl::FailedPreconditionError(absl::StrCat("hot pool stride ", hot_pool_->page_stride(),
                                                        " is not the level page size ", hot_layout_.page_bytes));
    }
    std::vector<uint32_t> raw(512);
    for (int z = 0; z < 256; ++z) {
      raw[z] = codec_.key_codec().table().decode[z];
      raw[256 + z] = codec_.value_codec().table().decode[z];
    }
    absl::Status st = Cuda(cudaMalloc(&hot_arena_, hot_pool_->capacity_bytes()), "cudaMalloc (hot arena)");
    if (st.ok()) st = raw_tables_.Reserve(raw.size() * 4);
    if (st.ok())
      st = Cuda(cudaMemcpy(raw_tables_.get<void>(), raw.data(), raw.size() * 4, cudaMemcpyHostToDevice),
                "upload rANS tables");
    return st;
  }

  bool SupportsHotTier() const override { return hot_pool_ != nullptr; }

  absl::Status PromotePages(absl::Span<const TierMove> moves) override {
    if (hot_pool_ == nullptr) return Backend::PromotePages(moves);
    if (moves.empty()) return absl::OkStatus();
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    const int count = static_cast<int>(moves.size());
    std::vector<int32_t> ids(3 * count);  // cold ids, hot ids, tokens
    for (int i = 0; i < count; ++i) {
      ids[i] = moves[i].from - base_;
      ids[count + i] = moves[i].to;
      ids[2 * count + i] = moves[i].tokens;
    }
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

  // One upload, the cold pages summed, the promotion, the hot pages summed,
  // one download and one synchronisation.
  absl::Status PromotePagesChecked(absl::Span<const TierMove> moves, const PagePool& cold, const PagePool& hot,
                                   PageChecksum* cold_sums, PageChecksum* hot_sums) override {
    if (hot_pool_ == nullptr || &cold != &pool_ || &hot != hot_pool_) {
      return Backend::PromotePagesChecked(moves, cold, hot, cold_sums, hot_sums);
    }
    if (moves.empty()) return absl::OkStatus();
    const int count = static_cast<int>(moves.size());
    std::vector<int32_t> ids(3 * count);  // cold ids, hot ids, tokens
    for (int i = 0; i < count; ++i) {
      if (absl::Status st = CheckOnArena(moves[i].from); !st.ok()) return st;
      ids[i] = moves[i].from - base_;
      ids[count + i] = moves[i].to;
      ids[2 * count + i] = moves[i].tokens;
    }
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
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
    if (st.ok()) st = gpu::LaunchPageCrc(c, stream_);
    if (st.ok()) st = gpu::LaunchPromote(PromoteParamsFor(dev, count), stream_);
    gpu::PageCrcParams h;
    h.arena_dev = static_cast<const uint8_t*>(hot_arena_);
    h.page_bytes = hot_layout_.page_bytes;
    h.pages_dev = dev + count;
    h.pages = count;
    h.sums_dev = reinterpret_cast<uint32_t*>(dev + 5 * count);
    if (st.ok()) st = gpu::LaunchPageCrc(h, stream_);
    std::vector<int32_t> back(3 * count);
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(back.data(), dev + 3 * count, 4 * back.size(), cudaMemcpyDeviceToHost, stream_),
                "download promotion status and checksums");
    }
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "promote");
    if (!st.ok()) return st;
    static_assert(sizeof(PageChecksum) == sizeof(int32_t), "the kernel's sums are CRC-32C words");
    std::memcpy(cold_sums, back.data() + count, 4 * static_cast<size_t>(count));
    std::memcpy(hot_sums, back.data() + 2 * count, 4 * static_cast<size_t>(count));
    return PromotionStatus(moves, back.data());
  }

  // The launch of a promotion whose device words `ids` hold the cold ids,
  // the hot ids, the tokens and room for the status, [count] each.
  gpu::PromoteParams PromoteParamsFor(int32_t* ids, int count) const {
    gpu::PromoteParams pp;
    pp.cold_pool_dev = static_cast<const uint8_t*>(arena_);
    pp.cold = layout_;
    pp.hot_pool_dev = static_cast<uint8_t*>(hot_arena_);
    pp.hot = hot_layout_;
    pp.tables_dev = raw_tables_.get<uint32_t>();
    pp.key_payload = codec_.key_codec().payload_bytes();
    pp.value_payload = codec_.value_codec().payload_bytes();
    pp.pages = count;
    pp.cold_pages_dev = ids;
    pp.hot_pages_dev = ids + count;
    pp.tokens_dev = ids + 2 * count;
    pp.status_dev = ids + 3 * count;
    return pp;
  }

  // DATA_LOSS naming the first move whose page did not decode.
  static absl::Status PromotionStatus(absl::Span<const TierMove> moves, const int32_t* status) {
    for (size_t i = 0; i < moves.size(); ++i) {
      if (status[i] != 0) {
        return absl::DataLossError(
            absl::StrCat("page ", moves[i].from, " token ", status[i] - 1, ": record does not decode (promotion)"));
      }
    }
    return absl::OkStatus();
  }

  // Demotion on the device: one upload of the page lists, the kernel
  // (kernels/level_demote.h, DemotePage's bytes), the cold pages copied to
  // the host mirror, one synchronisation. A page the kernel refuses
  // (corrupt levels or headers) is demoted again on the host for
  // DemotePage's own message.
  absl::Status DemotePages(absl::Span<const TierMove> moves) override {
    if (hot_pool_ == nullptr) return Backend::DemotePages(moves);
    if (moves.empty()) return absl::OkStatus();
    const int count = static_cast<int>(moves.size());
    std::vector<int32_t> ids(3 * count);  // hot ids, cold ids, tokens
    for (int i = 0; i < count; ++i) {
      if (absl::Status st = CheckOnArena(moves[i].to); !st.ok()) return st;
      ids[i] = moves[i].from;
      ids[count + i] = moves[i].to - base_;
      ids[2 * count + i] = moves[i].tokens;
    }
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
      st = Cuda(cudaMemcpyAsync(status.data(), dp.status_dev, 4 * static_cast<size_t>(count), cudaMemcpyDeviceToHost,
                                stream_),
                "download demotion status");
    }
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "demote");
    if (!st.ok()) return st;
    for (int i = 0; i < count; ++i) {
      if (status[i] == 0) continue;
      std::vector<uint8_t> level(hot_layout_.page_bytes), cold(layout_.page_bytes);
      st = DownloadHotPage(moves[i].from, level.data());
      if (!st.ok()) return st;
      st = DemotePage(codec_, hot_layout_, level.data(), moves[i].tokens, cold.data(),
                      cold.data() + layout_.value_offset, cold.data() + layout_.mean_offset);
      if (st.ok()) {
        return absl::InternalError(absl::StrCat("hot page ", moves[i].from, ": the device refused record ",
                                                status[i] - 1, " that the host demotes"));
      }
      return absl::DataLossError(absl::StrCat("hot page ", moves[i].from, ": ", st.message()));
    }
    return absl::OkStatus();
  }

  absl::Status UploadPages(absl::Span<const PageId> pages) override {
    absl::MutexLock lock(&mu_);
    for (PageId p : pages) {
      absl::Status st =
          Cuda(cudaMemcpyAsync(static_cast<uint8_t*>(arena_) + static_cast<size_t>(p - base_) * layout_.page_bytes,
                               pool_.page(p), layout_.page_bytes, cudaMemcpyHostToDevice, stream_),
               "upload restored page");
      if (!st.ok()) return st;
    }
    return Cuda(cudaStreamSynchronize(stream_), "upload restored pages");
  }

  // THE HOST LEVEL (backends/backend.h): one launch each way between the
  // device arena and the level's page-locked slots; restores write the
  // host mirror in the same launch (or on the host when it is not mapped).
  absl::Status PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                           absl::Span<uint8_t* const> dst) override {
    if (&pool != &pool_) return Backend::PagesToHost(pool, pages, dst);
    if (absl::Status st = CheckOnArena(pages); !st.ok()) return st;
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    return host_level_.ToHost(Arena(), pages, dst, stream_);
  }
  absl::Status PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src, absl::Span<const PageId> pages,
                             PageChecksum* sums) override {
    if (&pool != &pool_) return Backend::PagesFromHost(pool, src, pages, sums);
    if (absl::Status st = CheckOnArena(pages); !st.ok()) return st;
    static_assert(sizeof(PageChecksum) == sizeof(uint32_t), "the kernel's sums are CRC-32C words");
    {
      absl::MutexLock lock(&mu_);
      cudaSetDevice(device_);
      absl::Status st = host_level_.FromHost(Arena(), src, pages, reinterpret_cast<uint32_t*>(sums), stream_);
      if (!st.ok()) return st;
    }
    if (host_mirror_dev_ == nullptr) {
      for (size_t i = 0; i < pages.size(); ++i) std::memcpy(pool_.page(pages[i]), src[i], layout_.page_bytes);
    }
    return absl::OkStatus();
  }
  cuda_backend::DeviceArena Arena() const {
    cuda_backend::DeviceArena a;
    a.dev = static_cast<uint8_t*>(arena_);
    a.mirror = host_mirror_dev_;
    a.base = base_;
    a.page_bytes = layout_.page_bytes;
    return a;
  }
  // Internal unless cold page p is on this device's arena (PARTITIONS).
  absl::Status CheckOnArena(PageId p) const {
    if (p >= base_ && p < end_) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("page ", p, " is not on this device's arena"));
  }
  absl::Status CheckOnArena(absl::Span<const PageId> pages) const {
    for (PageId p : pages) {
      if (absl::Status st = CheckOnArena(p); !st.ok()) return st;
    }
    return absl::OkStatus();
  }

  // INTEGRITY (backends/backend.h): each page as the device arena holds it
  // (the cold arena for the cold pool, the hot arena for the hot pool),
  // summed on the device (kernels/page_crc.h: wire/crc32c.h's checksum of
  // the same bytes); only the sums come back. The host pool is a mirror
  // (cold) or unused (hot): what the kernels read is the device's copy, so
  // that is what a check must see.
  absl::Status ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) override {
    const bool cold = &pool == &pool_;
    if (!cold && (hot_pool_ == nullptr || &pool != hot_pool_)) return Backend::ChecksumPages(pool, pages, sums);
    if (pages.empty()) return absl::OkStatus();
    std::vector<int32_t> ids(pages.size());
    for (size_t i = 0; i < pages.size(); ++i) {
      if (cold) {
        if (absl::Status st = CheckOnArena(pages[i]); !st.ok()) return st;
      }
      ids[i] = static_cast<int32_t>(cold ? pages[i] - base_ : pages[i]);
    }
    static_assert(sizeof(PageChecksum) == sizeof(uint32_t), "the kernel's sums are CRC-32C words");
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    const size_t id_bytes = (ids.size() * 4 + 15) & ~static_cast<size_t>(15);
    absl::Status st = crc_.Reserve(id_bytes + ids.size() * 4);
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(crc_.get<void>(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream_),
                "upload page ids for their checksums");
    }
    gpu::PageCrcParams p;
    p.arena_dev = static_cast<const uint8_t*>(cold ? arena_ : hot_arena_);
    p.page_bytes = cold ? layout_.page_bytes : hot_layout_.page_bytes;
    p.pages_dev = crc_.get<int32_t>();
    p.pages = static_cast<int>(ids.size());
    p.sums_dev = reinterpret_cast<uint32_t*>(crc_.get<uint8_t>() + id_bytes);
    if (st.ok()) st = gpu::LaunchPageCrc(p, stream_);
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(sums, p.sums_dev, ids.size() * 4, cudaMemcpyDeviceToHost, stream_),
                "download page checksums");
    }
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "page checksums");
    return st;
  }

  absl::Status DecodeHotTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    if (hot_pool_ == nullptr) return Backend::DecodeHotTokens(page, layer, first, count, keys, values);
    absl::Status st = CheckLayer(layer);
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

  // The device's hot page into `dst` (host); the page's layer is locked by
  // the caller (Read or demotion), so the page does not change meanwhile.
  absl::Status DownloadHotPage(PageId page, uint8_t* dst) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Status st =
        Cuda(cudaMemcpyAsync(
                 dst, static_cast<const uint8_t*>(hot_arena_) + static_cast<size_t>(page) * hot_layout_.page_bytes,
                 hot_layout_.page_bytes, cudaMemcpyDeviceToHost, stream_),
             "download hot page");
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "download hot page");
    return st;
  }

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

  absl::Status InitTransforms() {
    const TransformSet& t = *transforms_;
    if (codec_.config().hadamard) {
      return absl::FailedPreconditionError("WUSH transforms need a codec built with rotation \"identity\"");
    }
    if (t.kv_heads != layout_.kv_heads || t.head_dim != layout_.head_dim || t.layers < 1) {
      return absl::FailedPreconditionError(absl::StrCat("transforms of ", t.layers, " layers x ", t.kv_heads, " x ",
                                                        t.head_dim, " do not fit the codec's ", layout_.kv_heads, " x ",
                                                        layout_.head_dim));
    }
    for (int l = 0; l < t.layers; ++l) {
      absl::StatusOr<LayerTransform> lt = LayerTransform::FromSet(t, l);
      if (!lt.ok()) return lt.status();
      host_transforms_.push_back(*std::move(lt));
    }
    const std::vector<float> packed = gpu::PackTransforms(t);
    absl::Status st = transforms_dev_.Reserve(packed.size() * sizeof(float));
    if (st.ok()) {
      st = Cuda(
          cudaMemcpy(transforms_dev_.get<void>(), packed.data(), packed.size() * sizeof(float), cudaMemcpyHostToDevice),
          "upload transforms");
    }
    return st;
  }

  absl::Status CheckLayer(int layer) const {
    if (transforms_ == nullptr || (layer >= 0 && layer < transforms_->layers)) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " has no transform (the set has ", transforms_->layers, " layers)"));
  }

  // x [rows][kv_heads][head_dim] on the device <- matrix m of each row's layer.
  absl::Status TransformOnDevice(float* x_dev, int rows, const int32_t* layer_dev, int rows_per_layer, int m) {
    gpu::HeadTransformParams tp;
    tp.mats_dev = transforms_dev_.get<float>();
    tp.layers = transforms_->layers;
    tp.kv_heads = layout_.kv_heads;
    tp.head_dim = layout_.head_dim;
    tp.matrix = m;
    tp.in_dev = x_dev;
    tp.out_dev = x_dev;
    tp.rows = rows;
    tp.heads = layout_.kv_heads;
    tp.layer_dev = layer_dev;
    tp.rows_per_layer = rows_per_layer;
    return gpu::LaunchHeadTransform(tp, stream_);
  }

  absl::Status EncodePages(absl::Span<EncodeJob> jobs) override {
    if (jobs.empty()) return absl::OkStatus();
    for (const EncodeJob& j : jobs) {
      absl::Status st = CheckLayer(j.layer);
      if (!st.ok()) return st;
    }
    absl::ReleasableMutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    const int P = pool_.page_tokens(), n = layout_.n();
    const size_t page_floats = static_cast<size_t>(P) * n;
    const size_t in_bytes = jobs.size() * page_floats * sizeof(float);
    absl::Status st = keys_in_.Reserve(in_bytes);
    if (st.ok()) st = values_in_.Reserve(in_bytes);
    for (size_t j = 0; j < jobs.size() && st.ok(); ++j) {
      st = Cuda(cudaMemcpyAsync(keys_in_.get<float>() + j * page_floats, jobs[j].keys, page_floats * sizeof(float),
                                cudaMemcpyHostToDevice, stream_),
                "upload keys");
      if (st.ok()) {
        st = Cuda(cudaMemcpyAsync(values_in_.get<float>() + j * page_floats, jobs[j].values,
                                  page_floats * sizeof(float), cudaMemcpyHostToDevice, stream_),
                  "upload values");
      }
    }
    if (!st.ok()) return st;
    st = EncodeOnDeviceLocked(keys_in_.get<float>(), values_in_.get<float>(), jobs);
    lock.Release();
    if (st.ok()) st = MirrorPages(jobs);
    return st;
  }

  // DEVICE INGEST (backends/backend.h): staging buffers are device memory
  // of this GPU; values are checked and rounded to bf16 by
  // kernels/ingest.h and encoded from there.
  int staging_device() const override { return device_; }

  absl::StatusOr<std::unique_ptr<StagingBuffer>> AllocateStaging(size_t bytes) override {
    auto buffer = std::make_unique<DeviceStaging>(device_);
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (st.ok()) st = Cuda(cudaMalloc(&buffer->ptr, bytes), "cudaMalloc (staging)");
    if (!st.ok()) return st;
    buffer->size = bytes;
    return std::unique_ptr<StagingBuffer>(std::move(buffer));
  }

  absl::Status CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) override {
    const size_t elements = static_cast<size_t>(count) * n, bytes = elements * DTypeBytes(t.dtype);
    std::string raw(bytes, '\0');
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    for (int kind = 0; kind < 2 && st.ok(); ++kind) {
      st = Cuda(cudaMemcpy(raw.data(), kind == 0 ? t.keys : t.values, bytes, cudaMemcpyDeviceToHost),
                "download repeated tokens");
      if (st.ok()) TensorToFloat(raw, t.dtype, elements, kind == 0 ? keys : values);
    }
    return st;
  }

  absl::Status CheckStaged(const StagedTokens& t, int n, float limit) override {
    absl::MutexLock lock(&check_mu_);  // not mu_: checks overlap other chunks' encoding
    const size_t elements = static_cast<size_t>(t.tokens) * n;
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (st.ok()) st = bad_.Reserve(2 * sizeof(unsigned long long));
    if (st.ok())
      st = Cuda(cudaMemsetAsync(bad_.get<void>(), 0xff, 2 * sizeof(unsigned long long), check_stream_), "reset check");
    for (int kind = 0; kind < 2 && st.ok(); ++kind) {
      gpu::IngestParams ip;
      ip.src_dev = kind == 0 ? t.keys : t.values;
      ip.dtype = t.dtype;
      ip.elements = elements;
      ip.limit = limit;
      ip.first_bad_dev = bad_.get<unsigned long long>() + kind;
      st = gpu::LaunchIngest(ip, check_stream_);
    }
    unsigned long long bad[2] = {0, 0};
    if (st.ok())
      st = Cuda(cudaMemcpyAsync(bad, bad_.get<void>(), sizeof(bad), cudaMemcpyDeviceToHost, check_stream_),
                "download check");
    if (st.ok()) st = Cuda(cudaStreamSynchronize(check_stream_), "check staged tokens");
    if (!st.ok()) return st;
    for (int kind = 0; kind < 2; ++kind) {
      if (bad[kind] == ~0ull) continue;
      // The failing element, converted on the host for the message.
      const size_t eb = DTypeBytes(t.dtype);
      std::string raw(eb, '\0');
      st = Cuda(cudaMemcpy(raw.data(), static_cast<const uint8_t*>(kind == 0 ? t.keys : t.values) + bad[kind] * eb, eb,
                           cudaMemcpyDeviceToHost),
                "download bad element");
      if (!st.ok()) return st;
      float x = 0.0f;
      TensorToFloat(raw, t.dtype, 1, &x);
      const char* field = kind == 0 ? "keys" : "values";
      return absl::InvalidArgumentError(
          absl::StrCat(field, " element ", bad[kind], " is ", x,
                       std::isfinite(x) ? absl::StrCat("; |x| must be <= ", limit) : "; must be finite"));
    }
    return absl::OkStatus();
  }

  absl::Status EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                            absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                            absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                            std::vector<uint16_t>* tail_values) override {
    for (const EncodeJob& j : jobs) {
      absl::Status st = CheckLayer(j.layer);
      if (!st.ok()) return st;
    }
    absl::ReleasableMutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    const size_t prefix = prefix_keys.size() / n, total = prefix + static_cast<size_t>(fresh);
    const size_t encoded = jobs.size() * static_cast<size_t>(page_tokens);
    if (encoded > total) return absl::InternalError("EncodeStaged: more pages than tokens");
    // S = [prefix; staged tokens] as bf16-rounded floats, on the device.
    std::vector<float> pk(prefix * n), pv(prefix * n);
    for (size_t i = 0; i < prefix * n; ++i) {
      pk[i] = Bf16ToFloat(prefix_keys[i]);
      pv[i] = Bf16ToFloat(prefix_values[i]);
    }
    const size_t bytes = std::max<size_t>(total, 1) * n * sizeof(float);
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (st.ok()) st = keys_in_.Reserve(bytes);
    if (st.ok()) st = values_in_.Reserve(bytes);
    if (st.ok() && prefix > 0) {
      st = Cuda(cudaMemcpyAsync(keys_in_.get<float>(), pk.data(), pk.size() * 4, cudaMemcpyHostToDevice, stream_),
                "upload window keys");
      if (st.ok())
        st = Cuda(cudaMemcpyAsync(values_in_.get<float>(), pv.data(), pv.size() * 4, cudaMemcpyHostToDevice, stream_),
                  "upload window values");
    }
    const size_t eb = DTypeBytes(t.dtype);
    for (int kind = 0; kind < 2 && st.ok(); ++kind) {
      gpu::IngestParams ip;
      ip.src_dev = static_cast<const uint8_t*>(kind == 0 ? t.keys : t.values) + static_cast<size_t>(skip) * n * eb;
      ip.dtype = t.dtype;
      ip.elements = static_cast<size_t>(fresh) * n;
      ip.out_dev = (kind == 0 ? keys_in_.get<float>() : values_in_.get<float>()) + prefix * n;
      st = gpu::LaunchIngest(ip, stream_);
    }
    if (st.ok() && !jobs.empty()) st = EncodeOnDeviceLocked(keys_in_.get<float>(), values_in_.get<float>(), jobs);
    if (!st.ok()) return st;
    // The window: the tokens after the pages, back to the host as bf16.
    const size_t rest = (total - encoded) * n;
    std::vector<float> rk(rest), rv(rest);
    if (rest > 0) {
      st = Cuda(
          cudaMemcpyAsync(rk.data(), keys_in_.get<float>() + encoded * n, rest * 4, cudaMemcpyDeviceToHost, stream_),
          "download window keys");
      if (st.ok())
        st = Cuda(cudaMemcpyAsync(rv.data(), values_in_.get<float>() + encoded * n, rest * 4, cudaMemcpyDeviceToHost,
                                  stream_),
                  "download window values");
      if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "download window");
      if (!st.ok()) return st;
    }
    lock.Release();
    tail_keys->resize(rest);
    tail_values->resize(rest);
    for (size_t i = 0; i < rest; ++i) {
      (*tail_keys)[i] = FloatToBf16(rk[i]);
      (*tail_values)[i] = FloatToBf16(rv[i]);
    }
    return MirrorPages(jobs);
  }

  // Mirrors encoded pages into the host arena, one copy per run of
  // consecutive ids (a fresh reservation is one run), on the calling
  // thread's own stream and without mu_: the copies of one call overlap the
  // next call's encoding. REQUIRES: their encoding has completed.
  absl::Status MirrorPages(absl::Span<const EncodeJob> jobs) {
    std::vector<PageId> pages;
    for (const EncodeJob& j : jobs) pages.push_back(j.page);
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    if (st.ok()) st = EnqueueMirror(std::move(pages), cudaStreamPerThread);
    if (st.ok() && !jobs.empty()) st = Cuda(cudaStreamSynchronize(cudaStreamPerThread), "download pages");
    return st;
  }

  // Queues on `stream` the copies of the device arena's `pages` to their
  // host mirror, one copy per run of consecutive ids.
  absl::Status EnqueueMirror(std::vector<PageId> pages, cudaStream_t stream) {
    std::sort(pages.begin(), pages.end());
    for (size_t j = 0; j < pages.size();) {
      size_t end = j + 1;
      while (end < pages.size() && pages[end] == pages[end - 1] + 1) ++end;
      const size_t offset = static_cast<size_t>(pages[j] - base_) * layout_.page_bytes;
      absl::Status st =
          Cuda(cudaMemcpyAsync(pool_.key_records(pages[j]), static_cast<uint8_t*>(arena_) + offset,
                               (end - j) * layout_.page_bytes, cudaMemcpyDeviceToHost, stream),
               "download pages");
      if (!st.ok()) return st;
      j = end;
    }
    return absl::OkStatus();
  }

  // Encodes jobs[j] from tokens [j P, (j + 1) P) of keys_dev/values_dev
  // (device floats, model domain; transformed in place with WUSH) and
  // writes the pages to the device arena; the caller mirrors them
  // (MirrorPages) after releasing mu_.
  absl::Status EncodeOnDeviceLocked(float* keys_dev, float* values_dev, absl::Span<EncodeJob> jobs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int P = pool_.page_tokens(), n = layout_.n();
    const int tokens = static_cast<int>(jobs.size()) * P;
    absl::Status st = pages_.Reserve(2 * jobs.size() * sizeof(int32_t));
    if (st.ok()) st = stats_.Reserve(sizeof(gpu::EncodeStreamStats) * 2 * tokens);
    if (!st.ok()) return st;
    std::vector<int32_t> ids(2 * jobs.size());  // page ids, then the pages' layers
    for (size_t j = 0; j < jobs.size(); ++j) {
      ids[j] = jobs[j].page - base_;
      ids[jobs.size() + j] = jobs[j].layer;
    }
    st = Cuda(cudaMemcpyAsync(pages_.get<void>(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice, stream_),
              "upload page ids");
    if (st.ok() && transforms_ != nullptr) {
      const int32_t* layers_dev = pages_.get<int32_t>() + jobs.size();
      st = TransformOnDevice(keys_dev, tokens, layers_dev, P, gpu::kTfKey);
      if (st.ok() && !values_folded_) st = TransformOnDevice(values_dev, tokens, layers_dev, P, gpu::kTfValue);
    }
    if (!st.ok()) return st;
    gpu::EncodeParams ep = encode_;
    ep.keys_dev = keys_dev;
    ep.values_dev = values_dev;
    ep.tokens = tokens;
    ep.pages_dev = pages_.get<int32_t>();
    ep.pool_dev = static_cast<uint8_t*>(arena_);
    ep.stats_dev = stats_.get<gpu::EncodeStreamStats>();
    st = gpu::LaunchEncode(ep, stream_);
    if (!st.ok()) return st;
    std::vector<gpu::EncodeStreamStats> stats(2 * tokens);
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(stats.data(), stats_.get<void>(), stats.size() * sizeof(stats[0]),
                                cudaMemcpyDeviceToHost, stream_),
                "download stats");
    }
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "encode");
    if (!st.ok()) return st;
    for (size_t j = 0; j < jobs.size(); ++j) {
      CodecStats cs;
      jobs[j].key_utilization.assign(P, 0.0f);
      jobs[j].value_utilization.assign(P, 0.0f);
      for (int t = 0; t < P; ++t) {
        for (int kind = 0; kind < 2; ++kind) {
          const gpu::EncodeStreamStats& s = stats[2 * (j * P + t) + kind];
          if (s.error) {
            return absl::InvalidArgumentError(absl::StrCat(kind == 0 ? "key" : "value", " of token ", t, " of job ", j,
                                                           ": a value is not finite or exceeds the fp16 range"));
          }
          StreamStats& ss = kind == 0 ? cs.keys : cs.values;
          ss.streams += 1;
          ss.symbols += n;
          ss.bytes_used += s.bytes_used;
          ss.bytes_budget += kind == 0 ? encode_.keys.payload_bytes : encode_.values.payload_bytes;
          ss.retries += s.retries;
          ss.fallbacks += s.fallback != 0;
          ss.moved += s.moved;
          ss.max_move = std::max(ss.max_move, static_cast<int>(s.max_move));
          ss.constant += s.constant;
          std::vector<float>& util = kind == 0 ? jobs[j].key_utilization : jobs[j].value_utilization;
          util[t] = static_cast<float>(s.bytes_used) /
                    (kind == 0 ? encode_.keys.payload_bytes : encode_.values.payload_bytes);
        }
      }
      jobs[j].stats = cs;
    }
    return absl::OkStatus();
  }

  absl::Status DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) override {
    absl::Status lst = CheckLayer(layer);
    if (!lst.ok()) return lst;
    // The host arena mirrors the device one: decode there, exactly as the CPU does.
    CodecScratch scratch;
    return DecodePageTokens(codec_, pool_, page, first, count,
                            transforms_ != nullptr ? &host_transforms_[layer] : nullptr, values_folded_, keys, values,
                            &scratch);
  }

  absl::Status CacheWindows(absl::Span<const AttendJob> jobs) override {
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    return launcher_.CacheWindows(jobs);
  }

  void Attend(absl::Span<AttendJob> jobs) override {
    // One launch per run of jobs with equal (q_heads, softmax_scale, tier):
    // hot jobs run the level-page kernel, cold ones the fused D-Quant kernel.
    size_t begin = 0;
    while (begin < jobs.size()) {
      size_t end = begin + 1;
      while (end < jobs.size() && jobs[end].q_heads == jobs[begin].q_heads &&
             jobs[end].softmax_scale == jobs[begin].softmax_scale && jobs[end].hot == jobs[begin].hot) {
        ++end;
      }
      absl::Status st;
      {
        absl::MutexLock lock(&mu_);
        cudaSetDevice(device_);  // the calling RPC thread's current device
        st = launcher_.Run(jobs.subspan(begin, end - begin));
      }
      if (!st.ok()) {
        for (size_t i = begin; i < end; ++i) jobs[i].status = st;
      }
      begin = end;
    }
  }

 private:
  const DQuantCodec& codec_;
  const PagePool& pool_;
  const PagePool* const hot_pool_;  // null: no hot tier
  const int device_;
  const TransformSet* const transforms_;  // null: the codec's Hadamard
  const bool values_folded_;
  const size_t window_cache_bytes_;
  const PageId base_, end_;                      // the pages of this device (PARTITIONS in page_pool.h)
  std::vector<LayerTransform> host_transforms_;  // for DecodeTokens
  PageLayout layout_;
  LevelPageLayout hot_layout_;
  void* hot_arena_ = nullptr;
  Scratch raw_tables_, promote_ids_;
  Scratch crc_;  // ChecksumPages: page ids, then their sums
  gpu::EncodeParams encode_;
  cudaStream_t stream_ = nullptr;
  void* arena_ = nullptr;
  bool host_registered_ = false;            // the host arena is page-locked
  uint8_t* host_mirror_dev_ = nullptr;      // and mapped here (null: not mapped)
  cuda_backend::HostLevelCopy host_level_;  // under mu_
  absl::Mutex mu_;
  Scratch transforms_dev_, tables_, keys_in_, values_in_, pages_, stats_;
  // CheckStaged runs on its own stream under its own lock.
  absl::Mutex check_mu_;
  cudaStream_t check_stream_ = nullptr;
  Scratch bad_ ABSL_GUARDED_BY(check_mu_);
  cuda_backend::AttendLauncher launcher_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const DQuantCodec* codec, const PagePool* pool, int device,
                                                         const TransformSet* transforms, bool values_folded,
                                                         size_t window_cache_bytes, const PagePool* hot_pool,
                                                         int partition) {
  if (!gpu::GpuAvailable()) return absl::FailedPreconditionError("no CUDA device is usable");
  if (partition < 0 || partition >= pool->partitions()) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of a pool of ", pool->partitions()));
  }
  if (hot_pool != nullptr && pool->partitions() > 1) {
    return absl::FailedPreconditionError("the hot tier runs on one device only");
  }
  auto b = std::make_unique<CudaBackend>(codec, pool, hot_pool, device, transforms, values_folded, window_cache_bytes,
                                         pool->partition_begin(partition), pool->partition_begin(partition + 1));
  absl::Status st = b->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace driftkv
