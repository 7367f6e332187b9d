// CUDA IPC and pinned host regions of the CUDA backend
// (backends/cuda/ipc_regions.h) with a real second process: a child
// cudaMalloc's and fills 1 MiB, sends its cudaIpcMemHandle_t over a pipe,
// and keeps the allocation until the parent is done. The parent opens it,
// reads the child's bytes, is refused a size past the allocation, and pins
// and unpins a sealed memfd mapping. Prints "skipped: no GPU" without one.
// The fork comes before any CUDA call of this process (CUDA does not
// survive a fork).
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "backends/cuda/ipc_regions.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "wire/fd_socket.h"

namespace driftkv {
namespace {

constexpr size_t kBytes = 1 << 20;

// The child: 64 handle bytes (or 64 zero bytes without a GPU) to `out`,
// then waits for a byte on `in`.
[[noreturn]] void Child(int out, int in) {
  char handle[64] = {};
  void* p = nullptr;
  int count = 0;
  if (cudaGetDeviceCount(&count) == cudaSuccess && count > 0 && cudaMalloc(&p, kBytes) == cudaSuccess &&
      cudaMemset(p, 0x3c, kBytes) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess) {
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, p) == cudaSuccess) std::memcpy(handle, &h, sizeof(handle));
  }
  (void)!write(out, handle, sizeof(handle));
  char done;
  (void)!read(in, &done, 1);
  _exit(0);
}

TEST(RegionsGpuTest, OpensAnotherProcesssAllocationAndPinsHostMemory) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(pipe(to_parent), 0);
  ASSERT_EQ(pipe(to_child), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) Child(to_parent[1], to_child[0]);
  char handle[64];
  ASSERT_EQ(read(to_parent[0], handle, sizeof(handle)), 64);
  auto finish = [&] {
    (void)!write(to_child[1], "x", 1);
    int status = 0;
    waitpid(child, &status, 0);
  };
  if (!gpu::GpuAvailable() || std::string(handle, 64) == std::string(64, '\0')) {
    finish();
    SKIP_WITHOUT_GPU();
    GTEST_SKIP() << "the child could not allocate";
  }

  EXPECT_EQ(cuda_backend::OpenIpcMemory(handle, 63, 0, kBytes).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_backend::OpenIpcMemory(handle, 64, 4096, kBytes).status().code(), absl::StatusCode::kInvalidArgument);
  // Past the allocation's end (cudaMalloc rounds 1 MiB to 2 MiB at most).
  EXPECT_EQ(cuda_backend::OpenIpcMemory(handle, 64, 0, 64 << 20).status().code(), absl::StatusCode::kOutOfRange);
  absl::StatusOr<void*> dev = cuda_backend::OpenIpcMemory(handle, 64, 0, kBytes);
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::vector<unsigned char> host(kBytes);
  ASSERT_EQ(cudaMemcpy(host.data(), *dev, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host.front(), 0x3c);
  EXPECT_EQ(host.back(), 0x3c);
  cuda_backend::CloseIpcMemory(*dev);
  finish();

  absl::StatusOr<int> fd = CreateSealedMemfd("pinned", kBytes);
  ASSERT_TRUE(fd.ok());
  void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  absl::Status pinned = cuda_backend::PinHostMemory(p, kBytes);
  ASSERT_TRUE(pinned.ok()) << pinned;
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, kBytes), cudaSuccess);
  std::memset(p, 0x11, kBytes);
  ASSERT_EQ(cudaMemcpy(dst, p, kBytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), dst, kBytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host[12345], 0x11);
  cudaFree(dst);
  cuda_backend::UnpinHostMemory(p);
  munmap(p, kBytes);
  close(*fd);
}

}  // namespace
}  // namespace driftkv
