#include "backends/cuda/cuda_backend.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "backends/host_decode.h"
#include "kernels/attention.h"
#include "kernels/codec_bridge.h"
#include "kernels/page_crc.h"
#include "kernels/transform.h"

namespace driftkv {
namespace cuda_backend {

CudaBackend::~CudaBackend() {
  {
    // Whoever holds the last promotion's sums gets them before their
    // buffer and events go.
    absl::MutexLock lock(&mu_);
    if (pending_ != nullptr) pending_->Settle();
    pending_.reset();
  }
  if (sums_stream_ != nullptr) cudaStreamDestroy(sums_stream_);
  if (sums_promoted_ != nullptr) cudaEventDestroy(sums_promoted_);
  if (sums_done_ != nullptr) cudaEventDestroy(sums_done_);
  if (host_registered_) cudaHostUnregister(pool_.page(base_));
  cudaFree(arena_);
  cudaFree(hot_arena_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (check_stream_ != nullptr) cudaStreamDestroy(check_stream_);
}

absl::Status CudaBackend::Init() {
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
  if (st.ok() && hot_pool_ != nullptr) {
    st = Cuda(cudaStreamCreateWithFlags(&sums_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    if (st.ok()) st = Cuda(cudaEventCreateWithFlags(&sums_promoted_, cudaEventDisableTiming), "cudaEventCreate");
    if (st.ok()) st = Cuda(cudaEventCreateWithFlags(&sums_done_, cudaEventDisableTiming), "cudaEventCreate");
  }
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
  if (st.ok()) st = InitLevelPages();
  if (st.ok() && hot_pool_ != nullptr) st = InitHotTier();
  if (st.ok()) st = WarmBuffers();
  return st;
}

absl::Status CudaBackend::WarmBuffers() {
  absl::MutexLock lock(&mu_);  // uncontended: Init runs before the backend is shared
  cuda_backend::AttendDevice d;
  d.stream = stream_;
  d.layout = layout_;
  d.page_tokens = pool_.page_tokens();
  d.base = base_;
  d.arena = arena_;
  d.tables_dev = tables_.get<uint32_t>();
  d.hot_arena = hot_arena_;
  d.hot_base = hot_base_;
  d.hot_layout = hot_layout_;
  if (transforms_ != nullptr) {
    d.transforms_dev = transforms_dev_.get<float>();
    d.transform_layers = transforms_->layers;
  }
  d.values_folded = values_folded_;
  d.cold_promotion = PromoteBase();
  absl::Status st = launcher_.Init(d, window_cache_bytes_, hot_layout_.page_bytes > 0 ? cold_scratch_bytes_ : 0);
  const size_t pages = cuda_backend::kWarmTokens / pool_.page_tokens();
  if (st.ok() && hot_pool_ != nullptr) st = promote_ids_.Reserve(4 * 6 * cuda_backend::kWarmItems * pages);
  // The host level's copies, for a sequence of kWarmTokens in 64 layers.
  if (st.ok()) st = host_level_.Warm(64 * pages, stream_);
  return st;
}

absl::Status CudaBackend::UploadPages(absl::Span<const PageId> pages) {
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

absl::Status CudaBackend::PagesToHost(const PagePool& pool, absl::Span<const PageId> pages,
                                      absl::Span<uint8_t* const> dst) {
  if (&pool != &pool_) return Backend::PagesToHost(pool, pages, dst);
  if (absl::Status st = CheckOnArena(pages); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  return host_level_.ToHost(Arena(), pages, dst, stream_);
}

absl::Status CudaBackend::PagesFromHost(const PagePool& pool, absl::Span<const uint8_t* const> src,
                                        absl::Span<const PageId> pages, PageChecksum* sums) {
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

cuda_backend::DeviceArena CudaBackend::Arena() const {
  cuda_backend::DeviceArena a;
  a.dev = static_cast<uint8_t*>(arena_);
  a.mirror = host_mirror_dev_;
  a.base = base_;
  a.page_bytes = layout_.page_bytes;
  return a;
}

absl::Status CudaBackend::ChecksumPages(const PagePool& pool, absl::Span<const PageId> pages, PageChecksum* sums) {
  const bool cold = &pool == &pool_;
  if (!cold && (hot_pool_ == nullptr || &pool != hot_pool_)) return Backend::ChecksumPages(pool, pages, sums);
  if (pages.empty()) return absl::OkStatus();
  std::vector<int32_t> ids(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    if (absl::Status st = cold ? CheckOnArena(pages[i]) : CheckOnHotArena(pages[i]); !st.ok()) return st;
    ids[i] = static_cast<int32_t>(cold ? pages[i] - base_ : pages[i] - hot_base_);
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

absl::Status CudaBackend::InitTransforms() {
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

absl::Status CudaBackend::TransformOnDevice(float* x_dev, int rows, const int32_t* layer_dev, int rows_per_layer,
                                            int m) {
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

absl::Status CudaBackend::DecodeTokens(PageId page, int layer, int first, int count, float* keys, float* values) {
  absl::Status lst = CheckLayer(layer);
  if (!lst.ok()) return lst;
  // The host arena mirrors the device one: decode there, exactly as the CPU does.
  CodecScratch scratch;
  return DecodePageTokens(codec_, pool_, page, first, count,
                          transforms_ != nullptr ? &host_transforms_[layer] : nullptr, values_folded_, keys, values,
                          &scratch);
}

void CudaBackend::Attend(absl::Span<AttendJob> jobs) {
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

}  // namespace cuda_backend

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(const DQuantCodec* codec, const PagePool* pool, int device,
                                                         const TransformSet* transforms, bool values_folded,
                                                         size_t window_cache_bytes, const PagePool* hot_pool,
                                                         int partition, size_t cold_scratch_bytes) {
  if (!gpu::GpuAvailable()) return absl::FailedPreconditionError("no CUDA device is usable");
  if (partition < 0 || partition >= pool->partitions()) {
    return absl::InvalidArgumentError(absl::StrCat("partition ", partition, " of a pool of ", pool->partitions()));
  }
  if (hot_pool != nullptr && hot_pool->partitions() != pool->partitions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a hot pool of ", hot_pool->partitions(), " partitions beside a pool of ", pool->partitions()));
  }
  // With a hot tier, this device's partition of the hot pool too.
  const PageId hot_base = hot_pool != nullptr ? hot_pool->partition_begin(partition) : 0;
  const PageId hot_end = hot_pool != nullptr ? hot_pool->partition_begin(partition + 1) : 0;
  auto b = std::make_unique<cuda_backend::CudaBackend>(
      codec, pool, hot_pool, device, transforms, values_folded, window_cache_bytes, pool->partition_begin(partition),
      pool->partition_begin(partition + 1), hot_base, hot_end, cold_scratch_bytes);
  absl::Status st = b->Init();
  if (!st.ok()) return st;
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace driftkv
