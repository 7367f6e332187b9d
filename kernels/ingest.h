// Device ingest (docs/nccl.md): raw wire tensors (bf16, fp16 or f32, the
// proto DType numbers) already in device memory, checked and rounded to
// bf16 on the GPU with the host's rules (wire/tensor.h CheckValues,
// wire/half.h FloatToBf16), so that a chunk stored from device memory is
// bit-identical to the same chunk sent through gRPC.
#ifndef DRIFTKV_KERNELS_INGEST_H_
#define DRIFTKV_KERNELS_INGEST_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace driftkv {
namespace gpu {

struct IngestParams {
  const void* src_dev = nullptr;  // `elements` values of `dtype`
  int dtype = 0;                  // 1 bf16, 2 fp16, 3 f32
  size_t elements = 0;
  // Check: the smallest index whose value is not finite or has |x| > limit
  // is atomically min-ed into *first_bad_dev (left as it is when none).
  float limit = 0.0f;
  unsigned long long* first_bad_dev = nullptr;  // may be null: no check
  // Convert: out_dev[i] = the value rounded to bf16, as float. May be null.
  float* out_dev = nullptr;
};

absl::Status LaunchIngest(const IngestParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_INGEST_H_
