// libFuzzer: AttendRequestWire (service/attend_request_wire.h) against
// protobuf's own parser on the same bytes. The first byte chooses how the
// rest is cut into slices (as gRPC hands a message over: a few large
// slices, or many small ones): slice lengths cycle through 1 + (b >> k) % m
// for a few values derived from it. Checks: whenever the reader accepts,
// protobuf accepts too, and the reader's request with each item's query
// put back equals protobuf's message field for field; the query views lie
// within the input's bytes or a joined copy of them; refusals leave the
// request empty.
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "google/protobuf/util/message_differencer.h"
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
  AttendRequestWire wire;
  const bool ok = wire.Parse(std::move(slices));
  v1::AttendRequest want;
  const bool want_ok = want.ParseFromString(bytes);
  if (!ok) {
    if (wire.request().items_size() != 0 || !wire.queries().empty()) std::abort();
    return 0;
  }
  if (!want_ok) std::abort();  // accepted what protobuf refuses
  if (static_cast<int>(wire.queries().size()) != wire.request().items_size()) std::abort();
  v1::AttendRequest got = wire.request();
  for (int i = 0; i < got.items_size(); ++i) {
    if (!got.items(i).query().empty()) std::abort();  // the query stays out
    got.mutable_items(i)->set_query(std::string(wire.queries()[i]));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(got, want)) std::abort();
  return 0;
}
