#include "tiers/file_io.h"

#include <fcntl.h>
#include <unistd.h>

namespace driftkv {
namespace tiers {
namespace {

class PosixFileIo final : public FileIo {
 public:
  int Open(const char* path, int flags, mode_t mode) override { return ::open(path, flags, mode); }
  ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) override {
    return ::pwrite(fd, data, size, offset);
  }
  ssize_t Pwritev(int fd, const struct iovec* iov, int count, off_t offset) override {
    return ::pwritev(fd, iov, count, offset);
  }
  ssize_t Pread(int fd, void* data, size_t size, off_t offset) override { return ::pread(fd, data, size, offset); }
  int Fdatasync(int fd) override { return ::fdatasync(fd); }
  int Ftruncate(int fd, off_t size) override { return ::ftruncate(fd, size); }
  int Fallocate(int fd, off_t size) override { return ::fallocate(fd, 0, 0, size); }
  int Close(int fd) override { return ::close(fd); }
  int Unlink(const char* path) override { return ::unlink(path); }
};

}  // namespace

FileIo* FileIo::Posix() {
  static PosixFileIo* io = new PosixFileIo();
  return io;
}

}  // namespace tiers
}  // namespace driftkv
