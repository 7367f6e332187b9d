// DRIFTKV_HOST_DEVICE marks a function that both the host compiler and nvcc
// compile (`__host__ __device__` under nvcc, nothing otherwise), for the
// headers of codec/ and kernels/ whose arithmetic the CPU and the GPU share.
#ifndef DRIFTKV_CODEC_HOST_DEVICE_H_
#define DRIFTKV_CODEC_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define DRIFTKV_HOST_DEVICE __host__ __device__
#else
#define DRIFTKV_HOST_DEVICE
#endif

#endif  // DRIFTKV_CODEC_HOST_DEVICE_H_
