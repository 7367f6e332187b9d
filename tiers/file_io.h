// The system calls the disk level makes on its segment files, behind an
// interface so that tests can make them fail (ENOSPC, EIO, short writes)
// without a full disk. The default forwards to POSIX. Every method returns
// what the system call would and sets errno the same way.
#ifndef DRIFTKV_TIERS_FILE_IO_H_
#define DRIFTKV_TIERS_FILE_IO_H_

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>

namespace driftkv {
namespace tiers {

class FileIo {
 public:
  virtual ~FileIo() = default;
  virtual int Open(const char* path, int flags, mode_t mode) = 0;
  virtual ssize_t Pwrite(int fd, const void* data, size_t size, off_t offset) = 0;
  virtual ssize_t Pwritev(int fd, const struct iovec* iov, int count, off_t offset) = 0;
  virtual ssize_t Pread(int fd, void* data, size_t size, off_t offset) = 0;
  virtual int Fdatasync(int fd) = 0;
  virtual int Ftruncate(int fd, off_t size) = 0;
  // fallocate(fd, 0, 0, size): blocks reserved and the size set.
  virtual int Fallocate(int fd, off_t size) = 0;
  virtual int Close(int fd) = 0;
  virtual int Unlink(const char* path) = 0;

  // The process-wide POSIX implementation (never destroyed).
  static FileIo* Posix();
};

}  // namespace tiers
}  // namespace driftkv

#endif  // DRIFTKV_TIERS_FILE_IO_H_
