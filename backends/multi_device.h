// One backend over several devices (a multi-GPU server, `devices` in the
// config): the pool is split into one partition per device
// (backends/page_pool.h PARTITIONS) and inner backend k owns partition k
// (its device arena holds those pages only). Calls are routed by page id:
// EncodePages, DecodeTokens and EncodeStaged to the pages' owner, Attend
// split into one sub-batch per device, run concurrently, answers in the
// caller's order. A job with no pages (a window only) runs on device 0.
// HOT TIER (backends/backend.h) with `hot_pool`: its partitions are the
// devices' too; a tier move (PromotePages, PromotePagesChecked,
// DemotePages) goes to the device of its cold page (the caller keeps a
// move's two pages on one device), hot reads and sums to the hot page's.
// Device-agnostic: the handler places each sequence on one partition and
// sees one Backend. Staging memory (DEVICE INGEST) is device 0's; the
// owner reads it over the peer link.
#ifndef DRIFTKV_BACKENDS_MULTI_DEVICE_H_
#define DRIFTKV_BACKENDS_MULTI_DEVICE_H_

#include <functional>
#include <memory>
#include <vector>

#include "backends/backend.h"
#include "backends/page_pool.h"

namespace driftkv {

// REQUIRES: inner.size() == pool->partitions() >= 1, and the same for
// `hot_pool` unless null (no hot tier); both outlive the result. With
// `batch_per_device`, each inner backend that
// prefers batched Attend gets its own combining queue
// (backends/attend_batcher.h, `observer` for its metrics), so that the
// devices take their next batches independently, and the result does not
// ask the handler for another queue in front (PrefersBatchedAttend false).
std::unique_ptr<Backend> MakeMultiDeviceBackend(std::vector<std::unique_ptr<Backend>> inner, const PagePool* pool,
                                                const PagePool* hot_pool = nullptr, bool batch_per_device = false,
                                                std::function<void(int calls, int jobs)> observer = nullptr);

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_MULTI_DEVICE_H_
