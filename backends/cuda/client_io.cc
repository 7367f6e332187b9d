#include "backends/cuda/client_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace cuda_backend {

bool ClientIo::AnyQuery(absl::Span<const AttendJob> jobs) {
  return std::any_of(jobs.begin(), jobs.end(), [](const AttendJob& j) { return j.query_dev != nullptr; });
}
bool ClientIo::AllQueries(absl::Span<const AttendJob> jobs) {
  return std::all_of(jobs.begin(), jobs.end(), [](const AttendJob& j) { return j.query_dev != nullptr; });
}
bool ClientIo::AnyOutput(absl::Span<const AttendJob> jobs) {
  return std::any_of(jobs.begin(), jobs.end(), [](const AttendJob& j) { return j.out_dev != nullptr; });
}
bool ClientIo::AllOutputs(absl::Span<const AttendJob> jobs) {
  return std::all_of(jobs.begin(), jobs.end(), [](const AttendJob& j) { return j.out_dev != nullptr; });
}

absl::StatusOr<const gpu::RegionIoItem*> ClientIo::Upload(const std::vector<gpu::RegionIoItem>& items,
                                                          cudaStream_t stream) {
  const size_t bytes = items.size() * sizeof(gpu::RegionIoItem);
  absl::Status st = host_items_.Reserve(bytes);
  if (st.ok()) st = items_dev_.Reserve(bytes);
  if (!st.ok()) return st;
  std::memcpy(host_items_.get<void>(), items.data(), bytes);
  st = Cuda(cudaMemcpyAsync(items_dev_.get<void>(), host_items_.get<void>(), bytes, cudaMemcpyHostToDevice, stream),
            "upload client tensor list");
  if (!st.ok()) return st;
  return items_dev_.get<const gpu::RegionIoItem>();
}

absl::StatusOr<size_t> ClientIo::Plan(absl::Span<const AttendJob> jobs, int stride) {
  gather_.clear();
  scatter_.clear();
  checked_.clear();
  stride_ = stride;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].query_dev != nullptr) {
      gpu::RegionIoItem io;
      io.src = jobs[i].query_dev;
      io.src_dtype = jobs[i].query_dtype;
      io.row = static_cast<int>(i);
      io.elements = stride;
      gather_.push_back(io);
      checked_.push_back(jobs[i].check_query ? static_cast<int>(i) : -1);
    }
    if (jobs[i].out_dev != nullptr) {
      gpu::RegionIoItem io;
      io.dst = jobs[i].out_dev;
      io.dst_dtype = jobs[i].out_dtype;
      io.lse = jobs[i].lse_dev;
      io.row = static_cast<int>(i);
      io.elements = stride;
      scatter_.push_back(io);
    }
  }
  check_ = std::any_of(checked_.begin(), checked_.end(), [](int j) { return j >= 0; });
  if (!check_) checked_.clear();
  auto align = [](size_t b) { return (b + 63) & ~static_cast<size_t>(63); };
  scatter_at_ = align(gather_.size() * sizeof(gpu::RegionIoItem));
  bad_at_ = scatter_at_ + align(scatter_.size() * sizeof(gpu::RegionIoItem));
  const size_t bytes = bad_at_ + (check_ ? gather_.size() * sizeof(int32_t) : 0);
  if (check_) {
    absl::Status st = host_query_bad_.Reserve(gather_.size() * sizeof(int32_t));
    if (!st.ok()) return st;
  }
  return gather_.empty() && scatter_.empty() ? 0 : bytes;
}

absl::StatusOr<size_t> ClientIo::Warm(int items) {
  const size_t n = static_cast<size_t>(items);
  absl::Status st = host_query_bad_.Reserve(n * sizeof(int32_t));
  if (!st.ok()) return st;
  auto align = [](size_t b) { return (b + 63) & ~static_cast<size_t>(63); };
  return 2 * align(n * sizeof(gpu::RegionIoItem)) + n * sizeof(int32_t);
}

void ClientIo::Stage(uint8_t* host) const {
  if (!gather_.empty()) std::memcpy(host, gather_.data(), gather_.size() * sizeof(gpu::RegionIoItem));
  if (!scatter_.empty()) std::memcpy(host + scatter_at_, scatter_.data(), scatter_.size() * sizeof(gpu::RegionIoItem));
  if (check_) {
    int32_t* bad = reinterpret_cast<int32_t*>(host + bad_at_);
    std::fill(bad, bad + gather_.size(), gpu::kNoBadElement);
  }
}

absl::Status ClientIo::GatherQueries(uint8_t* dev, float* query_dev, cudaStream_t stream) {
  if (gather_.empty()) return absl::OkStatus();
  gpu::GatherParams p;
  p.items_dev = reinterpret_cast<const gpu::RegionIoItem*>(dev);
  p.items = static_cast<int>(gather_.size());
  p.stride = stride_;
  p.dst_dev = query_dev;
  if (check_) {
    // The flags were uploaded set (Stage): no launch resets them.
    p.bad_dev = reinterpret_cast<int32_t*>(dev + bad_at_);
    p.bad_ready = true;
  }
  absl::Status st = gpu::LaunchGather(p, stream);
  if (st.ok() && check_) {
    st = Cuda(cudaMemcpyAsync(host_query_bad_.get<void>(), dev + bad_at_, gather_.size() * sizeof(int32_t),
                              cudaMemcpyDeviceToHost, stream),
              "download query checks");
  }
  return st;
}

void ClientIo::FinishQueryChecks(absl::Span<AttendJob> jobs) {
  const int32_t* bad = host_query_bad_.get<int32_t>();
  for (size_t k = 0; k < checked_.size(); ++k) {
    if (checked_[k] < 0) continue;
    jobs[checked_[k]].query_bad = bad[k] == gpu::kNoBadElement ? -1 : bad[k];
  }
  checked_.clear();
}

absl::Status ClientIo::ScatterOutputs(const uint8_t* dev, int q_heads, const float* out_dev, const float* lse_dev,
                                      cudaStream_t stream) {
  if (scatter_.empty()) return absl::OkStatus();
  gpu::ScatterParams p;
  p.items_dev = reinterpret_cast<const gpu::RegionIoItem*>(dev + scatter_at_);
  p.items = static_cast<int>(scatter_.size());
  p.stride = stride_;
  p.q_heads = q_heads;
  p.out_dev = out_dev;
  p.lse_dev = lse_dev;
  return gpu::LaunchScatter(p, stream);
}

absl::Status ClientIo::Read(absl::Span<ClientRead> reads, cudaStream_t stream) {
  if (reads.empty()) return absl::OkStatus();
  if (reads.size() > 65535)
    return absl::InvalidArgumentError(absl::StrCat(reads.size(), " client tensors in one read"));
  // Tensors wanted on the host (a decode step's key and value) take the
  // first rows, packed at their own stride, so that they come back in one
  // copy; the others (queries, only checked here: the attention launch
  // gathers them again) are checked without being written anywhere. The
  // bad-element flags follow the same order.
  const size_t n = reads.size();
  std::vector<gpu::RegionIoItem> items;
  items.reserve(n);
  std::vector<size_t> order;  // order[k]: the read behind items[k]
  order.reserve(n);
  int stride = 1;
  for (size_t i = 0; i < n; ++i) {
    if (reads[i].host == nullptr) continue;
    stride = std::max(stride, reads[i].elements);
    order.push_back(i);
  }
  const size_t wanted = order.size();
  for (size_t i = 0; i < n; ++i) {
    if (reads[i].host == nullptr) order.push_back(i);
  }
  for (size_t k = 0; k < n; ++k) {
    const ClientRead& r = reads[order[k]];
    gpu::RegionIoItem io;
    io.src = r.src_dev;
    io.src_dtype = r.dtype;
    io.row = static_cast<int>(k);
    io.elements = r.elements;
    items.push_back(io);
  }
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  absl::Status st = rows_dev_.Reserve(std::max<size_t>(wanted, 1) * row_bytes);
  if (st.ok()) st = host_rows_.Reserve(std::max<size_t>(wanted, 1) * row_bytes);
  if (st.ok()) st = bad_dev_.Reserve(n * sizeof(int32_t));
  if (st.ok()) st = host_bad_.Reserve(n * sizeof(int32_t));
  if (!st.ok()) return st;
  absl::StatusOr<const gpu::RegionIoItem*> dev = Upload(items, stream);
  if (!dev.ok()) return dev.status();
  if (wanted > 0) {
    gpu::GatherParams p;
    p.items_dev = *dev;
    p.items = static_cast<int>(wanted);
    p.stride = stride;
    p.dst_dev = rows_dev_.get<float>();
    p.bad_dev = bad_dev_.get<int32_t>();
    st = gpu::LaunchGather(p, stream);
  }
  if (st.ok() && wanted < n) {
    gpu::GatherParams p;
    p.items_dev = *dev + wanted;
    p.items = static_cast<int>(n - wanted);
    p.stride = 1;  // nothing is written
    p.dst_dev = nullptr;
    p.bad_dev = bad_dev_.get<int32_t>() + wanted;
    st = gpu::LaunchGather(p, stream);
  }
  if (st.ok()) {
    st = Cuda(cudaMemcpyAsync(host_bad_.get<void>(), bad_dev_.get<void>(), n * sizeof(int32_t), cudaMemcpyDeviceToHost,
                              stream),
              "download client tensor checks");
  }
  if (st.ok() && wanted > 0) {
    st = Cuda(cudaMemcpyAsync(host_rows_.get<void>(), rows_dev_.get<void>(), wanted * row_bytes, cudaMemcpyDeviceToHost,
                              stream),
              "download client tensors");
  }
  if (st.ok()) st = Cuda(cudaStreamSynchronize(stream), "client tensor read");
  if (!st.ok()) return st;
  const int32_t* bad = host_bad_.get<int32_t>();
  for (size_t k = 0; k < n; ++k) {
    ClientRead& r = reads[order[k]];
    r.bad = bad[k] == gpu::kNoBadElement ? -1 : bad[k];
    if (k < wanted) {
      std::memcpy(r.host, host_rows_.get<uint8_t>() + k * row_bytes, static_cast<size_t>(r.elements) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
