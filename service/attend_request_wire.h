// An AttendRequest read from the bytes gRPC received, with each item's
// inline query left where it lies (wire/tensor_slices.h): the copy into
// pinned staging (service/attend_io.h) is then the only one.
// `fuzz/fuzz_attend_request_wire.cc` holds it to protobuf's parser on
// arbitrary bytes.
#ifndef DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_
#define DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_

#include "proto/driftkv.pb.h"
#include "wire/tensor_slices.h"

namespace driftkv {

// message(): the request, every item's query empty; tensors(): item i's
// inline query, empty where it has none.
using AttendRequestWire = TensorSlices<v1::AttendRequest, v1::AttendItem::kQueryFieldNumber>;

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_ATTEND_REQUEST_WIRE_H_
