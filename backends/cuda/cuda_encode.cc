// Encoding on the device (kernels/encode.h), device ingest (DEVICE INGEST
// in backends/backend.h: staging buffers are device memory of this GPU,
// values checked and rounded to bf16 by kernels/ingest.h and encoded from
// there), and the host arena's mirror of the pages encoded.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/cuda/cuda_backend_impl.h"
#include "kernels/ingest.h"
#include "kernels/transform.h"
#include "wire/half.h"
#include "wire/tensor.h"

namespace driftkv {
namespace cuda_backend {
namespace {

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

}  // namespace

absl::Status CudaBackend::EncodePages(absl::Span<EncodeJob> jobs) {
  if (jobs.empty()) return absl::OkStatus();
  for (const EncodeJob& j : jobs) {
    absl::Status st = CheckLayer(j.layer);
    if (!st.ok()) return st;
  }
  absl::ReleasableMutexLock lock(&mu_);
  cudaSetDevice(device_);  // the calling RPC thread's current device
  absl::Status st = UploadJobsLocked(jobs);
  if (st.ok()) st = EnqueueEncodeLocked(keys_in_.get<float>(), values_in_.get<float>(), jobs);
  if (st.ok()) st = FinishEncodeLocked(jobs);
  lock.Release();
  if (st.ok()) st = MirrorPages(jobs);
  return st;
}

absl::Status CudaBackend::UploadJobsLocked(absl::Span<const EncodeJob> jobs) {
  const size_t page_floats = static_cast<size_t>(pool_.page_tokens()) * layout_.n();
  const size_t in_bytes = jobs.size() * page_floats * sizeof(float);
  absl::Status st = keys_in_.Reserve(in_bytes);
  if (st.ok()) st = values_in_.Reserve(in_bytes);
  for (size_t j = 0; j < jobs.size() && st.ok(); ++j) {
    st = Cuda(cudaMemcpyAsync(keys_in_.get<float>() + j * page_floats, jobs[j].keys, page_floats * sizeof(float),
                              cudaMemcpyHostToDevice, stream_),
              "upload keys");
    if (st.ok()) {
      st = Cuda(cudaMemcpyAsync(values_in_.get<float>() + j * page_floats, jobs[j].values, page_floats * sizeof(float),
                                cudaMemcpyHostToDevice, stream_),
                "upload values");
    }
  }
  return st;
}

absl::StatusOr<std::unique_ptr<StagingBuffer>> CudaBackend::AllocateStaging(size_t bytes) {
  auto buffer = std::make_unique<DeviceStaging>(device_);
  absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (st.ok()) st = Cuda(cudaMalloc(&buffer->ptr, bytes), "cudaMalloc (staging)");
  if (!st.ok()) return st;
  buffer->size = bytes;
  return std::unique_ptr<StagingBuffer>(std::move(buffer));
}

absl::Status CudaBackend::CopyStagedToHost(const StagedTokens& t, int n, int64_t count, float* keys, float* values) {
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

absl::Status CudaBackend::CheckStaged(const StagedTokens& t, int n, float limit) {
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

absl::Status CudaBackend::EncodeStaged(const StagedTokens& t, int n, int page_tokens, int64_t skip, int64_t fresh,
                                       absl::Span<const uint16_t> prefix_keys, absl::Span<const uint16_t> prefix_values,
                                       absl::Span<EncodeJob> jobs, std::vector<uint16_t>* tail_keys,
                                       std::vector<uint16_t>* tail_values) {
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
  if (st.ok() && !jobs.empty()) st = EnqueueEncodeLocked(keys_in_.get<float>(), values_in_.get<float>(), jobs);
  if (st.ok() && !jobs.empty()) st = FinishEncodeLocked(jobs);
  if (!st.ok()) return st;
  // The window: the tokens after the pages, back to the host as bf16.
  const size_t rest = (total - encoded) * n;
  std::vector<float> rk(rest), rv(rest);
  if (rest > 0) {
    st =
        Cuda(cudaMemcpyAsync(rk.data(), keys_in_.get<float>() + encoded * n, rest * 4, cudaMemcpyDeviceToHost, stream_),
             "download window keys");
    if (st.ok())
      st = Cuda(
          cudaMemcpyAsync(rv.data(), values_in_.get<float>() + encoded * n, rest * 4, cudaMemcpyDeviceToHost, stream_),
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

absl::Status CudaBackend::MirrorPages(absl::Span<const EncodeJob> jobs) {
  std::vector<PageId> pages;
  for (const EncodeJob& j : jobs) pages.push_back(j.page);
  absl::Status st = Cuda(cudaSetDevice(device_), "cudaSetDevice");
  if (st.ok()) st = EnqueueMirror(std::move(pages), cudaStreamPerThread);
  if (st.ok() && !jobs.empty()) st = Cuda(cudaStreamSynchronize(cudaStreamPerThread), "download pages");
  return st;
}

absl::Status CudaBackend::EnqueueMirror(std::vector<PageId> pages, cudaStream_t stream) {
  std::sort(pages.begin(), pages.end());
  for (size_t j = 0; j < pages.size();) {
    size_t end = j + 1;
    while (end < pages.size() && pages[end] == pages[end - 1] + 1) ++end;
    const size_t offset = static_cast<size_t>(pages[j] - base_) * layout_.page_bytes;
    absl::Status st = Cuda(cudaMemcpyAsync(pool_.key_records(pages[j]), static_cast<uint8_t*>(arena_) + offset,
                                           (end - j) * layout_.page_bytes, cudaMemcpyDeviceToHost, stream),
                           "download pages");
    if (!st.ok()) return st;
    j = end;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::EnqueueEncodeLocked(float* keys_dev, float* values_dev, absl::Span<const EncodeJob> jobs) {
  const int P = pool_.page_tokens();
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
  return gpu::LaunchEncode(ep, stream_);
}

absl::Status CudaBackend::FinishEncodeLocked(absl::Span<EncodeJob> jobs) {
  const int P = pool_.page_tokens(), n = layout_.n();
  const int tokens = static_cast<int>(jobs.size()) * P;
  std::vector<gpu::EncodeStreamStats> stats(2 * tokens);
  absl::Status st = Cuda(cudaMemcpyAsync(stats.data(), stats_.get<void>(), stats.size() * sizeof(stats[0]),
                                         cudaMemcpyDeviceToHost, stream_),
                         "download stats");
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
        util[t] =
            static_cast<float>(s.bytes_used) / (kind == 0 ? encode_.keys.payload_bytes : encode_.values.payload_bytes);
      }
    }
    jobs[j].stats = cs;
  }
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
