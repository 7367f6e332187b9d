// AttendResponseBuffer (service/attend_wire.h): an answer whose outputs
// lie outside the response serialises to the bytes protobuf writes for
// the same answer with the outputs inside it.
#include "service/attend_wire.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/byte_buffer_bytes.h"

namespace driftkv {
namespace {

using testing::ByteBufferBytes;

v1::AttendResult Result(int heads, uint64_t tokens) {
  v1::AttendResult r;
  for (int h = 0; h < heads; ++h) r.add_lse(0.5f * h - 3.0f);
  r.set_tokens(tokens);
  r.set_compressed_tokens(tokens / 128 * 128);
  return r;
}

// Outputs of 0 bytes, of 1-, 2- and 3-byte lengths, left outside or kept
// inside their results, in one staging buffer in another order than the
// results': the bytes are the copied answer's, and it parses back equal.
TEST(AttendWireTest, StagedOutputsSerialiseAsTheCopiedAnswer) {
  const std::vector<size_t> sizes = {64, 0, 200, 16384, 131072, 8, 300};
  const std::vector<bool> staged_here = {true, false, true, true, true, false, true};
  std::string staging;
  for (size_t s : sizes) staging.append(s + 5, '\0');  // gaps between outputs
  for (size_t i = 0; i < staging.size(); ++i) staging[i] = static_cast<char>(i * 131 + 7);

  v1::AttendResponse with_outputs, without;
  StagedOutputs staged;
  staged.lease = std::make_shared<PinnedStagingPool::Lease>();
  staged.outputs.resize(sizes.size() - 1);  // the last result's slot is past the end
  size_t at = staging.size();
  for (size_t i = 0; i < sizes.size(); ++i) {
    at -= sizes[i] + 5;  // later results sit earlier in the buffer
    const absl::string_view bytes(staging.data() + at, sizes[i]);
    v1::AttendResult r = Result(static_cast<int>(i % 4) + 1, 1000 + i);
    *with_outputs.add_results() = r;
    with_outputs.mutable_results(i)->set_output(std::string(bytes));
    if (staged_here[i] && i < staged.outputs.size()) {
      staged.outputs[i] = bytes;
    } else {
      r.set_output(std::string(bytes));
    }
    *without.add_results() = r;
  }
  const std::string want = with_outputs.SerializeAsString();
  const grpc::ByteBuffer buffer = AttendResponseBuffer(without, staged);
  EXPECT_EQ(ByteBufferBytes(buffer), want);
  v1::AttendResponse back;
  ASSERT_TRUE(back.ParseFromString(ByteBufferBytes(buffer)));
  EXPECT_EQ(back.SerializeAsString(), want);
}

TEST(AttendWireTest, WithoutStagedOutputsItIsProtobufsSerialisation) {
  v1::AttendResponse r;
  *r.add_results() = Result(4, 77);
  r.mutable_results(0)->set_output(std::string(512, 'x'));
  EXPECT_EQ(ByteBufferBytes(AttendResponseBuffer(r, StagedOutputs())), r.SerializeAsString());
  EXPECT_EQ(ByteBufferBytes(AttendResponseBuffer(v1::AttendResponse(), StagedOutputs())), "");
}

// The buffer holds the lease: dropping every other reference keeps it
// alive until the buffer goes.
TEST(AttendWireTest, TheBufferHoldsTheStaging) {
  std::string staging(256, 'y');
  StagedOutputs staged;
  staged.lease = std::make_shared<PinnedStagingPool::Lease>();
  std::weak_ptr<PinnedStagingPool::Lease> watch = staged.lease;
  staged.outputs = {absl::string_view(staging.data(), 256)};
  v1::AttendResponse r;
  *r.add_results() = Result(2, 5);
  {
    grpc::ByteBuffer buffer = AttendResponseBuffer(r, std::move(staged));
    staged = StagedOutputs();
    EXPECT_FALSE(watch.expired());
    grpc::ByteBuffer copy = buffer;  // gRPC's own reference
    buffer.Clear();
    EXPECT_FALSE(watch.expired());
  }
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace driftkv
