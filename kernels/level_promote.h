// Promotion of cold D-Quant pages (kernels/attention.h PageLayout) to
// level pages (codec/level_page.h) on the device, byte-identical to the
// CPU's PromotePage.
#ifndef DRIFTKV_KERNELS_LEVEL_PROMOTE_H_
#define DRIFTKV_KERNELS_LEVEL_PROMOTE_H_

#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "codec/level_page.h"
#include "kernels/attention.h"

namespace driftkv {
namespace gpu {

struct PromoteParams {
  const uint8_t* cold_pool_dev = nullptr;
  PageLayout cold;
  uint8_t* hot_pool_dev = nullptr;
  LevelPageLayout hot;
  // 512 words: the key then the value decode table, each entry in
  // kernels/promote_table.h's form (PromoteDecodeTables).
  const uint32_t* tables_dev = nullptr;
  int key_payload = 0;    // C of the key records
  int value_payload = 0;  // C of the value records
  int pages = 0;
  const int32_t* cold_pages_dev = nullptr;  // [pages] source page ids
  const int32_t* hot_pages_dev = nullptr;   // [pages] destination page ids
  const int32_t* tokens_dev = nullptr;      // [pages] tokens held, 1..128
  // [pages] or null: 0, or 1 + the first token whose key or value record
  // does not decode (the page's level blocks are then meaningless).
  int32_t* status_dev = nullptr;
};

absl::Status LaunchPromote(const PromoteParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_PROMOTE_H_
