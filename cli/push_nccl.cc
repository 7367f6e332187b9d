// `driftkv push --transport nccl`: the layer's keys and values are put in
// this process's GPU (--cuda_device) and pushed chunk by chunk over an NCCL
// channel (client/nccl_channel.h, docs/nccl.md) instead of Append.
#include <cuda_runtime.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "wire/tensor.h"

namespace driftkv {
namespace cli {
namespace {

// Device memory of one layer's tensors, freed on scope exit.
struct DeviceTensor {
  void* ptr = nullptr;
  ~DeviceTensor() { cudaFree(ptr); }
};

absl::Status Upload(const std::string& bytes, DeviceTensor* t) {
  if (cudaMalloc(&t->ptr, bytes.size()) != cudaSuccess ||
      cudaMemcpy(t->ptr, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot put ", bytes.size(), " bytes on the GPU"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::AppendResponse> PushLayerNccl(NcclChannel* channel, const std::string& sequence, uint32_t layer,
                                                 int tokens, int chunk, size_t n, v1::DType dtype, const float* keys,
                                                 const float* values) {
  std::string kb, vb;
  FloatToTensor(keys, static_cast<size_t>(tokens) * n, dtype, &kb);
  FloatToTensor(values, static_cast<size_t>(tokens) * n, dtype, &vb);
  DeviceTensor kd, vd;
  absl::Status st = Upload(kb, &kd);
  if (st.ok()) st = Upload(vb, &vd);
  if (!st.ok()) return st;
  v1::AppendResponse total;
  const size_t eb = DTypeBytes(dtype);
  for (int t = 0; t < tokens; t += chunk) {
    const int c = std::min(chunk, tokens - t);
    v1::PushChunkRequest h;
    h.set_sequence_id(sequence);
    h.set_layer(layer);
    h.set_first_token(t);
    h.set_token_count(c);
    h.set_dtype(dtype);
    h.set_tensor_bytes(static_cast<uint64_t>(c) * n * eb);
    const size_t off = static_cast<size_t>(t) * n * eb;
    absl::StatusOr<v1::AppendResponse> r =
        channel->Push(h, static_cast<char*>(kd.ptr) + off, static_cast<char*>(vd.ptr) + off);
    if (!r.ok()) return r.status();
    total.set_chunks(total.chunks() + 1);
    total.set_tokens_stored(total.tokens_stored() + r->tokens_stored());
    total.set_tokens_duplicate(total.tokens_duplicate() + r->tokens_duplicate());
  }
  return total;
}

}  // namespace cli
}  // namespace driftkv
