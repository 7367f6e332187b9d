// Attend with the inline tensors in the caller's memory (Client::Attend
// with queries and outputs): the request's bytes built around the queries
// where they lie (wire/tensor_slices.h), one call through gRPC's generic
// stub, and the answer read with its outputs as views into the slices that
// brought them, copied once into the caller's buffers. Protobuf's copies
// of the tensors on the client (each query into the request's bytes, each
// output into a string) are what this saves.
#ifndef DRIFTKV_CLIENT_ATTEND_TENSORS_H_
#define DRIFTKV_CLIENT_ATTEND_TENSORS_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/completion_queue.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/driftkv.pb.h"

namespace driftkv {

// INVALID_ARGUMENT naming the field when there are more queries or outputs
// than items, or an item has its query both in the message and in queries.
absl::Status CheckAttendTensors(const v1::AttendRequest& request, absl::Span<const absl::string_view> queries,
                                absl::Span<const absl::Span<char>> outputs);

// The request's bytes with item i's query read from queries[i] (none where
// empty or past the end); the queries' memory must outlive the buffer.
grpc::ByteBuffer AttendRequestBytes(const v1::AttendRequest& request, absl::Span<const absl::string_view> queries);

// One Attend call with those bytes on `channel`; `poll`: wait by asking the
// call's queue with a zero timeout (ClientOptions::poll_attend).
grpc::Status CallAttend(const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context, bool poll,
                        const grpc::ByteBuffer& request, grpc::ByteBuffer* response);

// Waits for the one event of `cq` (asked with a zero timeout while `poll`,
// so the socket's work runs on this thread, which never sleeps), then shuts
// the queue down and drains it.
void AwaitOneAndDrain(grpc::CompletionQueue* cq, bool poll);

// Reads the answer's bytes into *response: output i is copied into
// outputs[i] and left out of its result where that span is not empty (it
// must then hold exactly the output's bytes), and kept in its result
// otherwise. INTERNAL when the bytes are not an AttendResponse or its
// results are not one per item; FAILED_PRECONDITION naming the item when a
// span's size is not its output's (the Attend has run: its decode steps
// are stored).
absl::Status ReadAttendAnswer(const grpc::ByteBuffer& bytes, int items, absl::Span<const absl::Span<char>> outputs,
                              v1::AttendResponse* response);

}  // namespace driftkv

#endif  // DRIFTKV_CLIENT_ATTEND_TENSORS_H_
