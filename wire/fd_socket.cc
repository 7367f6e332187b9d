#include "wire/fd_socket.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace driftkv {
namespace {

std::string Errno(const char* what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

void SetTimeouts(int sock, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

std::string EncodeAttachReply(const AttachReply& reply) {
  std::string out(1, reply.ok ? '\0' : '\1');
  if (reply.ok) {
    out += reply.token;
    out.resize(1 + kAttachTokenBytes, '\0');
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((reply.size >> (8 * i)) & 0xff));
  } else {
    out += reply.error.substr(0, kMaxAttachErrorBytes);
  }
  return out;
}

absl::StatusOr<AttachReply> ParseAttachReply(absl::string_view bytes) {
  if (bytes.empty()) return absl::InvalidArgumentError("attach reply is empty");
  AttachReply reply;
  if (bytes[0] == '\0') {
    if (bytes.size() != kAttachOkReplyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("attach reply has ", bytes.size(), " bytes; an ok reply has ", kAttachOkReplyBytes));
    }
    reply.ok = true;
    reply.token = std::string(bytes.substr(1, kAttachTokenBytes));
    for (int i = 0; i < 8; ++i) {
      reply.size |= uint64_t{static_cast<unsigned char>(bytes[1 + kAttachTokenBytes + i])} << (8 * i);
    }
    return reply;
  }
  if (bytes[0] == '\1') {
    if (bytes.size() > kMaxAttachReplyBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("attach reply has ", bytes.size(), " bytes; at most ", kMaxAttachReplyBytes));
    }
    reply.error = std::string(bytes.substr(1));
    return reply;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("attach reply status byte ", static_cast<int>(static_cast<unsigned char>(bytes[0])), " unknown"));
}

absl::Status CheckAttachRequest(absl::string_view bytes) {
  if (bytes.size() != kAttachRequestBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach request has ", bytes.size(), " bytes; must be ", kAttachRequestBytes));
  }
  if (bytes != absl::string_view(kAttachMagic, kAttachRequestBytes)) {
    return absl::InvalidArgumentError("attach request is not \"DKVRGN01\" (another protocol or version)");
  }
  return absl::OkStatus();
}

absl::Status SendWithFd(int sock, absl::string_view bytes, int fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::UnavailableError(Errno("sendmsg"));
  if (static_cast<size_t>(n) != bytes.size()) return absl::UnavailableError("sendmsg: short write");
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReceiveWithFd(int sock, size_t max_bytes, int* fd) {
  *fd = -1;
  std::string buffer(max_bytes, '\0');
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a few descriptors, so that extra ones arrive (and are closed)
  // rather than truncate the message.
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return absl::UnavailableError(Errno("recvmsg"));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*fd < 0) {
        *fd = received;
      } else {
        close(received);
      }
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return absl::InvalidArgumentError("more file descriptors than one came with the attach request");
  }
  buffer.resize(static_cast<size_t>(n));
  return buffer;
}

absl::StatusOr<AttachReply> AttachFd(const std::string& socket_path, int fd, absl::Duration timeout) {
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("region socket path \"", socket_path, "\" is empty or too long"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::UnavailableError(Errno("socket"));
  SetTimeouts(sock, timeout);
  absl::StatusOr<AttachReply> result = [&]() -> absl::StatusOr<AttachReply> {
    if (connect(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(absl::StrCat("region socket ", socket_path, ": ", Errno("connect")));
    }
    if (absl::Status st = SendWithFd(sock, absl::string_view(kAttachMagic, kAttachRequestBytes), fd); !st.ok()) {
      return st;
    }
    // The reply may come in pieces: read to the server's close.
    std::string reply;
    char buf[kMaxAttachReplyBytes + 1];
    while (reply.size() <= kMaxAttachReplyBytes) {
      ssize_t n = recv(sock, buf, sizeof(buf), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::UnavailableError(absl::StrCat("region socket ", socket_path, ": ", Errno("recv")));
      if (n == 0) break;
      reply.append(buf, static_cast<size_t>(n));
    }
    absl::StatusOr<AttachReply> parsed = ParseAttachReply(reply);
    if (!parsed.ok())
      return absl::UnavailableError(absl::StrCat("region socket ", socket_path, ": ", parsed.status().message()));
    if (!parsed->ok) return absl::FailedPreconditionError(absl::StrCat("region socket refused: ", parsed->error));
    return parsed;
  }();
  close(sock);
  return result;
}

absl::StatusOr<int> CreateSealedMemfd(const std::string& name, uint64_t bytes) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::InternalError(Errno("memfd_create"));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    absl::Status st = absl::ResourceExhaustedError(Errno("ftruncate of the memfd"));
    close(fd);
    return st;
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    absl::Status st = absl::InternalError(Errno("F_ADD_SEALS"));
    close(fd);
    return st;
  }
  return fd;
}

}  // namespace driftkv
