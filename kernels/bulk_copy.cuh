// Bulk copies into shared memory that complete on an mbarrier, and the
// fence before them (PTX ISA 8.0, sm_90): what the level
// attention kernel streams its pages with.
#ifndef DRIFTKV_KERNELS_BULK_COPY_CUH_
#define DRIFTKV_KERNELS_BULK_COPY_CUH_

#include <cstdint>

namespace driftkv {
namespace gpu {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void MbarInit(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarExpect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
}
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n\t.reg .pred p;\n\tWAIT_%=:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT_%=;\n\t}\n" ::"r"(SmemAddr(bar)),
      "r"(phase)
      : "memory");
}
// Orders this thread's earlier generic-proxy accesses of shared memory
// before later bulk copies (async proxy) into it.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_BULK_COPY_CUH_
