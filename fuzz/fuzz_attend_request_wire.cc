// libFuzzer: AttendRequestWire (service/attend_request_wire.h), and the
// same reader as the client reads an answer (TensorSlices of an
// AttendResponse, wire/tensor_slices.h), against protobuf's own parser on
// the same bytes. The first byte chooses how the
// rest is cut into slices (as gRPC hands a message over: a few large
// slices, or many small ones): slice lengths cycle through 1 + (b >> k) % m
// for a few values derived from it. Checks: whenever the reader accepts,
// protobuf accepts too, and the reader's request with each item's query
// put back equals protobuf's message field for field (compared by their
// serialisations, so that a NaN equals itself); the query views lie
// within the input's bytes or a joined copy of them; refusals leave the
// request empty.
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "proto/driftkv.pb.h"
#include "service/attend_request_wire.h"

using namespace driftkv;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t cut = data[0];
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<grpc::Slice> slices;
  const size_t lengths[4] = {1u + cut % 7u, 1u + (cut >> 3) % 64u, 4096u, 1u + (cut >> 5)};
  for (size_t at = 0, k = 0; at < bytes.size(); ++k) {
    const size_t n = std::min(bytes.size() - at, lengths[(cut & 1) ? k % 4 : 2 + k % 2]);
    slices.emplace_back(bytes.data() + at, n);
    at += n;
  }
  TensorSlices<v1::AttendResponse, v1::AttendResult::kOutputFieldNumber> answer;
  const bool answer_ok = answer.Parse(slices);
  v1::AttendResponse want_answer;
  const bool want_answer_ok = want_answer.ParseFromString(bytes);
  if (!answer_ok && (answer.message().results_size() != 0 || !answer.tensors().empty())) std::abort();
  if (answer_ok) {
    if (!want_answer_ok) std::abort();
    if (static_cast<int>(answer.tensors().size()) != answer.message().results_size()) std::abort();
    v1::AttendResponse got = answer.message();
    for (int i = 0; i < got.results_size(); ++i) {
      if (!got.results(i).output().empty()) std::abort();
      got.mutable_results(i)->set_output(std::string(answer.tensors()[i]));
    }
    if (got.SerializeAsString() != want_answer.SerializeAsString()) std::abort();
  }

  AttendRequestWire wire;
  const bool ok = wire.Parse(std::move(slices));
  v1::AttendRequest want;
  const bool want_ok = want.ParseFromString(bytes);
  if (!ok) {
    if (wire.message().items_size() != 0 || !wire.tensors().empty()) std::abort();
    return 0;
  }
  if (!want_ok) std::abort();  // accepted what protobuf refuses
  if (static_cast<int>(wire.tensors().size()) != wire.message().items_size()) std::abort();
  v1::AttendRequest got = wire.message();
  for (int i = 0; i < got.items_size(); ++i) {
    if (!got.items(i).query().empty()) std::abort();  // the query stays out
    got.mutable_items(i)->set_query(std::string(wire.tensors()[i]));
  }
  // Field for field, by their serialisations: MessageDifferencer calls a
  // NaN softmax_scale unequal to itself.
  if (got.SerializeAsString() != want.SerializeAsString()) std::abort();
  return 0;
}
