#include "backends/cuda/window_upload.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

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

absl::Status WindowUploader::Init(int n) {
  n_ = n;
  // One upload's keys and values (a whole window at most) fit in a half.
  half_bytes_ = std::max(kMinHalfBytes, size_t{2} * gpu::kMaxWindow * static_cast<size_t>(n) * 2);
  absl::Status st = host_.Reserve(2 * half_bytes_);
  if (st.ok()) st = device_.Reserve(2 * half_bytes_);
  for (cudaEvent_t& e : sent_) {
    if (st.ok()) st = Cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (window ring)");
  }
  return st;
}

absl::Status WindowUploader::Upload(absl::Span<const AttendJob> jobs, absl::Span<const WindowCache::Upload> uploads,
                                    const WindowCache& cache, cudaStream_t stream) {
  const size_t token_bytes = static_cast<size_t>(n_) * 2, slot_bytes = cache.slot_bytes();
  int half = 0, rounds = 0;
  size_t at = 0;  // bytes packed into the current half
  gpu::CopySegmentsParams seg;
  // Sends the current half: its copy, then its scatter; the next half is
  // free once its previous copy (two rounds back) has been read.
  auto send = [&](bool more) -> absl::Status {
    uint8_t* host = host_.get<uint8_t>() + half * half_bytes_;
    uint8_t* dev = device_.get<uint8_t>() + half * half_bytes_;
    absl::Status st = Cuda(cudaMemcpyAsync(dev, host, at, cudaMemcpyHostToDevice, stream), "upload window tokens");
    if (st.ok() && more) st = Cuda(cudaEventRecord(sent_[half], stream), "cudaEventRecord (window ring)");
    if (st.ok()) st = gpu::LaunchCopySegments(seg, stream);
    seg.count = 0;
    at = 0;
    half ^= 1;
    if (st.ok() && more && ++rounds >= 2) st = Cuda(cudaEventSynchronize(sent_[half]), "window ring");
    return st;
  };
  for (const WindowCache::Upload& u : uploads) {
    const size_t bytes = static_cast<size_t>(u.count) * token_bytes;
    if (at + 2 * bytes > half_bytes_ || seg.count + 2 > gpu::kMaxCopySegments) {
      absl::Status st = send(true);
      if (!st.ok()) return st;
    }
    uint8_t* host = host_.get<uint8_t>() + half * half_bytes_;
    uint8_t* dev = device_.get<uint8_t>() + half * half_bytes_;
    const size_t src = static_cast<size_t>(u.from) * n_;
    const size_t dst = static_cast<size_t>(u.slot) * slot_bytes + static_cast<size_t>(u.from) * token_bytes;
    std::memcpy(host + at, jobs[u.item].window.keys + src, bytes);
    seg.segments[seg.count++] = {dev + at, cache.keys_dev() + dst, static_cast<uint32_t>(bytes)};
    at += bytes;
    std::memcpy(host + at, jobs[u.item].window.values + src, bytes);
    seg.segments[seg.count++] = {dev + at, cache.values_dev() + dst, static_cast<uint32_t>(bytes)};
    at += bytes;
  }
  return at > 0 ? send(false) : absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
