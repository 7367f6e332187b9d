// Messages that carry one tensor per item, moved between gRPC's slices and
// the memory that holds the tensors without protobuf's copies.
//
// AttendRequest (items, each with its `query`) and AttendResponse
// (results, each with its `output`) have the same shape: field 1 is a
// repeated message, and one bytes field of each element is a tensor of up
// to tens of KB while the rest is a few dozen bytes. Protobuf copies every
// bytes field when it serialises (into gRPC's slices) and when it parses
// (into a string per element): for a 64-item bf16 Attend, 0.5 MB twice on
// each side. Here the tensors go out as slices of their own memory and come
// in as views into the slices gRPC received, and only the small rest goes
// through protobuf.
#ifndef DRIFTKV_WIRE_TENSOR_SLICES_H_
#define DRIFTKV_WIRE_TENSOR_SLICES_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "google/protobuf/message_lite.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace driftkv {

// Reads such a message over the slices that hold it, keeping each
// element's tensor field as a view into its slice (a tensor that
// straddles two slices is joined into a string of its own: one copy).
//
// What it accepts protobuf's parser accepts too, and it yields the same
// message: every field other than a tensor goes through protobuf as its
// bytes came (unknown fields, repeated fields, fields of the wrong wire
// type included); the last tensor field of an element wins, as protobuf's
// does. It refuses groups (wire types 3 and 4, which neither message
// uses) even where protobuf would keep one as an unknown field.
class TensorSlicesReader {
 public:
  // Reads `slices` (kept: the views point into them) into *message, whose
  // elements then have empty tensor fields; tensors() holds one view per
  // element, empty where it has none. False, with *message cleared and no
  // views, when the bytes are not such a message.
  bool Parse(std::vector<grpc::Slice> slices, uint32_t tensor_field, google::protobuf::MessageLite* message);
  bool Parse(const grpc::ByteBuffer& buffer, uint32_t tensor_field, google::protobuf::MessageLite* message);

  const std::vector<absl::string_view>& tensors() const { return tensors_; }
  // The bytes of the message without its tensors, as the last Parse read.
  size_t message_bytes() const { return skeleton_.size(); }
  // Lets go of the slices and the views into them; the buffers stay for
  // the next Parse (up to kKeptBytes of them).
  void Release();
  static constexpr size_t kKeptBytes = 1 << 20;

 private:
  std::vector<grpc::Slice> slices_;
  std::vector<absl::string_view> tensors_;
  std::deque<std::string> joined_;  // tensors that straddle slices
  std::string skeleton_;            // the message without its tensors
};

// A message of type Message read by TensorSlicesReader, its elements'
// field kTensorField kept as views.
template <class Message, uint32_t kTensorField>
class TensorSlices {
 public:
  static constexpr size_t kKeptBytes = TensorSlicesReader::kKeptBytes;

  bool Parse(const grpc::ByteBuffer& buffer) { return reader_.Parse(buffer, kTensorField, &message_); }
  bool Parse(std::vector<grpc::Slice> slices) { return reader_.Parse(std::move(slices), kTensorField, &message_); }

  // The message, every element's tensor field empty.
  const Message& message() const { return message_; }
  Message* mutable_message() { return &message_; }
  // Element i's tensor: one per element, empty where it has none.
  const std::vector<absl::string_view>& tensors() const { return reader_.tensors(); }
  // The message cleared, the slices and views let go. A message read
  // again after Release reuses its elements' allocations (protobuf keeps
  // cleared elements), unless it was larger than kKeptBytes on the wire:
  // then it starts afresh, so that one large call leaves nothing behind.
  void Release() {
    if (reader_.message_bytes() > kKeptBytes) {
      message_ = Message();
    } else {
      message_.Clear();
    }
    reader_.Release();
  }

 private:
  TensorSlicesReader reader_;
  Message message_;
};

// The wire form of a message whose field 1 holds `items` (their tensor
// fields empty) with item i's tensor field set to tensors[i] (none where
// empty or past the end): each item is its tag and length, the tensor's
// tag and length, the tensor as the slice slice_of(tensors[i]), then the
// item's own serialisation. A parser sees the same message as protobuf's
// serialisation of it with the tensors inside; the bytes are the same
// where the tensor field is the item's first.
grpc::ByteBuffer TensorSlicesBuffer(absl::Span<const google::protobuf::MessageLite* const> items, uint32_t tensor_field,
                                    absl::Span<const absl::string_view> tensors,
                                    absl::FunctionRef<grpc::Slice(absl::string_view)> slice_of);

template <class Item>
std::vector<const google::protobuf::MessageLite*> TensorSlicesItems(
    const google::protobuf::RepeatedPtrField<Item>& items) {
  std::vector<const google::protobuf::MessageLite*> out;
  out.reserve(static_cast<size_t>(items.size()));
  for (const Item& item : items) out.push_back(&item);
  return out;
}

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_TENSOR_SLICES_H_
