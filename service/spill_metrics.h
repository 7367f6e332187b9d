// The Prometheus series of one level below the pool (docs/metrics.md,
// "Levels"), every one labelled with the level: "host" or "disk".
// Registered in the server's registry (Metrics::registry()); prometheus-cpp
// metrics are thread-safe.
#ifndef DRIFTKV_SERVICE_SPILL_METRICS_H_
#define DRIFTKV_SERVICE_SPILL_METRICS_H_

#include <string>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "service/metrics.h"

namespace driftkv {

struct SpillMetrics {
  SpillMetrics(Metrics& metrics, const std::string& level);

  prometheus::Gauge* pages;           // driftkv_level_pages: pages stored on the level
  prometheus::Gauge* bytes;           // driftkv_level_bytes: bytes its budget counts (host slots, segment files)
  prometheus::Gauge* capacity_bytes;  // driftkv_level_capacity_bytes: the budget
  prometheus::Gauge* sequences;       // driftkv_level_sequences: sequences whose pages are there
  // driftkv_level_moved_pages_total / _moved_bytes_total{direction="down"|"up"}.
  prometheus::Counter* moved_pages[2];
  prometheus::Counter* moved_bytes[2];
  // driftkv_level_move_failures_total{direction}: a sequence that could not
  // move (down: it stays in the pool; up: its request fails).
  prometheus::Counter* move_failures[2];
  prometheus::Counter* checksum_failures;  // driftkv_level_checksum_failures_total
  prometheus::Histogram* restore_seconds;  // driftkv_level_restore_seconds: one sequence back into the pool
  // driftkv_level_move_down_seconds: one sequence's pages copied down to
  // the level (from the pool, or from the host level to disk) and
  // recorded there.
  prometheus::Histogram* move_down_seconds;
};

enum SpillDirection : int { kMoveDown = 0, kMoveUp = 1 };

}  // namespace driftkv

#endif  // DRIFTKV_SERVICE_SPILL_METRICS_H_
