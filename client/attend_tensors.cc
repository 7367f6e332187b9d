#include "client/attend_tensors.h"

#include <grpc/support/time.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/slice.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "wire/tensor_slices.h"

namespace driftkv {
namespace {

constexpr char kAttendMethod[] = "/driftkv.v1.KvCache/Attend";

}  // namespace

absl::Status CheckAttendTensors(const v1::AttendRequest& request, absl::Span<const absl::string_view> queries,
                                absl::Span<const absl::Span<char>> outputs) {
  const size_t items = static_cast<size_t>(request.items_size());
  if (queries.size() > items) {
    return absl::InvalidArgumentError(absl::StrCat("queries: ", queries.size(), " for ", items, " items"));
  }
  if (outputs.size() > items) {
    return absl::InvalidArgumentError(absl::StrCat("outputs: ", outputs.size(), " for ", items, " items"));
  }
  for (size_t i = 0; i < queries.size(); ++i) {
    if (!queries[i].empty() && !request.items(static_cast<int>(i)).query().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("items[", i, "].query: set in the request and given in queries[", i, "] too"));
    }
  }
  return absl::OkStatus();
}

grpc::ByteBuffer AttendRequestBytes(const v1::AttendRequest& request, absl::Span<const absl::string_view> queries) {
  return TensorSlicesBuffer(TensorSlicesItems(request.items()), v1::AttendItem::kQueryFieldNumber, queries,
                            [](absl::string_view q) {
                              // Borrowed, not copied: the caller's query
                              // memory outlives the call.
                              return grpc::Slice(q.data(), q.size(), grpc::Slice::STATIC_SLICE);
                            });
}

void AwaitOneAndDrain(grpc::CompletionQueue* cq, bool poll) {
  void* tag = nullptr;
  bool ok = false;
  if (poll) {
    while (cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) != grpc::CompletionQueue::GOT_EVENT) {
    }
  } else {
    (void)cq->Next(&tag, &ok);
  }
  cq->Shutdown();
  while (cq->Next(&tag, &ok)) {
  }
}

grpc::Status CallAttend(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context, bool poll,
                        const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::Status status;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(context, kAttendMethod, request, &cq);
  call->StartCall();
  call->Finish(response, &status, &cq);
  AwaitOneAndDrain(&cq, poll);
  return status;
}

absl::Status ReadAttendAnswer(const grpc::ByteBuffer& bytes, int items, absl::Span<const absl::Span<char>> outputs,
                              v1::AttendResponse* response) {
  TensorSlices<v1::AttendResponse, v1::AttendResult::kOutputFieldNumber> answer;
  if (!answer.Parse(bytes)) return absl::InternalError("the answer is not an AttendResponse");
  if (answer.message().results_size() != items) {
    return absl::InternalError(
        absl::StrCat("the answer has ", answer.message().results_size(), " results for ", items, " items"));
  }
  response->Swap(answer.mutable_message());
  for (int i = 0; i < items; ++i) {
    const absl::string_view out = answer.tensors()[static_cast<size_t>(i)];
    const absl::Span<char> into = static_cast<size_t>(i) < outputs.size() ? outputs[i] : absl::Span<char>();
    if (into.empty()) {
      response->mutable_results(i)->set_output(std::string(out));
      continue;
    }
    if (into.size() != out.size()) {
      return absl::FailedPreconditionError(absl::StrCat("outputs[", i, "]: holds ", into.size(),
                                                        " bytes, the answer's output of item ", i, " is ", out.size(),
                                                        " bytes"));
    }
    std::memcpy(into.data(), out.data(), out.size());
  }
  return absl::OkStatus();
}

}  // namespace driftkv
