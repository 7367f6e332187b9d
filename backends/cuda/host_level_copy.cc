// HostLevelCopy (backends/cuda/host_level_copy.h).
#include "backends/cuda/host_level_copy.h"

#include <algorithm>

#include "kernels/page_copy.h"
#include "kernels/page_crc.h"

namespace driftkv {
namespace cuda_backend {
namespace {

uint8_t* PageOf(const DeviceArena& a, uint8_t* base, PageId p) {
  return base + static_cast<size_t>(p - a.base) * a.page_bytes;
}

}  // namespace

absl::Status HostLevelCopy::Upload(size_t words, size_t reserve_words, cudaStream_t stream) {
  absl::Status st = scratch_.Reserve(reserve_words * 8);
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(scratch_.get<void>(), staging_.get<void>(), words * 8, cudaMemcpyHostToDevice, stream),
              "upload the host level's page addresses");
  }
  return st;
}

absl::Status HostLevelCopy::Warm(size_t pages, cudaStream_t stream) {
  const size_t words = std::max<size_t>(3 * pages + 2 * ((pages + 1) / 2), 16);
  absl::Status st = staging_.Reserve(words * 8);
  if (st.ok()) st = scratch_.Reserve(words * 8);
  if (!st.ok()) return st;
  // Words 0-2: a one-page copy's source and destination and a page index
  // 0; bytes 64-79 are copied to 80-95 and summed into word 12.
  uint8_t* base = scratch_.get<uint8_t>();
  uint8_t** table = staging_.get<uint8_t*>();
  table[0] = base + 64;
  table[1] = base + 80;
  table[2] = nullptr;  // two int32 page indices of 0
  st = Upload(3, words, stream);
  gpu::PageCopyParams c;
  c.src_dev = scratch_.get<const uint8_t*>();
  c.dst_dev = scratch_.get<uint8_t*>() + 1;
  c.page_bytes = 16;
  c.pages = 1;
  if (st.ok()) st = gpu::LaunchPageCopy(c, stream);
  gpu::PageCrcParams k;
  k.arena_dev = base + 64;
  k.page_bytes = 16;
  k.pages_dev = reinterpret_cast<const int32_t*>(base + 16);
  k.pages = 1;
  k.sums_dev = reinterpret_cast<uint32_t*>(base + 96);
  if (st.ok()) st = gpu::LaunchPageCrc(k, stream);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream), "warm the host level's copies");
  return st;
}

absl::Status HostLevelCopy::ToHost(const DeviceArena& a, absl::Span<const PageId> pages, absl::Span<uint8_t* const> dst,
                                   cudaStream_t stream) {
  const size_t n = pages.size();
  if (n == 0) return absl::OkStatus();
  absl::Status st = staging_.Reserve(2 * n * 8);
  if (!st.ok()) return st;
  const uint8_t** src = staging_.get<const uint8_t*>();
  uint8_t** to = staging_.get<uint8_t*>() + n;
  for (size_t i = 0; i < n; ++i) {
    src[i] = PageOf(a, a.dev, pages[i]);
    to[i] = dst[i];
  }
  st = Upload(2 * n, 2 * n, stream);
  gpu::PageCopyParams p;
  p.src_dev = scratch_.get<const uint8_t*>();
  p.dst_dev = scratch_.get<uint8_t*>() + n;
  p.page_bytes = a.page_bytes;
  p.pages = static_cast<int>(n);
  if (st.ok()) st = gpu::LaunchPageCopy(p, stream);
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream), "pages to the host level");
  return st;
}

absl::Status HostLevelCopy::FromHost(const DeviceArena& a, absl::Span<const uint8_t* const> src,
                                     absl::Span<const PageId> pages, uint32_t* sums, cudaStream_t stream) {
  const size_t n = pages.size();
  if (n == 0) return absl::OkStatus();
  // Words: sources, destinations, mirrors, then the page indices as
  // int32 (two a word) and room for the sums.
  const size_t id_words = (n + 1) / 2;
  const size_t words = 3 * n + 2 * id_words;
  absl::Status st = staging_.Reserve(words * 8);
  if (!st.ok()) return st;
  const uint8_t** from = staging_.get<const uint8_t*>();
  uint8_t** to = staging_.get<uint8_t*>() + n;
  uint8_t** mirror = staging_.get<uint8_t*>() + 2 * n;
  int32_t* ids = reinterpret_cast<int32_t*>(staging_.get<uint8_t*>() + 3 * n);
  for (size_t i = 0; i < n; ++i) {
    from[i] = src[i];
    to[i] = PageOf(a, a.dev, pages[i]);
    mirror[i] = a.mirror != nullptr ? PageOf(a, a.mirror, pages[i]) : nullptr;
    ids[i] = static_cast<int32_t>(pages[i] - a.base);
  }
  st = Upload(3 * n + id_words, words, stream);
  gpu::PageCopyParams c;
  c.src_dev = scratch_.get<const uint8_t*>();
  c.dst_dev = scratch_.get<uint8_t*>() + n;
  c.mirror_dev = a.mirror != nullptr ? scratch_.get<uint8_t*>() + 2 * n : nullptr;
  c.page_bytes = a.page_bytes;
  c.pages = static_cast<int>(n);
  if (st.ok()) st = gpu::LaunchPageCopy(c, stream);
  gpu::PageCrcParams k;
  k.arena_dev = a.dev;
  k.page_bytes = a.page_bytes;
  k.pages_dev = reinterpret_cast<const int32_t*>(scratch_.get<uint8_t*>() + 3 * n);
  k.pages = static_cast<int>(n);
  k.sums_dev = reinterpret_cast<uint32_t*>(scratch_.get<uint8_t*>() + 3 * n + id_words);
  if (st.ok()) st = gpu::LaunchPageCrc(k, stream);
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(sums, k.sums_dev, n * 4, cudaMemcpyDeviceToHost, stream),
              "download the restored pages' checksums");
  }
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream), "pages from the host level");
  return st;
}

}  // namespace cuda_backend
}  // namespace driftkv
