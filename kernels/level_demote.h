// Demotion of level pages (codec/level_page.h) back to cold D-Quant pages
// on the device: the same bytes as codec/level_page.cc's DemotePage, with
// no host round trip. Every symbol of a level page was rANS-coded once
// already, so coding the known levels again always fits its record; a page
// that does not (corrupt levels or headers) is reported, not written in
// part: its status names the first failing record and the caller asks the
// CPU's DemotePage for the message.
#ifndef DRIFTKV_KERNELS_LEVEL_DEMOTE_H_
#define DRIFTKV_KERNELS_LEVEL_DEMOTE_H_

#include <cstdint>

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "codec/level_page.h"
#include "codec/rans_encode_step.h"
#include "kernels/attention.h"

namespace driftkv {
namespace gpu {

// A stream's encoding table: symbol m's step (codec/rans_encode_step.h,
// RansTable::encode), f = 1 past `levels` (only a corrupt page has such a
// level, and it is reported) (kernels/codec_bridge.h SetDemoteTables fills
// both from a codec).
struct DemoteTable {
  int levels = 0;
  int payload = 0;  // C, the record's payload bytes
  RansEncodeEntry step[16] = {};
};

struct DemoteParams {
  const uint8_t* hot_pool_dev = nullptr;
  LevelPageLayout hot;
  uint8_t* cold_pool_dev = nullptr;
  PageLayout cold;
  DemoteTable keys, values;
  int pages = 0;
  const int32_t* hot_pages_dev = nullptr;   // [pages] source level page ids
  const int32_t* cold_pages_dev = nullptr;  // [pages] destination cold page ids
  const int32_t* tokens_dev = nullptr;      // [pages] tokens held, 1..128
  // [pages]: 0, or 1 + t (key record of token t) or 1 + 128 + t (value
  // record) for the first record that failed: a level out of range, a grid
  // that is not finite, or levels that do not fit the payload. The failing
  // page's cold bytes are then partly written.
  int32_t* status_dev = nullptr;
};

absl::Status LaunchDemote(const DemoteParams& p, cudaStream_t stream);

}  // namespace gpu
}  // namespace driftkv

#endif  // DRIFTKV_KERNELS_LEVEL_DEMOTE_H_
