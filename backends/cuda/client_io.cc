#include "backends/cuda/client_io.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "wire/tensor.h"

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

namespace {
size_t Align64(size_t b) {
  return (b + 63) & ~static_cast<size_t>(63);
}
}  // namespace

size_t ClientLaunch::bytes() const {
  if (gather.empty() && targets.empty()) return 0;
  return targets_at + targets.size() * sizeof(gpu::OutputTarget);
}

absl::Status ClientIo::Plan(absl::Span<const AttendJob> jobs, int stride, ClientLaunch* launch) {
  launch->gather.clear();
  launch->checked.clear();
  launch->targets.clear();
  launch->stride = stride;
  bool check = false;
  if (AnyOutput(jobs)) launch->targets.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].query_dev != nullptr) {
      gpu::RegionIoItem io;
      io.src = jobs[i].query_dev;
      io.src_dtype = jobs[i].query_dtype;
      io.row = static_cast<int>(i);
      io.elements = stride;
      io.limit = kQueryLimit;
      launch->gather.push_back(io);
      launch->checked.push_back(jobs[i].check_query ? static_cast<int>(i) : -1);
      check = check || jobs[i].check_query;
    }
    if (jobs[i].out_dev != nullptr) {
      gpu::OutputTarget& t = launch->targets[i];
      t.out = jobs[i].out_dev;
      t.out_dtype = jobs[i].out_dtype;
      t.lse = jobs[i].lse_dev;
    }
  }
  if (!check) launch->checked.clear();
  launch->targets_at = Align64(launch->gather.size() * sizeof(gpu::RegionIoItem));
  if (!check) return absl::OkStatus();
  return host_query_bad_.Reserve(launch->gather.size() * gpu::kGatherBlocks * sizeof(int32_t));
}

absl::StatusOr<size_t> ClientIo::Warm(int items) {
  const size_t n = static_cast<size_t>(items);
  absl::Status st = host_query_bad_.Reserve(n * gpu::kGatherBlocks * sizeof(int32_t));
  if (!st.ok()) return st;
  return Align64(n * sizeof(gpu::RegionIoItem)) + n * sizeof(gpu::OutputTarget);
}

void ClientIo::Stage(const ClientLaunch& launch, uint8_t* host) {
  if (!launch.gather.empty()) {
    std::memcpy(host, launch.gather.data(), launch.gather.size() * sizeof(gpu::RegionIoItem));
  }
  if (!launch.targets.empty()) {
    std::memcpy(host + launch.targets_at, launch.targets.data(), launch.targets.size() * sizeof(gpu::OutputTarget));
  }
}

absl::Status ClientIo::GatherQueries(const ClientLaunch& launch, const uint8_t* dev, float* query_dev,
                                     cudaStream_t stream) {
  if (launch.gather.empty()) return absl::OkStatus();
  gpu::GatherParams p;
  p.items_dev = reinterpret_cast<const gpu::RegionIoItem*>(dev);
  p.items = static_cast<int>(launch.gather.size());
  p.stride = launch.stride;
  p.dst_dev = query_dev;
  // Pinned host memory, which the device addresses: the flags need no copy
  // back.
  if (!launch.checked.empty()) p.bad_dev = host_query_bad_.get<int32_t>();
  return gpu::LaunchGather(p, stream);
}

void ClientIo::FinishQueryChecks(const ClientLaunch& launch, absl::Span<AttendJob> jobs) const {
  const int32_t* bad = host_query_bad_.get<int32_t>();
  for (size_t k = 0; k < launch.checked.size(); ++k) {
    if (launch.checked[k] < 0) continue;
    const int32_t b = gpu::GatherBad(bad, static_cast<int>(k));
    jobs[launch.checked[k]].query_bad = b == gpu::kNoBadElement ? -1 : b;
  }
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
    io.limit = r.limit;
    items.push_back(io);
  }
  const size_t row_bytes = static_cast<size_t>(stride) * sizeof(float);
  absl::Status st = rows_dev_.Reserve(std::max<size_t>(wanted, 1) * row_bytes);
  if (st.ok()) st = host_rows_.Reserve(std::max<size_t>(wanted, 1) * row_bytes);
  if (st.ok()) st = host_bad_.Reserve(n * gpu::kGatherBlocks * sizeof(int32_t));
  if (!st.ok()) return st;
  absl::StatusOr<const gpu::RegionIoItem*> dev = Upload(items, stream);
  if (!dev.ok()) return dev.status();
  if (wanted > 0) {
    gpu::GatherParams p;
    p.items_dev = *dev;
    p.items = static_cast<int>(wanted);
    p.stride = stride;
    p.dst_dev = rows_dev_.get<float>();
    p.bad_dev = host_bad_.get<int32_t>();  // pinned: no copy back
    st = gpu::LaunchGather(p, stream);
  }
  if (st.ok() && wanted < n) {
    gpu::GatherParams p;
    p.items_dev = *dev + wanted;
    p.items = static_cast<int>(n - wanted);
    p.stride = 1;  // nothing is written
    p.dst_dev = nullptr;
    p.bad_dev = host_bad_.get<int32_t>() + wanted * gpu::kGatherBlocks;
    st = gpu::LaunchGather(p, stream);
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
    const int32_t b = gpu::GatherBad(bad, static_cast<int>(k));
    r.bad = b == gpu::kNoBadElement ? -1 : b;
    if (k < wanted) {
      std::memcpy(r.host, host_rows_.get<uint8_t>() + k * row_bytes, static_cast<size_t>(r.elements) * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace cuda_backend
}  // namespace driftkv
