// The wire form of an Attend answer whose inline outputs lie in pinned
// staging (StagedOutputs, service/attend_io.h): the bytes protobuf would
// write for the response with those outputs in their results, as a
// grpc::ByteBuffer whose output slices point into the staging. gRPC sends
// them from there; the slices keep the staging leased until it has.
//
// Protobuf writes an AttendResult's fields in number order, output (1)
// first, so each result is: its tag and length, the output's tag and
// length, the output's bytes (a slice of the staging), then the rest of
// the result as protobuf serialises it (lse, tokens, compressed_tokens).
// A parser sees exactly the message the copying path would have sent.
#ifndef DRIFTKV_SERVICE_ATTEND_WIRE_H_
#define DRIFTKV_SERVICE_ATTEND_WIRE_H_

#include <grpcpp/support/byte_buffer.h>

#include "proto/driftkv.pb.h"
#include "service/attend_io.h"

namespace driftkv {

// `response`'s results named in staged.outputs must have empty output
// fields (Handler::Attend leaves them so).
grpc::ByteBuffer AttendResponseBuffer(const v1::AttendResponse& response, StagedOutputs staged);

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_WIRE_H_
