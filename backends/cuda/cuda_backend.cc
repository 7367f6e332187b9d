#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "backends/attend_phases.h"
#include "backends/cuda/client_io.h"
#include "backends/cuda/device_memory.h"
#include "backends/cuda/ipc_regions.h"
#include "backends/cuda/launch_plans.h"
#include "backends/cuda/stage_timer.h"
#include "backends/cuda/window_cache.h"
#include "backends/cuda/window_upload.h"
#include "backends/host_decode.h"
#include "codec/transform/transform.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/encode.h"
#include "kernels/ingest.h"
#include "kernels/level_attention.h"
#include "kernels/level_promote.h"
#include "kernels/page_crc.h"
#include "kernels/region_io.h"
#include "kernels/transform.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace {

using cuda_backend::Cuda;
using cuda_backend::PinnedScratch;
using cuda_backend::Scratch;

// The inputs of one attention launch, packed into one pinned staging
// buffer and uploaded with one copy (pinned and reused: no page faults,
// full-speed DMA). Byte offsets, each region 256-byte aligned:
//   [0, table)            5 x [items] int32: page_start, tokens,
//                         window_tokens, layer, window_start
//   [table, client)       the page table, int32
//   [client, window_keys) client tensors' lists (ClientIo)
//   [window_keys, window_values), [window_values, query)
//                         bf16 window tokens: a few missing tokens of
//                         cached windows (each upload's keys then values,
//                         from window_keys on), or every window back to
//                         back (keys, then values)
//   [query, bytes)        the queries, [items][q_heads][head_dim] float;
//                         not uploaded when every query is in client memory
// Cached windows' missing tokens up to this size ride in a launch's
// staging upload (a 256-item decode step's one token a window, at 8 KV
// heads x 128); more go through the window ring.
constexpr size_t kStagedWindowBytes = size_t{1} << 20;

struct StagingLayout {
  StagingLayout(int items, size_t table_entries, size_t client_bytes, size_t query_floats, size_t window_tokens,
                int n) {
    auto align = [](size_t b) { return (b + 255) & ~static_cast<size_t>(255); };
    table = align(static_cast<size_t>(items) * 5 * 4);
    client = table + align(std::max<size_t>(table_entries, 1) * 4);
    window_keys = client + align(client_bytes);
    window_values = window_keys + align(window_tokens * n * 2);
    query = window_values + align(window_tokens * n * 2);
    bytes = query + align(query_floats * 4);
  }
  size_t table, client, query, window_keys, window_values, bytes;
};

// Launch plans kept on the device (launch_plans.h): 128, or
// DRIFTKV_KEPT_PLANS (0: none, every launch uploads its plan; a probe for
// side-by-side measurements, not a setting to serve with).
int KeptPlanCapacity() {
  const char* v = std::getenv("DRIFTKV_KEPT_PLANS");
  if (v == nullptr || *v == '\0') return 128;
  return std::max(0, std::min(4096, std::atoi(v)));
}

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
    st = windows_.Init(window_cache_bytes_, layout_.n());
    if (st.ok() && windows_.enabled()) st = window_upload_.Init(layout_.n());
    if (!st.ok()) return st;
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
      if (cudaHostRegister(pool_.page(base_), arena_bytes(), cudaHostRegisterDefault) == cudaSuccess) {
        host_registered_ = true;
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

  // The growable buffers sized at start for a decode batch of 64 items of
  // 32 query heads over 8K tokens and its promotion: allocated by the first
  // call that needs them (pinned memory above all, and cudaFree waits for
  // the device), they cost that call tens of milliseconds. Larger batches
  // still grow them on first use.
  absl::Status WarmBuffers() {
    constexpr int kItems = 64, kQHeads = 32, kTokens = 8192;
    const int d = layout_.head_dim, pages = kTokens / pool_.page_tokens();
    const size_t qsz = static_cast<size_t>(kItems) * kQHeads * d;
    absl::StatusOr<size_t> client_bytes = client_io_.Warm(kItems);
    if (!client_bytes.ok()) return client_bytes.status();
    const StagingLayout stage(kItems, static_cast<size_t>(kItems) * pages, *client_bytes, qsz, 0, layout_.n());
    const size_t out_bytes = (qsz + static_cast<size_t>(kItems) * kQHeads) * 4;
    absl::Status st = a_stage_.Reserve(stage.bytes);
    if (st.ok()) st = host_stage_.Reserve(stage.bytes);
    if (st.ok()) st = a_out_.Reserve(out_bytes);
    if (st.ok()) st = host_out_.Reserve(out_bytes);
    if (st.ok()) st = a_ws_.Reserve(gpu::AttentionWorkspaceBytes(kItems, kQHeads, d, pages));
    if (st.ok() && hot_pool_ != nullptr) st = promote_ids_.Reserve(4 * 6 * static_cast<size_t>(kItems) * pages);
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
      if (moves[i].from < base_ || moves[i].from >= end_) {
        return absl::InternalError(absl::StrCat("page ", moves[i].from, " is not on this device's arena"));
      }
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

  absl::Status DemotePages(absl::Span<const TierMove> moves) override {
    if (hot_pool_ == nullptr) return Backend::DemotePages(moves);
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    std::vector<uint8_t> level(hot_layout_.page_bytes);
    for (const TierMove& m : moves) {
      absl::Status st = DownloadHotPage(m.from, level.data());
      if (!st.ok()) return st;
      uint8_t* cold = pool_.key_records(m.to);
      st = DemotePage(codec_, hot_layout_, level.data(), m.tokens, cold, cold + layout_.value_offset,
                      cold + layout_.mean_offset);
      if (!st.ok()) return absl::DataLossError(absl::StrCat("hot page ", m.from, ": ", st.message()));
      st = Cuda(cudaMemcpyAsync(static_cast<uint8_t*>(arena_) + static_cast<size_t>(m.to - base_) * layout_.page_bytes,
                                cold, layout_.page_bytes, cudaMemcpyHostToDevice, stream_),
                "upload demoted page");
      if (!st.ok()) return st;
    }
    return Cuda(cudaStreamSynchronize(stream_), "demote");
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
      if (cold && (pages[i] < base_ || pages[i] >= end_)) {
        return absl::InternalError(absl::StrCat("page ", pages[i], " is not on this device's arena"));
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
    return client_io_.Read(reads, stream_);
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
    std::vector<PageId> sorted;
    for (const EncodeJob& j : jobs) sorted.push_back(j.page - base_);
    std::sort(sorted.begin(), sorted.end());
    absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
    for (size_t j = 0; j < sorted.size() && st.ok();) {
      size_t end = j + 1;
      while (end < sorted.size() && sorted[end] == sorted[end - 1] + 1) ++end;
      const size_t offset = static_cast<size_t>(sorted[j]) * layout_.page_bytes;
      st = Cuda(cudaMemcpyAsync(pool_.key_records(sorted[j] + base_), static_cast<uint8_t*>(arena_) + offset,
                                (end - j) * layout_.page_bytes, cudaMemcpyDeviceToHost, cudaStreamPerThread),
                "download pages");
      j = end;
    }
    if (st.ok() && !sorted.empty()) st = Cuda(cudaStreamSynchronize(cudaStreamPerThread), "download pages");
    return st;
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
    std::vector<cuda_backend::WindowCache::Upload>& uploads = plan_.uploads;
    if (!windows_.Plan(jobs, &plan_.slot_of, &uploads) || uploads.empty()) return absl::OkStatus();
    absl::Status st = window_upload_.Upload(jobs, uploads, windows_, stream_);
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "cache windows");
    if (!st.ok()) windows_.Invalidate();
    return st;
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
      const absl::Status st = AttendRun(jobs.subspan(begin, end - begin));
      if (!st.ok()) {
        for (size_t i = begin; i < end; ++i) jobs[i].status = st;
      }
      begin = end;
    }
  }

 private:
  absl::Status AttendRun(absl::Span<AttendJob> jobs) {
    absl::MutexLock lock(&mu_);
    cudaSetDevice(device_);  // the calling RPC thread's current device
    const int kept = plans_.Find(jobs);
    absl::Status st =
        kept >= 0 && windows_.Keep(jobs, kept_[kept].slot_of) ? AttendKept(jobs, kept_[kept]) : AttendPlanned(jobs);
    // A failure may come after window slots were planned and before their
    // tokens arrived, or after a plan was recorded and before it reached
    // the device: forget both rather than trust them.
    if (!st.ok()) {
      windows_.Invalidate();
      plans_.Clear();
    }
    return st;
  }

  // Where a launch's inputs lie on the device.
  struct LaunchInputs {
    const uint8_t* plan = nullptr;  // StagingLayout's [0, window_keys): items' arrays, page table, client lists
    const StagingLayout* layout = nullptr;
    const cuda_backend::ClientLaunch* client = nullptr;
    const uint8_t* window_keys = nullptr;
    const uint8_t* window_values = nullptr;
    float* query = nullptr;  // the query rows
    int max_pages = 0;
  };

  // A launch plan kept on the device (launch_plans.h): the bytes of a
  // launch's StagingLayout up to its windows, and what the launch needs
  // besides them.
  struct KeptPlan {
    Scratch dev;
    StagingLayout layout{0, 0, 0, 0, 0, 1};
    cuda_backend::ClientLaunch client;
    std::vector<int> slot_of;
    int max_pages = 0;
  };

  // Host queries into the staging's query rows, each checked as it is
  // staged when asked (the gather checks those it reads in client memory).
  static void StageHostQueries(absl::Span<AttendJob> jobs, size_t row_floats, uint8_t* rows) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].query_dev != nullptr) continue;
      std::memcpy(rows + i * row_floats * 4, jobs[i].query, sizeof(float) * row_floats);
      if (jobs[i].check_query) jobs[i].query_bad = FirstNonFinite(jobs[i].query, v1::DTYPE_F32, row_floats);
    }
  }

  // The output buffers and workspace of a launch of these jobs.
  absl::Status ReserveOutputs(int items, int q_heads, int max_pages, size_t stage_bytes) {
    const size_t qsz = static_cast<size_t>(items) * q_heads * layout_.head_dim;
    const size_t out_bytes = (qsz + static_cast<size_t>(items) * q_heads) * 4;
    absl::Status st = a_stage_.Reserve(stage_bytes);
    if (st.ok()) st = host_stage_.Reserve(stage_bytes);
    if (st.ok()) st = a_out_.Reserve(out_bytes);
    if (st.ok()) st = host_out_.Reserve(out_bytes);
    if (st.ok())
      st = a_ws_.Reserve(gpu::AttentionWorkspaceBytes(items, q_heads, layout_.head_dim, std::max(max_pages, 1)));
    return st;
  }

  // A launch whose plan the device already holds: only host queries go
  // up, and the window slots it names were checked by WindowCache::Keep.
  absl::Status AttendKept(absl::Span<AttendJob> jobs, const KeptPlan& kept) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const StagingLayout& stage = kept.layout;
    const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads;
    absl::Status st = ReserveOutputs(items, q_heads, kept.max_pages, stage.bytes);
    if (!st.ok()) return st;
    uint8_t* h = host_stage_.get<uint8_t>();
    uint8_t* dstage = a_stage_.get<uint8_t>();
    const bool host_queries = !cuda_backend::ClientIo::AllQueries(jobs);
    if (host_queries) StageHostQueries(jobs, static_cast<size_t>(q_heads) * layout_.head_dim, h + stage.query);
    AttendPhaseClock::Mark(AttendPhase::kBackendPlan);
    timer_.Mark(cuda_backend::StageTimer::kStart, stream_);
    if (host_queries) {
      st = Cuda(cudaMemcpyAsync(dstage + stage.query, h + stage.query, stage.bytes - stage.query,
                                cudaMemcpyHostToDevice, stream_),
                "upload queries");
    }
    timer_.Mark(cuda_backend::StageTimer::kUploaded, stream_);
    LaunchInputs in;
    in.plan = kept.dev.get<uint8_t>();
    in.layout = &stage;
    in.client = &kept.client;
    in.window_keys = windows_.keys_dev();
    in.window_values = windows_.values_dev();
    in.query = reinterpret_cast<float*>(dstage + stage.query);
    in.max_pages = kept.max_pages;
    if (st.ok()) st = client_io_.GatherQueries(*in.client, in.plan + stage.client, in.query, stream_);
    if (!st.ok()) return st;
    return RunAttention(jobs, in);
  }

  // A launch planned from its jobs. When its windows are all on the device
  // already, its plan is recorded and uploaded into a kept plan's memory
  // (the queries, when on the host, into the staging), so that the next
  // launch of the same jobs finds it (AttendKept).
  absl::Status AttendPlanned(absl::Span<AttendJob> jobs) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads, d = layout_.head_dim, n = layout_.n();
    const int P = pool_.page_tokens();
    // Per-call arrays, kept in members for their capacity.
    std::vector<int32_t>& table = plan_.table;
    std::vector<int32_t>& start = plan_.start;
    std::vector<int32_t>& tokens = plan_.tokens;
    std::vector<int32_t>& wtok = plan_.wtok;
    std::vector<int32_t>& layers = plan_.layers;
    table.clear();
    start.resize(items);
    tokens.resize(items);
    wtok.resize(items);
    layers.resize(items);
    size_t entries = 0;
    for (const AttendJob& j : jobs) entries += j.pages.size();
    table.reserve(entries);
    int max_pages = 0;
    for (int i = 0; i < items; ++i) {
      const AttendJob& j = jobs[i];
      absl::Status lst = CheckLayer(j.layer);
      if (!lst.ok()) return lst;
      layers[i] = j.layer;
      if (j.window.tokens > gpu::kMaxWindow) {
        return absl::InvalidArgumentError(
            absl::StrCat("bf16 window of ", j.window.tokens, " tokens exceeds ", gpu::kMaxWindow));
      }
      start[i] = static_cast<int32_t>(table.size());
      const size_t at = table.size();
      table.resize(at + j.pages.size());
      for (size_t k = 0; k < j.pages.size(); ++k) table[at + k] = static_cast<int32_t>(j.pages[k] - base_);
      tokens[i] = static_cast<int32_t>(j.pages.size()) * P;
      wtok[i] = static_cast<int32_t>(j.window.tokens);
      max_pages = std::max(max_pages, static_cast<int>(j.pages.size()));
    }
    // Everything the launch reads from the host goes through one staging
    // buffer (StagingLayout). Windows: device slots (only missing tokens are
    // uploaded), or, when the launch cannot be cached, all of them staged
    // back to back.
    std::vector<int32_t>& wstart = plan_.wstart;
    std::vector<int>& slot_of = plan_.slot_of;
    std::vector<cuda_backend::WindowCache::Upload>& uploads = plan_.uploads;
    wstart.resize(items);
    slot_of.clear();
    uploads.clear();
    const bool cached = windows_.Plan(jobs, &slot_of, &uploads);
    size_t total_w = 0;
    // Cached windows' missing tokens: a few ride in the staging upload,
    // many go through window_upload_'s ring.
    bool staged_uploads = false;
    if (cached) {
      for (int i = 0; i < items; ++i) wstart[i] = slot_of[i] < 0 ? 0 : slot_of[i] * gpu::kMaxWindow;
      staged_uploads = !uploads.empty() && window_upload_.Bytes(uploads) <= kStagedWindowBytes;
      if (staged_uploads) {
        for (const cuda_backend::WindowCache::Upload& u : uploads) total_w += static_cast<size_t>(u.count);
      }
    } else {
      for (int i = 0; i < items; ++i) {
        wstart[i] = static_cast<int32_t>(total_w);
        total_w += static_cast<size_t>(wtok[i]);
      }
    }
    const size_t qsz = static_cast<size_t>(items) * q_heads * d;
    // Client tensors' item lists travel in the same upload.
    absl::Status st = client_io_.Plan(jobs, q_heads * d, &client_launch_);
    if (!st.ok()) return st;
    const StagingLayout stage(items, table.size(), client_launch_.bytes(), qsz, total_w, n);
    const size_t off_table = stage.table, off_client = stage.client, off_query = stage.query,
                 off_wk = stage.window_keys;
    const size_t off_wv = stage.window_values, stage_bytes = stage.bytes;
    st = ReserveOutputs(items, q_heads, max_pages, stage_bytes);
    if (!st.ok()) return st;
    uint8_t* h = host_stage_.get<uint8_t>();
    int32_t* hs = reinterpret_cast<int32_t*>(h);
    std::memcpy(hs, start.data(), items * 4);
    std::memcpy(hs + items, tokens.data(), items * 4);
    std::memcpy(hs + 2 * items, wtok.data(), items * 4);
    std::memcpy(hs + 3 * items, layers.data(), items * 4);
    std::memcpy(hs + 4 * items, wstart.data(), items * 4);
    std::memcpy(h + off_table, table.data(), table.size() * 4);
    cuda_backend::ClientIo::Stage(client_launch_, h + off_client);
    StageHostQueries(jobs, static_cast<size_t>(q_heads) * d, h + off_query);
    for (int i = 0; !cached && i < items; ++i) {
      const size_t wn = static_cast<size_t>(wtok[i]) * n;
      if (wn == 0) continue;
      std::memcpy(h + off_wk + static_cast<size_t>(wstart[i]) * n * 2, jobs[i].window.keys, wn * 2);
      std::memcpy(h + off_wv + static_cast<size_t>(wstart[i]) * n * 2, jobs[i].window.values, wn * 2);
    }
    if (staged_uploads) window_upload_.Pack(jobs, uploads, h + off_wk);
    uint8_t* dstage = a_stage_.get<uint8_t>();
    const bool host_queries = !cuda_backend::ClientIo::AllQueries(jobs);
    // A plan worth keeping: every window already in its slot.
    KeptPlan* kept = nullptr;
    if (cached && uploads.empty()) {
      const int e = plans_.Record(jobs);
      if (e >= 0) {
        kept = &kept_[e];
        st = kept->dev.Reserve(off_wk);
        if (!st.ok()) {
          plans_.Forget(e);
          return st;
        }
        kept->layout = stage;
        kept->client = client_launch_;
        kept->slot_of = slot_of;
        kept->max_pages = max_pages;
      }
    }
    const uint8_t* plan_dev = kept != nullptr ? kept->dev.get<uint8_t>() : dstage;
    AttendPhaseClock::Mark(AttendPhase::kBackendPlan);
    timer_.Mark(cuda_backend::StageTimer::kStart, stream_);
    if (kept != nullptr) {
      st = Cuda(cudaMemcpyAsync(kept->dev.get<void>(), h, off_wk, cudaMemcpyHostToDevice, stream_), "upload plan");
      if (st.ok() && host_queries) {
        st = Cuda(cudaMemcpyAsync(dstage + off_query, h + off_query, stage_bytes - off_query, cudaMemcpyHostToDevice,
                                  stream_),
                  "upload queries");
      }
    } else {
      // Every query in client memory: the query rows are gathered below.
      const size_t used = host_queries ? stage_bytes : off_query;
      st = Cuda(cudaMemcpyAsync(dstage, h, used, cudaMemcpyHostToDevice, stream_), "upload attention inputs");
    }
    timer_.Mark(cuda_backend::StageTimer::kUploaded, stream_);
    LaunchInputs in;
    in.plan = plan_dev;
    in.layout = &stage;
    in.client = &client_launch_;
    in.window_keys = cached ? windows_.keys_dev() : dstage + off_wk;
    in.window_values = cached ? windows_.values_dev() : dstage + off_wv;
    in.query = reinterpret_cast<float*>(dstage + off_query);
    in.max_pages = max_pages;
    if (st.ok()) st = client_io_.GatherQueries(client_launch_, plan_dev + off_client, in.query, stream_);
    if (!st.ok()) return st;
    // A failure here leaves slots without their tokens: AttendRun forgets
    // the cache.
    if (staged_uploads) {
      st = window_upload_.Scatter(uploads, windows_, dstage + off_wk, stream_);
    } else if (cached && !uploads.empty()) {
      st = window_upload_.Upload(jobs, uploads, windows_, stream_);
    }
    if (!st.ok()) return st;
    return RunAttention(jobs, in);
  }

  // The attention kernels of a launch whose inputs are queued (`in`), its
  // outputs to the client or back to the host, and the wait for them.
  absl::Status RunAttention(absl::Span<AttendJob> jobs, const LaunchInputs& in) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int items = static_cast<int>(jobs.size()), q_heads = jobs[0].q_heads, d = layout_.head_dim;
    const size_t qsz = static_cast<size_t>(items) * q_heads * d;
    const size_t out_bytes = (qsz + static_cast<size_t>(items) * q_heads) * 4;
    timer_.Mark(cuda_backend::StageTimer::kInputsDone, stream_);
    const int32_t* small = reinterpret_cast<const int32_t*>(in.plan);
    const bool hot = jobs[0].hot;
    if (hot && hot_pool_ == nullptr) return absl::FailedPreconditionError("hot job without a hot tier");
    // One batch for whichever kernel the pages need.
    gpu::AttentionBatch batch;
    batch.items = items;
    batch.q_heads = q_heads;
    batch.max_pages = in.max_pages;
    batch.page_table_dev = reinterpret_cast<const int32_t*>(in.plan + in.layout->table);
    batch.page_start_dev = small;
    batch.tokens_dev = small + items;
    batch.window_tokens_dev = small + 2 * items;
    batch.window_start_dev = small + 4 * items;
    batch.window_k_dev = reinterpret_cast<const uint16_t*>(in.window_keys);
    batch.window_v_dev = reinterpret_cast<const uint16_t*>(in.window_values);
    batch.query_dev = in.query;
    batch.softmax_scale = jobs[0].softmax_scale;
    batch.out_dev = a_out_.get<float>();
    batch.lse_dev = a_out_.get<float>() + qsz;
    batch.out_targets_dev = cuda_backend::ClientIo::Targets(*in.client, in.plan + in.layout->client);
    batch.workspace_dev = a_ws_.get<void>();
    if (transforms_ != nullptr) {
      batch.transforms_dev = transforms_dev_.get<float>();
      batch.transform_layers = transforms_->layers;
      batch.layer_dev = small + 3 * items;
      batch.values_folded = values_folded_;
    }
    absl::Status st;
    if (hot) {
      gpu::LevelAttentionParams hp;
      hp.batch = batch;
      hp.pool_dev = static_cast<const uint8_t*>(hot_arena_);
      hp.layout = hot_layout_;
      hp.split_done = timer_.Event(cuda_backend::StageTimer::kSplitDone);
      st = gpu::LaunchLevelAttention(hp, stream_);
    } else {
      gpu::DQuantAttentionParams p;
      p.batch = batch;
      p.pool_dev = static_cast<const uint8_t*>(arena_);
      p.layout = layout_;
      p.tables_dev = tables_.get<uint32_t>();
      st = gpu::LaunchDQuantAttention(p, stream_);
    }
    if (!st.ok()) return st;
    timer_.Mark(cuda_backend::StageTimer::kAttentionDone, stream_);
    if (!cuda_backend::ClientIo::AllOutputs(jobs)) {
      st = Cuda(cudaMemcpyAsync(host_out_.get<void>(), a_out_.get<void>(), out_bytes, cudaMemcpyDeviceToHost, stream_),
                "download output");
    }
    const float* out = host_out_.get<float>();
    timer_.Mark(cuda_backend::StageTimer::kOutputsDone, stream_);
    AttendPhaseClock::Mark(AttendPhase::kBackendHost);
    if (st.ok()) st = Cuda(cudaStreamSynchronize(stream_), "attention");
    AttendPhaseClock::Mark(AttendPhase::kDeviceWait);
    if (!st.ok()) return st;
    timer_.Collect();
    client_io_.FinishQueryChecks(*in.client, jobs);
    for (int i = 0; i < items; ++i) {
      jobs[i].status = absl::OkStatus();
      if (jobs[i].out_dev != nullptr) continue;
      std::memcpy(jobs[i].out, out + static_cast<size_t>(i) * q_heads * d, sizeof(float) * q_heads * d);
      std::memcpy(jobs[i].lse, out + qsz + static_cast<size_t>(i) * q_heads, sizeof(float) * q_heads);
    }
    return absl::OkStatus();
  }

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
  bool host_registered_ = false;  // the host arena is page-locked
  absl::Mutex mu_;
  Scratch transforms_dev_, tables_, keys_in_, values_in_, pages_, stats_;
  Scratch a_stage_, a_out_, a_ws_;
  // CheckStaged runs on its own stream under its own lock.
  absl::Mutex check_mu_;
  cudaStream_t check_stream_ = nullptr;
  Scratch bad_ ABSL_GUARDED_BY(check_mu_);
  cuda_backend::WindowCache windows_;           // bf16 windows kept on the device
  cuda_backend::WindowUploader window_upload_;  // their missing tokens' way in
  cuda_backend::ClientIo client_io_ ABSL_GUARDED_BY(mu_);
  // AttendRunLocked's arrays (see there).
  struct LaunchPlan {
    std::vector<int32_t> table, start, tokens, wtok, layers, wstart;
    std::vector<int> slot_of;
    std::vector<cuda_backend::WindowCache::Upload> uploads;
  };
  LaunchPlan plan_ ABSL_GUARDED_BY(mu_);
  cuda_backend::ClientLaunch client_launch_ ABSL_GUARDED_BY(mu_);  // AttendPlanned's
  // Launch plans kept on the device, entry e's in kept_[e].
  cuda_backend::LaunchPlans plans_ ABSL_GUARDED_BY(mu_){KeptPlanCapacity()};
  std::vector<KeptPlan> kept_ ABSL_GUARDED_BY(mu_){static_cast<size_t>(plans_.capacity())};
  PinnedScratch host_stage_, host_out_;
  cuda_backend::StageTimer timer_ ABSL_GUARDED_BY(mu_);
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
