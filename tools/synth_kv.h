// Synthetic KV tensors for the quality benchmark (issue 3), written as raw
// f32 files that `driftkv-codec eval|sweep` read.
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
// Layer l uses seed + l; all randomness comes from std::mt19937_64 with
// distributions computed here (Box-Muller), so a seed gives the same files
// everywhere.
#ifndef DRIFTKV_TOOLS_SYNTH_KV_H_
#define DRIFTKV_TOOLS_SYNTH_KV_H_

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
  int query_tokens = 128;    // queries at positions tokens - query_tokens + i
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

}  // namespace driftkv

#endif  // DRIFTKV_TOOLS_SYNTH_KV_H_
