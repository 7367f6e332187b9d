#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "tiers/disk_store_internal.h"

namespace driftkv {
namespace tiers {
namespace disk_io {

std::string Errno(absl::string_view what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

absl::Status IoError(absl::string_view what, const std::string& path) {
  const bool full = errno == ENOSPC || errno == EDQUOT;
  std::string message = Errno(what, path);
  return full ? absl::ResourceExhaustedError(absl::StrCat("disk full: ", message)) : absl::UnavailableError(message);
}

bool WriteAll(FileIo* io, int fd, const uint8_t* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = io->Pwrite(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = ENOSPC;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

bool ReadAll(FileIo* io, int fd, uint8_t* data, size_t size, uint64_t offset) {
  while (size > 0) {
    const ssize_t n = io->Pread(fd, data, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;  // the file ends before the record
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return true;
}

}  // namespace disk_io
}  // namespace tiers
}  // namespace driftkv
