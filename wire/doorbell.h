// A doorbell: one request/response slot in a host region (service/regions.h)
// through which a client on the server's host sends Attend requests and
// receives their answers without a socket. Client and server map the same
// memfd; each side writes only its own cache line and area.
//
// LAYOUT (little-endian; `base` = the doorbell's offset in its region, a
// multiple of 64; C = request capacity, R = response capacity, multiples
// of 64, chosen at OpenDoorbell):
//   base +   0  client line (written by the client only)
//                 u64 request_seq    0 at start; the client stores seq + 1
//                                    (release) after the request bytes
//                 u32 request_bytes  <= C
//                 u32 request_word   the low 32 bits of request_seq, stored
//                                    after it (the server's futex word)
//                 i64 deadline_ns    CLOCK_MONOTONIC; 0: none
//                 u32 kind           what the request area holds (Kind);
//                                    0 for clients that predate kinds
//                 u32 slot           kPrepare, kAttendPrepared: the slot
//                 u64 token_index_offset  kAttendPrepared: added to every
//                                    new_token_index the prepared items set
//   base +  64  server line (written by the server only)
//                 u64 response_seq   = request_seq of the last answer
//                 i32 code           absl::StatusCode of that answer
//                 u32 response_bytes <= R
//                 u32 response_word  the low 32 bits of response_seq (the
//                                    client's futex word)
//                 u32 server_sleeping 1 while the server waits on the futex
//   base + 128            request: a serialized AttendRequest (C bytes;
//                         none for kAttendPrepared)
//   base + 128 + C        response: a serialized AttendResponse when code is
//                         0, else the error message (R bytes)
//
// PROTOCOL. One request in flight: the client writes a request only when
// response_seq == request_seq. The server reads request_seq (acquire);
// when it moved, it copies the request bytes out of the shared memory
// before parsing them (the client may scribble over them meanwhile: the
// server never reads a field twice), answers, writes the response area,
// code and response_bytes, then response_seq (release) and response_word,
// and wakes a client waiting on response_word. A client that stores
// request_seq wakes the server (FUTEX_WAKE on request_word) when
// server_sleeping is set. The server spins for a while after each request
// before sleeping, so dependent requests (one per layer) pay no wake-up.
//
// PREPARED REQUESTS. A decode loop sends the same items step after step
// (one request per layer, the same sequences and references; only the
// decode step's token index moves). kPrepare keeps the request in the
// area under `slot` (the answer: code 0, no bytes; 0 request bytes empty
// the slot); kAttendPrepared then runs that request with no request bytes
// at all, each item's new_token_index (where the prepared item set one)
// advanced by token_index_offset. A prepared request names every tensor
// by reference: the region bytes it points at are read at each run.
#ifndef DRIFTKV_WIRE_DOORBELL_H_
#define DRIFTKV_WIRE_DOORBELL_H_

#include <cstddef>
#include <cstdint>

namespace driftkv {
namespace doorbell {

constexpr uint64_t kClientLine = 0;
constexpr uint64_t kServerLine = 64;
constexpr uint64_t kHeaderBytes = 128;
constexpr uint64_t kAlignment = 64;
// Each area at most 64 MiB: a 4,096-item request by reference is ~0.4 MiB.
constexpr uint64_t kMaxAreaBytes = uint64_t{64} << 20;
// Prepared requests: slots [0, kMaxPreparedSlots) per doorbell, their
// serialized bytes together at most kMaxPreparedBytes (a 64-item request
// by reference is ~5 KB: one per layer of a 32-layer model is ~160 KB).
constexpr uint32_t kMaxPreparedSlots = 1024;
constexpr uint64_t kMaxPreparedBytes = uint64_t{16} << 20;

enum Kind : uint32_t {
  kAttend = 0,          // the area holds an AttendRequest; answer it
  kPrepare = 1,         // keep the area's AttendRequest in `slot`
  kAttendPrepared = 2,  // answer the request kept in `slot`
};

struct ClientLine {
  uint64_t request_seq;
  uint32_t request_bytes;
  uint32_t request_word;
  int64_t deadline_ns;
  uint32_t kind;
  uint32_t slot;
  uint64_t token_index_offset;
};
struct ServerLine {
  uint64_t response_seq;
  int32_t code;
  uint32_t response_bytes;
  uint32_t response_word;
  uint32_t server_sleeping;
};
static_assert(sizeof(ClientLine) <= 64 && sizeof(ServerLine) <= 64, "one cache line each");
static_assert(offsetof(ClientLine, kind) == 24 && offsetof(ClientLine, slot) == 28 &&
                  offsetof(ClientLine, token_index_offset) == 32,
              "the layout above (clients in other languages write these offsets)");
static_assert(offsetof(ClientLine, request_word) % 4 == 0 && offsetof(ServerLine, response_word) % 4 == 0,
              "futex words are 4-byte aligned");

// Bytes a doorbell of these capacities spans.
constexpr uint64_t Bytes(uint64_t request_capacity, uint64_t response_capacity) {
  return kHeaderBytes + request_capacity + response_capacity;
}

}  // namespace doorbell
}  // namespace driftkv

#endif  // DRIFTKV_WIRE_DOORBELL_H_
