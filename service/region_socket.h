// The region socket (docs/api.md, "Memory regions"): the Unix domain socket
// through which clients on the server's host hand over host shared-memory
// regions (the protocol: wire/fd_socket.h).
//
// For each connection, one at a time on one thread: receive the request
// and its descriptor (each read waits at most kAttachIoTimeout), check that
// the descriptor is a memfd sealed against shrinking (F_SEAL_SHRINK: the
// file can then never become shorter than the server's mapping, which
// would turn reads past its new end into SIGBUS in the server), opened
// read-write, of 1..max_region_bytes bytes; map it MAP_SHARED read-write;
// hand the mapping to RegionTable::AddPending; answer the attach token, or
// the reason for a refusal. The peer's pid and uid (SO_PEERCRED) go to the
// log. The socket file is created with options.region_socket_mode (0600 by
// default: only the server's user may attach) and removed by the
// destructor.
#ifndef DRIFTKV_SERVICE_REGION_SOCKET_H_
#define DRIFTKV_SERVICE_REGION_SOCKET_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/regions.h"

namespace driftkv {

constexpr absl::Duration kAttachIoTimeout = absl::Seconds(2);

// What the socket does with one received descriptor: the checks above and
// the mapping; returns the mapping's base and size, or the refusal.
// Exposed for tests. Never takes ownership of `fd`.
struct HostMapping {
  void* base = nullptr;
  uint64_t size = 0;
};
absl::StatusOr<HostMapping> MapSealedMemfd(int fd, uint64_t max_bytes);

class RegionSocket {
 public:
  // Binds `path` (an existing socket file there is replaced; any other file
  // is an error) and starts the accept thread. `table` must outlive it.
  static absl::StatusOr<std::unique_ptr<RegionSocket>> Start(const std::string& path, uint32_t mode,
                                                             uint64_t max_region_bytes, RegionTable* table);
  ~RegionSocket();  // stops the thread, closes and removes the socket

 private:
  RegionSocket() = default;
  void Loop();
  // One connection: request, checks, mapping, answer.
  void Serve(int conn);

  std::string path_;
  uint64_t max_region_bytes_ = 0;
  RegionTable* table_ = nullptr;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: the destructor writes to stop the thread
  std::thread thread_;
};

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_REGION_SOCKET_H_
