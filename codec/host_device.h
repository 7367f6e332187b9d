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

// DRIFTKV_INLINE: inline on the host, forced inline on the device (the
// kernels' helpers, which must not become calls).
#if defined(__CUDACC__)
#define DRIFTKV_INLINE __forceinline__
#else
#define DRIFTKV_INLINE inline
#endif

// DRIFTKV_UNROLL before a loop of constant trip count: nvcc unrolls it
// fully; the host compiler does as it sees fit.
#if defined(__CUDACC__)
#define DRIFTKV_UNROLL _Pragma("unroll")
#else
#define DRIFTKV_UNROLL
#endif

#endif  // DRIFTKV_CODEC_HOST_DEVICE_H_
