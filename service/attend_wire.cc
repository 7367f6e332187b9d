#include "service/attend_wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <utility>

#include "wire/tensor_slices.h"

namespace driftkv {
namespace {

void ReleaseLease(void* lease) {
  delete static_cast<std::shared_ptr<PinnedStagingPool::Lease>*>(lease);
}

}  // namespace

grpc::ByteBuffer AttendResponseBuffer(const v1::AttendResponse& response, StagedOutputs staged) {
  // The outputs lie in one buffer: one slice holds the lease, and each
  // output is a sub-slice of it.
  const char* lo = nullptr;
  const char* hi = nullptr;
  for (absl::string_view out : staged.outputs) {
    if (out.empty()) continue;
    if (lo == nullptr || out.data() < lo) lo = out.data();
    if (hi == nullptr || out.data() + out.size() > hi) hi = out.data() + out.size();
  }
  if (staged.lease == nullptr || lo == nullptr) {
    grpc::ByteBuffer buffer;
    bool own = false;
    // What gRPC does with a message: serialised into its own slices.
    (void)grpc::SerializationTraits<v1::AttendResponse>::Serialize(response, &buffer, &own);
    return buffer;
  }
  grpc::Slice outputs(const_cast<char*>(lo), static_cast<size_t>(hi - lo), ReleaseLease,
                      new std::shared_ptr<PinnedStagingPool::Lease>(std::move(staged.lease)));
  return TensorSlicesBuffer(TensorSlicesItems(response.results()), v1::AttendResult::kOutputFieldNumber, staged.outputs,
                            [&](absl::string_view out) {
                              const size_t from = static_cast<size_t>(out.data() - lo);
                              return outputs.sub(from, from + out.size());
                            });
}

}  // namespace driftkv
