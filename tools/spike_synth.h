// The seed's failure mode of the Hadamard rotation, as synthetic KV (issue 6):
// keys that are Gaussian except for rare large spikes concentrated in one
// coordinate of each KV head, and queries that read that coordinate, so the
// spiky tokens carry much of the attention. A Hadamard rotation spreads a
// spike of size S into d coefficients of size ~S/sqrt(d) on top of the
// Gaussian part, which a 2-bit min-max grid quantizes badly; WUSH sees the
// spike direction in the Gram matrix and the query Hessian.
#ifndef DRIFTKV_TOOLS_SPIKE_SYNTH_H_
#define DRIFTKV_TOOLS_SPIKE_SYNTH_H_

#include <cstdint>
#include <vector>

namespace driftkv {

struct SpikeOptions {
  int64_t tokens = 1024;
  int kv_heads = 2;
  int q_heads = 4;
  int head_dim = 128;
  int64_t query_tokens = 128;  // positions tokens - query_tokens ...
  double spike_probability = 0.005;
  double spike = 40.0;         // added to coordinate 0 of a spiky key
  double query_read = 6.0;     // mean of query coordinate 0 (others: sd 0.5)
  uint64_t seed = 1;
};

struct SpikeCase {
  std::vector<float> keys, values;  // [tokens][kv_heads][head_dim]
  std::vector<float> queries;       // [query_tokens][q_heads][head_dim]
};

// Deterministic for given options (std::mt19937_64, Box-Muller of our own, so
// the draw does not depend on the standard library's distributions).
SpikeCase MakeSpikeCase(const SpikeOptions& o);

}  // namespace driftkv

#endif  // DRIFTKV_TOOLS_SPIKE_SYNTH_H_
