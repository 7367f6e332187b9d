// An AttendRequest read from the bytes gRPC received, with each item's
// inline query left where it lies.
//
// Protobuf's parser copies every bytes field into a string of its own; for
// a 64-item bf16 request that is 0.5 MB copied once by the parser and once
// more into pinned staging (service/attend_io.h). This reader walks the
// request's wire form over gRPC's slices, hands protobuf everything except
// the items' `query` fields (a few KB: ids, dtypes, references), and keeps
// each query as a view into the slice that holds it: the staging copy is
// then the only one. A query that straddles two slices is joined into a
// string of its own (one copy, as before).
//
// What it accepts protobuf's parser accepts too, and it yields the same
// message: every field other than a query goes through protobuf as its
// bytes came (unknown fields, repeated fields, fields of the wrong wire
// type included); the last `query` of an item wins, as protobuf's does.
// It refuses groups (wire types 3 and 4, which no field of the request
// uses) even where protobuf would keep one as an unknown field.
// `fuzz/fuzz_attend_request_wire.cc` holds it to that on arbitrary bytes.
#ifndef DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_
#define DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/driftkv.pb.h"

namespace driftkv {

class AttendRequestWire {
 public:
  // Reads `buffer` (its slices are kept: the views point into them). False,
  // with the message left empty, when the bytes are not an AttendRequest.
  bool Parse(const grpc::ByteBuffer& buffer);
  // The same from slices already at hand (tests, the fuzz target).
  bool Parse(std::vector<grpc::Slice> slices);

  // The request, every item's query field empty.
  const v1::AttendRequest& request() const { return request_; }
  // Item i's inline query: one per item, empty where it has none.
  const std::vector<absl::string_view>& queries() const { return queries_; }

 private:
  std::vector<grpc::Slice> slices_;
  v1::AttendRequest request_;
  std::vector<absl::string_view> queries_;
  std::deque<std::string> joined_;  // queries that straddle slices
  std::string skeleton_;            // the request without its queries
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_
