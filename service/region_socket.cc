#include "service/region_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "service/quoted.h"
#include "wire/fd_socket.h"

namespace driftkv {
namespace {

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

}  // namespace

absl::StatusOr<HostMapping> MapSealedMemfd(int fd, uint64_t max_bytes) {
  // F_GET_SEALS answers only for files that support sealing (memfd,
  // shmem): EINVAL for a regular file, a pipe, a socket, ...
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError("the descriptor is not a memfd (memfd_create with MFD_ALLOW_SEALING)");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError("the memfd is not sealed with F_SEAL_SHRINK");
  }
  if ((seals & F_SEAL_WRITE) != 0) {
    return absl::InvalidArgumentError("the memfd is sealed against writes; the server maps it read-write");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("the memfd is not open read-write");
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError("the descriptor is not a regular memfd");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0 || size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the memfd has ", size, " bytes; must be in [1, max_region_bytes ", max_bytes, "]"));
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::ResourceExhaustedError(Errno("mmap of the memfd"));
  return HostMapping{base, size};
}

absl::StatusOr<std::unique_ptr<RegionSocket>> RegionSocket::Start(const std::string& path, uint32_t mode,
                                                                  uint64_t max_region_bytes, RegionTable* table) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("region_socket \"", path, "\" is empty or too long"));
  }
  struct stat existing;
  if (lstat(path.c_str(), &existing) == 0) {
    if (!S_ISSOCK(existing.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("region_socket ", path, " exists and is not a socket; not replacing it"));
    }
    unlink(path.c_str());  // a previous server's
  }
  std::unique_ptr<RegionSocket> s(new RegionSocket());
  s->path_ = path;
  s->max_region_bytes_ = max_region_bytes;
  s->table_ = table;
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s->listen_fd_ < 0) return absl::UnavailableError(Errno("socket"));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // The file is created with the umask's mode: tighten the umask so that
  // nobody else can connect between bind and chmod.
  const mode_t old_umask = umask(0177);
  const int bound = bind(s->listen_fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  if (bound != 0) return absl::UnavailableError(absl::StrCat("region_socket ", path, ": ", Errno("bind")));
  if (chmod(path.c_str(), mode) != 0 || listen(s->listen_fd_, 64) != 0) {
    absl::Status st = absl::UnavailableError(absl::StrCat("region_socket ", path, ": ", Errno("chmod/listen")));
    unlink(path.c_str());
    return st;
  }
  if (pipe2(s->wake_, O_CLOEXEC) != 0) {
    unlink(path.c_str());
    return absl::UnavailableError(Errno("pipe2"));
  }
  s->thread_ = std::thread([self = s.get()] { self->Loop(); });
  return s;
}

RegionSocket::~RegionSocket() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!write(wake_[1], &byte, 1);
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    unlink(path_.c_str());
  }
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

void RegionSocket::Loop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void RegionSocket::Serve(int conn) {
  const timeval tv = absl::ToTimeval(kAttachIoTimeout);
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  PeerCredentials peer;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
  }
  AttachReply reply;
  int fd = -1;
  absl::StatusOr<std::string> request = ReceiveWithFd(conn, kAttachRequestBytes + 1, &fd);
  absl::Status st = request.status();
  if (st.ok()) st = CheckAttachRequest(*request);
  if (st.ok() && fd < 0) st = absl::InvalidArgumentError("no file descriptor came with the attach request");
  if (st.ok()) {
    absl::StatusOr<HostMapping> mapping = MapSealedMemfd(fd, max_region_bytes_);
    st = mapping.status();
    if (st.ok()) {
      absl::StatusOr<std::string> token = table_->AddPending(mapping->base, mapping->size, peer);
      st = token.status();
      if (st.ok()) {
        reply.ok = true;
        reply.token = *token;
        reply.size = mapping->size;
      }
    }
  }
  if (fd >= 0) close(fd);  // the mapping keeps the memory
  if (!st.ok()) {
    reply.error = std::string(st.message());
    std::cerr << "driftkv-server: regions: refused an attachment from pid " << peer.pid << " uid " << peer.uid << ": "
              << ForLog(reply.error) << std::endl;
  }
  (void)SendWithFd(conn, EncodeAttachReply(reply), -1);
}

}  // namespace driftkv
