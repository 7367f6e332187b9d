#include "service/spill_metrics.h"

#include <map>
#include <string>

namespace driftkv {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

std::map<std::string, std::string> Direction(const std::string& level, const char* direction) {
  return {{"level", level}, {"direction", direction}};
}

}  // namespace

SpillMetrics::SpillMetrics(Metrics& m, const std::string& level) {
  const std::map<std::string, std::string> labels = {{"level", level}};
  prometheus::Registry& r = *m.registry();
  pages = &BuildGauge()
               .Name("driftkv_level_pages")
               .Help("Pages stored on a level below the pool, by level")
               .Register(r)
               .Add(labels);
  bytes = &BuildGauge()
               .Name("driftkv_level_bytes")
               .Help(
                   "Bytes a level below the pool holds against its budget (host: slots in use; disk: segment files), "
                   "by level")
               .Register(r)
               .Add(labels);
  capacity_bytes = &BuildGauge()
                        .Name("driftkv_level_capacity_bytes")
                        .Help("Budget of a level below the pool, by level")
                        .Register(r)
                        .Add(labels);
  sequences = &BuildGauge()
                   .Name("driftkv_level_sequences")
                   .Help("Sequences whose pages are on a level below the pool, by level")
                   .Register(r)
                   .Add(labels);
  auto& moved = BuildCounter()
                    .Name("driftkv_level_moved_pages_total")
                    .Help("Pages moved between the pool and a level below it, by level and direction")
                    .Register(r);
  auto& moved_b = BuildCounter()
                      .Name("driftkv_level_moved_bytes_total")
                      .Help("Page bytes moved between the pool and a level below it, by level and direction")
                      .Register(r);
  auto& failures = BuildCounter()
                       .Name("driftkv_level_move_failures_total")
                       .Help("Sequences that could not move to or from a level below the pool, by level and direction")
                       .Register(r);
  const char* dirs[2] = {"down", "up"};
  for (int d = 0; d < 2; ++d) {
    moved_pages[d] = &moved.Add(Direction(level, dirs[d]));
    moved_bytes[d] = &moved_b.Add(Direction(level, dirs[d]));
    move_failures[d] = &failures.Add(Direction(level, dirs[d]));
  }
  checksum_failures = &BuildCounter()
                           .Name("driftkv_level_checksum_failures_total")
                           .Help("Pages read back from a level below the pool that failed their CRC-32C (never served)")
                           .Register(r)
                           .Add(labels);
  restore_seconds = &BuildHistogram()
                         .Name("driftkv_level_restore_seconds")
                         .Help("Time to bring one sequence's pages back into the pool from a level, by level")
                         .Register(r)
                         .Add(labels, prometheus::Histogram::BucketBoundaries{0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03,
                                                                              0.1, 0.3, 1.0, 3.0, 10.0});
  move_down_seconds = &BuildHistogram()
                           .Name("driftkv_level_move_down_seconds")
                           .Help("Time to copy one sequence's pages down to a level and record them there, by level")
                           .Register(r)
                           .Add(labels, prometheus::Histogram::BucketBoundaries{0.0001, 0.0003, 0.001, 0.003, 0.01,
                                                                                0.03, 0.1, 0.3, 1.0, 3.0, 10.0});
}

}  // namespace driftkv
