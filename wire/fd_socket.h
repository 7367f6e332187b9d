// The attach protocol of host shared-memory regions (docs/api.md, "Memory
// regions"), both ends: a client hands the server a sealed memfd over the
// server's Unix domain socket (InfoResponse.region_socket) and gets back a
// one-time attach token, which it then passes to RegisterRegion over gRPC.
//
// One attachment per connection:
//   client -> server  kAttachRequestBytes bytes: the magic "DKVRGN01"
//                     ("01": the protocol version), with exactly one file
//                     descriptor as SCM_RIGHTS ancillary data.
//   server -> client  one reply, then the server closes the connection:
//                     [0]      status: 0 ok, 1 refused
//                     ok:      [1, 17)  the attach token (16 random bytes)
//                              [17, 25) the region's size, uint64 little-endian
//                     refused: [1, ...) the reason, UTF-8, at most
//                              kMaxAttachErrorBytes bytes
// Nothing in the request but the descriptor carries information: the
// server maps only memory the client created and passed, so there is no
// name to guess (contrast a POSIX shm_open name).
#ifndef DRIFTKV_WIRE_FD_SOCKET_H_
#define DRIFTKV_WIRE_FD_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace driftkv {

constexpr char kAttachMagic[] = "DKVRGN01";
constexpr size_t kAttachRequestBytes = 8;
static_assert(sizeof(kAttachMagic) == kAttachRequestBytes + 1, "the magic is the whole request");
constexpr size_t kAttachTokenBytes = 16;
constexpr size_t kAttachOkReplyBytes = 1 + kAttachTokenBytes + 8;
constexpr size_t kMaxAttachErrorBytes = 512;
constexpr size_t kMaxAttachReplyBytes = 1 + kMaxAttachErrorBytes;

struct AttachReply {
  bool ok = false;
  std::string token;  // kAttachTokenBytes when ok
  uint64_t size = 0;  // when ok
  std::string error;  // when refused
};

// The reply's bytes (an error longer than kMaxAttachErrorBytes is cut).
std::string EncodeAttachReply(const AttachReply& reply);
// InvalidArgument for bytes that are no reply of the layout above.
absl::StatusOr<AttachReply> ParseAttachReply(absl::string_view bytes);
// OK when `bytes` is exactly the request; InvalidArgument saying what is wrong.
absl::Status CheckAttachRequest(absl::string_view bytes);

// sendmsg of `bytes` with `fd` as SCM_RIGHTS (fd < 0: none).
absl::Status SendWithFd(int sock, absl::string_view bytes, int fd);
// One recvmsg of at most `max_bytes`; *fd gets the one descriptor that came
// with it (-1: none). Descriptors beyond one are closed, and so is the one
// when the ancillary data was cut (MSG_CTRUNC): InvalidArgument.
absl::StatusOr<std::string> ReceiveWithFd(int sock, size_t max_bytes, int* fd);

// The client's side: connects to `socket_path`, sends `fd`, reads the
// reply. A refusal is FailedPrecondition with the server's reason;
// Unavailable when the socket cannot be reached. Each socket operation
// waits at most `timeout`.
absl::StatusOr<AttachReply> AttachFd(const std::string& socket_path, int fd, absl::Duration timeout);

// A memfd of `bytes` bytes (zeros) sealed against shrinking and against
// further seals (F_SEAL_SHRINK | F_SEAL_SEAL), as the server requires; the
// caller owns the descriptor.
absl::StatusOr<int> CreateSealedMemfd(const std::string& name, uint64_t bytes);

}  // namespace driftkv

#endif  // DRIFTKV_WIRE_FD_SOCKET_H_
