// A doorbell (wire/doorbell.h) in plain memory with guard bytes around it,
// served by ServeDoorbellRequest with a fake AttendFn, for the doorbell
// tests.
#ifndef DRIFTKV_TESTS_BELL_MEMORY_H_
#define DRIFTKV_TESTS_BELL_MEMORY_H_

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "proto/driftkv.pb.h"
#include "service/doorbell.h"
#include "wire/doorbell.h"
#include "wire/monotonic.h"

namespace driftkv {
namespace testing_bell {

using C = absl::StatusCode;
using doorbell::ClientLine;
using doorbell::ServerLine;

constexpr uint8_t kGuard = 0xA5;
constexpr size_t kGuardBytes = 256;

// A doorbell of capacities (c, r) in malloc'd memory with guard bytes on
// both sides, and a fake AttendFn that records its calls and answers what
// the test sets.
class BellMemory {
 public:
  BellMemory(uint64_t c, uint64_t r) : c_(c), r_(r), buf_(kGuardBytes * 2 + doorbell::Bytes(c, r), kGuard) {
    std::memset(base(), 0, doorbell::Bytes(c, r));
  }
  uint8_t* base() { return buf_.data() + kGuardBytes; }
  ClientLine* client() { return reinterpret_cast<ClientLine*>(base() + doorbell::kClientLine); }
  ServerLine* server() { return reinterpret_cast<ServerLine*>(base() + doorbell::kServerLine); }
  // Writes `bytes` as the request (at most the capacity) and says it has
  // `claimed` bytes.
  void Request(const std::string& bytes, uint32_t claimed, int64_t deadline_ns = 0) {
    Ring(doorbell::kAttend, 0, 0, bytes, claimed, deadline_ns);
  }
  // Any kind of request (wire/doorbell.h's client line).
  void Ring(uint32_t kind, uint32_t slot, uint64_t offset, const std::string& bytes, uint32_t claimed,
            int64_t deadline_ns = 0) {
    std::memcpy(base() + doorbell::kHeaderBytes, bytes.data(), std::min<size_t>(bytes.size(), c_));
    client()->request_bytes = claimed;
    client()->deadline_ns = deadline_ns;
    client()->kind = kind;
    client()->slot = slot;
    client()->token_index_offset = offset;
    client()->request_seq = ++seq_;
  }
  void Serve() {
    const AttendFn fn = [this](const v1::AttendRequest& request, v1::AttendResponse* response,
                               const std::string& tenant) {
      ++calls;
      seen = request;
      seen_tenant = tenant;
      *response = answer;
      return status;
    };
    ServeDoorbellRequest(base(), c_, r_, seq_, fn, "alice", &scratch_);
  }
  std::string Response() {
    return std::string(reinterpret_cast<const char*>(base() + doorbell::kHeaderBytes + c_), server()->response_bytes);
  }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (buf_[i] != kGuard || buf_[buf_.size() - 1 - i] != kGuard) return false;
    }
    return true;
  }
  uint64_t seq() const { return seq_; }

  int calls = 0;
  v1::AttendRequest seen;
  std::string seen_tenant;
  v1::AttendResponse answer;
  absl::Status status;

 private:
  const uint64_t c_, r_;
  std::vector<uint8_t> buf_;
  uint64_t seq_ = 0;
  DoorbellScratch scratch_;
};

inline v1::AttendRequest SmallRequest() {
  v1::AttendRequest r;
  v1::AttendItem* it = r.add_items();
  it->set_sequence_id("seq");
  it->set_layer(1);
  it->set_q_heads(2);
  it->set_query(std::string(64, 'q'));
  return r;
}

inline void ExpectAnswered(BellMemory& m, C code) {
  EXPECT_EQ(m.server()->response_seq, m.seq());
  EXPECT_EQ(m.server()->response_word, static_cast<uint32_t>(m.seq()));
  EXPECT_EQ(m.server()->code, static_cast<int32_t>(code));
  EXPECT_TRUE(m.GuardsIntact());
}

}  // namespace testing_bell
}  // namespace driftkv

#endif  // DRIFTKV_TESTS_BELL_MEMORY_H_
