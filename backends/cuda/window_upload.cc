#include "backends/cuda/window_upload.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/attention_batch.h"
#include "kernels/region_io.h"

namespace driftkv {
namespace cuda_backend {

namespace {
// A half's size when windows are small: an 8 KV head x 128 decode batch's
// windows fill 512 KiB a sequence, so 4 MiB a round keeps the rounds few.
constexpr size_t kMinHalfBytes = size_t{4} << 20;
}  // namespace

WindowUploader::~WindowUploader() {
  for (cudaEvent_t e : sent_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
}

absl::Status WindowUploader::Init(int n, int pack_threads) {
  n_ = n;
  pack_ = std::make_unique<ThreadPool>(std::max(1, pack_threads));
  // One upload's keys and values (a whole window at most) fit in a half.
  half_bytes_ = std::max(kMinHalfBytes, size_t{2} * gpu::kMaxWindow * static_cast<size_t>(n) * 2);
  absl::Status st = host_.Reserve(2 * half_bytes_);
  if (st.ok()) st = device_.Reserve(2 * half_bytes_);
  for (cudaEvent_t& e : sent_) {
    if (st.ok()) st = Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (window ring)");
  }
  return st;
}

size_t WindowUploader::Bytes(absl::Span<const WindowCache::Upload> uploads) const {
  size_t tokens = 0;
  for (const WindowCache::Upload& u : uploads) tokens += static_cast<size_t>(u.count);
  return 2 * tokens * static_cast<size_t>(n_) * 2;
}

void WindowUploader::Pack(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads,
                          uint8_t* host) const {
  for (const WindowCache::Upload& u : uploads) {
    const size_t bytes = static_cast<size_t>(u.count) * n_ * 2, src = static_cast<size_t>(u.from) * n_;
    std::memcpy(host, jobs[u.item].window.keys + src, bytes);
    std::memcpy(host + bytes, jobs[u.item].window.values + src, bytes);
    host += 2 * bytes;
  }
}

void WindowUploader::PackSpread(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads,
                                uint8_t* host) {
  if (uploads.size() < 2 || pack_->threads() < 2) return Pack(jobs, uploads, host);
  std::vector<size_t> at(uploads.size());
  size_t offset = 0;
  for (size_t k = 0; k < uploads.size(); ++k) {
    at[k] = offset;
    offset += Bytes(uploads.subspan(k, 1));
  }
  pack_->ParallelFor(static_cast<int>(uploads.size()), [&](int k) { Pack(jobs, uploads.subspan(k, 1), host + at[k]); });
}

absl::Status WindowUploader::Scatter(absl::Span<const WindowCache::Upload> uploads, const WindowCache& cache,
                                     const uint8_t* dev, cudaStream_t stream) const {
  const size_t token_bytes = static_cast<size_t>(n_) * 2, slot_bytes = cache.slot_bytes();
  gpu::CopySegmentsParams seg;
  for (size_t k = 0; k < uploads.size(); ++k) {
    const WindowCache::Upload& u = uploads[k];
    const size_t bytes = static_cast<size_t>(u.count) * token_bytes;
    const size_t dst = static_cast<size_t>(u.slot) * slot_bytes + static_cast<size_t>(u.from) * token_bytes;
    seg.segments[seg.count++] = {dev, cache.keys_dev() + dst, static_cast<uint32_t>(bytes)};
    seg.segments[seg.count++] = {dev + bytes, cache.values_dev() + dst, static_cast<uint32_t>(bytes)};
    dev += 2 * bytes;
    if (seg.count + 2 > gpu::kMaxCopySegments || k + 1 == uploads.size()) {
      absl::Status st = gpu::LaunchCopySegments(seg, stream);
      if (!st.ok()) return st;
      seg.count = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status WindowUploader::Upload(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads,
                                    const WindowCache& cache, cudaStream_t stream) {
  const size_t token_bytes = static_cast<size_t>(n_) * 2;
  int half = 0, rounds = 0;
  for (size_t begin = 0; begin < uploads.size();) {
    // This round: the uploads from `begin` whose keys and values fit in a
    // half (at least one: a whole window does).
    size_t end = begin, bytes = 0;
    while (end < uploads.size()) {
      const size_t b = 2 * static_cast<size_t>(uploads[end].count) * token_bytes;
      if (end > begin && bytes + b > half_bytes_) break;
      bytes += b;
      ++end;
    }
    if (bytes > half_bytes_) return absl::InternalError("window upload larger than a ring half");
    const bool more = end < uploads.size();
    uint8_t* host = host_.get<uint8_t>() + half * half_bytes_;
    uint8_t* dev = device_.get<uint8_t>() + half * half_bytes_;
    const absl::Span<const WindowCache::Upload> round = uploads.subspan(begin, end - begin);
    PackSpread(jobs, round, host);
    absl::Status st = Cuda(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream), "upload window tokens");
    // The host reuses this half two rounds on, once this copy has read it.
    if (st.ok() && more) st = Cuda(cudaEventRecord(sent_[half], stream), "cudaEventRecord (window ring)");
    if (st.ok()) st = Scatter(round, cache, dev, stream);
    if (!st.ok()) return st;
    half ^= 1;
    if (more && ++rounds >= 2) {
      st = Cuda(cudaEventSynchronize(sent_[half]), "window ring");
      if (!st.ok()) return st;
    }
    begin = end;
  }
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
