// THE synthetic KV generator of driftkv: every test, benchmark, demo and CLI
// workload that needs KV tensors "with the structure of real ones" draws
// them here (the synth-kv tool writes them as raw f32 files for
// `driftkv-codec eval|sweep`).
//
// kind "iid": keys, values and queries i.i.d. N(0, 1): the easy case where
// every rotation is useless and min-max grids see pure Gaussians.
//
// kind "llm": a caricature of a trained model's cache, with the structure the
// codecs must cope with (all parameters below are SynthParams fields):
//   keys, per layer and KV head, before RoPE:
//     k_t = g_t * (mu + sigma (.) z_t),  z_t ~ N(0, I)
//     mu_j ~ N(0, key_mean^2) per channel (a per-channel key mean);
//     `outlier_channels` channels of each head (on the lowest-frequency RoPE
//     pairs, as in real models) get mean and spread times `outlier_scale`;
//     sigma_j = exp(N(0, channel_spread^2)) (uneven channel scales);
//     g_t = exp(N(0, token_norm_sigma^2)) (uneven token norms); token 0 is an
//     attention sink with g_0 = sink_scale;
//   then RoPE (rotate-half, theta 10000) at the token's position, so the
//   channel means of high-frequency pairs rotate away and low-frequency ones
//   persist, as in post-RoPE caches.
//   values: v_t = g'_t * (sigma' (.) t_nu), t_nu i.i.d. Student-t with
//     `value_dof` degrees of freedom scaled to unit variance (heavier tails
//     than Gaussian), sigma'_j = exp(N(0, channel_spread^2)), g'_t like g_t.
//   queries (q_heads = 2 * kv_heads, head h reads KV head h / 2):
//     q = RoPE(query_align * mu / |mu| * sqrt(head_dim) + N(0, I)) at the
//     query's position, so queries favour the persistent key directions and
//     attention is peaked but not one-hot.
//
// kind "spike" (MakeSpikeCase): the failure mode of the Hadamard rotation
// that WUSH fixes. Keys are Gaussian with channel scales decaying from 2 to
// 0.5 (an anisotropic, RoPE-like bulk) except for rare large spikes
// concentrated in coordinate 0 of a KV head, and queries read that
// coordinate, so the spiky tokens carry much of the attention. A Hadamard
// rotation spreads a spike of size S into d coefficients of size
// ~S/sqrt(d) on top of the Gaussian part, which a 2-bit min-max grid
// quantizes badly; WUSH sees the spike direction in the Gram matrix and the
// query Hessian. Its normal draws use both outputs of each Box-Muller pair.
//
// Layer l uses seed + l; all randomness comes from std::mt19937_64 with
// distributions computed here (Box-Muller), so a seed gives the same data
// everywhere (not so std::normal_distribution, which the library defines).
#ifndef DRIFTKV_EVAL_SYNTHETIC_KV_H_
#define DRIFTKV_EVAL_SYNTHETIC_KV_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace driftkv {

struct SynthParams {
  std::string kind = "llm";  // "llm" or "iid"
  int layers = 4;
  int tokens = 1024;
  int kv_heads = 4;
  int head_dim = 128;
  int query_tokens = 128;  // queries at positions tokens - query_tokens + i
  uint64_t seed = 1;
  // "llm" only:
  double key_mean = 1.0;
  int outlier_channels = 4;  // per head, on the lowest-frequency RoPE pairs
  double outlier_scale = 6.0;
  double channel_spread = 0.5;
  double token_norm_sigma = 0.25;
  double sink_scale = 4.0;
  double value_dof = 5.0;
  double query_align = 1.5;
};

struct SynthKv {
  int q_heads = 0;
  std::vector<float> keys, values;  // [layers][tokens][kv_heads][head_dim]
  std::vector<float> queries;       // [layers][query_tokens][q_heads][head_dim]
};

absl::Status ValidateSynth(const SynthParams& p);
SynthKv GenerateSynth(const SynthParams& p);  // p must validate

// One layer of kind "llm" with the defaults but the given shape and seed:
// keys and values [tokens][kv_heads][head_dim], no queries.
SynthKv SynthLayer(int tokens, int kv_heads, int head_dim, uint64_t seed);

struct SpikeOptions {
  int64_t tokens = 1024;
  int kv_heads = 2;
  int q_heads = 4;
  int head_dim = 128;
  int64_t query_tokens = 128;  // positions tokens - query_tokens ...
  double spike_probability = 0.005;
  double spike = 40.0;      // added to coordinate 0 of a spiky key
  double query_read = 6.0;  // mean of query coordinate 0 (others: sd 0.5)
  uint64_t seed = 1;
};

struct SpikeCase {
  std::vector<float> keys, values;  // [tokens][kv_heads][head_dim]
  std::vector<float> queries;       // [query_tokens][q_heads][head_dim]
};

// Kind "spike" (see above); deterministic for given options.
SpikeCase MakeSpikeCase(const SpikeOptions& o);

}  // namespace driftkv

#endif  // DRIFTKV_EVAL_SYNTHETIC_KV_H_
