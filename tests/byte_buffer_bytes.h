// A grpc::ByteBuffer's bytes in one string, for tests that compare what
// goes on the wire.
#ifndef DRIFTKV_TESTS_BYTE_BUFFER_BYTES_H_
#define DRIFTKV_TESTS_BYTE_BUFFER_BYTES_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace driftkv {
namespace testing {

inline std::string ByteBufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace testing
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_BYTE_BUFFER_BYTES_H_
