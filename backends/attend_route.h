// How a backend attended one item (AttendJob::route), for the service's
// driftkv_attention_items_by_route_total (docs/metrics.md): on its level
// pages (the hot tier); cold pages promoted into the device's scratch of
// level pages and attended by the level kernel; cold pages by the device's
// fused kernel (the scratch off, or the item larger than all of it); cold
// pages on the host. kUnreported: a backend that does not say.
#ifndef DRIFTKV_BACKENDS_ATTEND_ROUTE_H_
#define DRIFTKV_BACKENDS_ATTEND_ROUTE_H_

namespace driftkv {

enum class AttendRoute : int { kUnreported = 0, kHot, kColdLevels, kColdFused, kColdHost, kCount };

inline const char* AttendRouteName(AttendRoute r) {
  static const char* const kNames[] = {"unreported", "hot", "cold_levels", "cold_fused", "cold_host"};
  return kNames[static_cast<int>(r)];
}

}  // namespace driftkv

#endif  // DRIFTKV_BACKENDS_ATTEND_ROUTE_H_
