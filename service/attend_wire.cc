#include "service/attend_wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace driftkv {
namespace {

// Field 1, length-delimited: AttendResponse.results and AttendResult.output.
constexpr char kField1Bytes = (1 << 3) | 2;

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void ReleaseLease(void* lease) {
  delete static_cast<std::shared_ptr<PinnedStagingPool::Lease>*>(lease);
}

}  // namespace

grpc::ByteBuffer AttendResponseBuffer(const v1::AttendResponse& response, StagedOutputs staged) {
  grpc::ByteBuffer buffer;
  if (staged.lease == nullptr || staged.outputs.empty()) {
    bool own = false;
    // What gRPC does with a message: serialised into its own slices.
    (void)grpc::SerializationTraits<v1::AttendResponse>::Serialize(response, &buffer, &own);
    return buffer;
  }
  // The outputs lie in one buffer: one slice holds the lease, and each
  // output is a sub-slice of it.
  const char* lo = nullptr;
  const char* hi = nullptr;
  for (absl::string_view out : staged.outputs) {
    if (out.empty()) continue;
    if (lo == nullptr || out.data() < lo) lo = out.data();
    if (hi == nullptr || out.data() + out.size() > hi) hi = out.data() + out.size();
  }
  grpc::Slice outputs(const_cast<char*>(lo), static_cast<size_t>(hi - lo), ReleaseLease,
                      new std::shared_ptr<PinnedStagingPool::Lease>(std::move(staged.lease)));
  // Everything else (tags, lengths, lse, counts) in one string; `cuts`
  // are where an output's slice goes between its pieces.
  std::string meta;
  std::vector<size_t> cuts;
  std::vector<absl::string_view> cut_outputs;
  meta.reserve(static_cast<size_t>(response.results_size()) * 192);
  for (int i = 0; i < response.results_size(); ++i) {
    const v1::AttendResult& r = response.results(i);
    const absl::string_view out =
        static_cast<size_t>(i) < staged.outputs.size() ? staged.outputs[i] : absl::string_view();
    const size_t rest = r.ByteSizeLong();
    const size_t body = rest + (out.empty() ? 0 : 1 + VarintBytes(out.size()) + out.size());
    meta.push_back(kField1Bytes);
    PutVarint(body, &meta);
    if (!out.empty()) {
      meta.push_back(kField1Bytes);
      PutVarint(out.size(), &meta);
      cuts.push_back(meta.size());
      cut_outputs.push_back(out);
    }
    r.AppendToString(&meta);
  }
  grpc::Slice all(meta.data(), meta.size());  // one copy of the small bytes
  std::vector<grpc::Slice> slices;
  slices.reserve(2 * cuts.size() + 1);
  size_t at = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    if (cuts[k] > at) slices.push_back(all.sub(at, cuts[k]));
    const size_t from = static_cast<size_t>(cut_outputs[k].data() - lo);
    slices.push_back(outputs.sub(from, from + cut_outputs[k].size()));
    at = cuts[k];
  }
  if (meta.size() > at) slices.push_back(all.sub(at, meta.size()));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace driftkv
