// `driftkv fixture`: the service driven with the real fixture (keys,
// values and queries captured from a model), its attention against exact
// float64 attention and, with --local_check, against the service's storage
// rule replayed with the codec in-process (eval/service_replay.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "cli/cli.h"
#include "codec/dquant_codec.h"
#include "eval/service_replay.h"
#include "wire/tensor.h"

ABSL_FLAG(std::string, fixture, "",
          "fixture: path prefix of the fixture's .k.bin/.v.bin/.q.bin files (required; "
          "e.g. ../shared/eval/fixture_public)");
ABSL_FLAG(int, prefill, 896, "fixture: tokens pushed before the decode steps");
ABSL_FLAG(bool, local_check, true, "fixture: also replay the service's storage rule with the codec in-process");

namespace driftkv {
namespace cli {

int Fixture(Client& client) {
  absl::StatusOr<v1::InfoResponse> info = client.Info();
  if (!info.ok()) return Fail(info.status());
  constexpr int kSeqs = 2, kLayers = 4, kTokens = 1024, kKvHeads = 4, kD = 128, kQueries = 128, kQHeads = 8;
  constexpr size_t kN = kKvHeads * kD;
  if (info->layers() != kLayers || info->kv_heads() != kKvHeads || info->head_dim() != kD) {
    return Fail(
        absl::FailedPreconditionError(absl::StrCat("the fixture is 4 layers x 4 kv_heads x 128; the server serves ",
                                                   info->layers(), " x ", info->kv_heads(), " x ", info->head_dim())));
  }
  if (absl::GetFlag(FLAGS_fixture).empty()) {
    return Fail(absl::InvalidArgumentError(
        "fixture: --fixture PREFIX is required (the files PREFIX.k.bin, .v.bin, .q.bin, e.g. "
        "../shared/eval/fixture_public)"));
  }
  const int prefill = absl::GetFlag(FLAGS_prefill);
  if (prefill < 1 || prefill + kQueries > kTokens) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--prefill ", prefill, " out of range [1, 896]")));
  }
  std::string raw[3];
  const char* ext[3] = {".k.bin", ".v.bin", ".q.bin"};
  for (int i = 0; i < 3; ++i) {
    std::ifstream in(absl::GetFlag(FLAGS_fixture) + ext[i], std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", absl::GetFlag(FLAGS_fixture), ext[i])));
    raw[i].assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t kv_bytes = static_cast<size_t>(kSeqs) * kLayers * kTokens * kN * 2;
  if (raw[0].size() != kv_bytes || raw[1].size() != kv_bytes ||
      raw[2].size() != static_cast<size_t>(kSeqs) * kLayers * kQueries * kQHeads * kD * 2) {
    return Fail(absl::InvalidArgumentError("fixture files do not have the documented sizes"));
  }
  auto layer_bytes = [&](int i, int s, int l, int t0, int count) {
    const size_t at = ((static_cast<size_t>(s) * kLayers + l) * kTokens + t0) * kN * 2;
    return raw[i].substr(at, static_cast<size_t>(count) * kN * 2);
  };
  const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
  double err[kLayers] = {}, sum[kLayers] = {}, lerr[kLayers] = {}, lsum[kLayers] = {}, diff = 0, dsum = 0;
  absl::StatusOr<DQuantCodec> codec = absl::InvalidArgumentError("unused");
  if (absl::GetFlag(FLAGS_local_check)) {
    DQuantConfig c;
    c.kv_heads = kKvHeads;
    c.head_dim = kD;
    c.key_levels = info->key_levels();
    c.value_levels = info->value_levels();
    c.key_bytes = info->key_payload_bytes();
    c.value_bytes = info->value_payload_bytes();
    c.alpha = info->alpha();
    c.mean_window = info->page_tokens();
    codec = DQuantCodec::Create(c);
    if (!codec.ok()) return Fail(codec.status());
  }
  const int r = info->window_tokens();
  auto t0 = Clock::now();
  double attend_s = 0;
  for (int s = 0; s < kSeqs; ++s) {
    const std::string seq = absl::StrCat("fixture-", s);
    // Prefill: fp16 bytes straight from the files, 128-token chunks, layer-wise.
    std::vector<v1::AppendChunk> chunks;
    for (int t = 0; t < prefill; t += 128) {
      for (int l = 0; l < kLayers; ++l) {
        const int c = std::min(128, prefill - t);
        v1::AppendChunk ch;
        ch.set_sequence_id(seq);
        ch.set_layer(l);
        ch.set_first_token(t);
        ch.set_token_count(c);
        ch.set_dtype(v1::DTYPE_FP16);
        ch.set_keys(layer_bytes(0, s, l, t, c));
        ch.set_values(layer_bytes(1, s, l, t, c));
        ch.set_new_incarnation(t == 0);  // an earlier run released the same id
        chunks.push_back(std::move(ch));
      }
    }
    absl::StatusOr<v1::AppendResponse> a = client.Append(chunks);
    if (!a.ok()) return Fail(a.status());
    // Originals in float, for the exact attention and the local replay.
    std::vector<std::vector<float>> k(kLayers), v(kLayers), q(kLayers);
    std::vector<absl::StatusOr<ServiceReplay>> replay;
    for (int l = 0; l < kLayers; ++l) {
      k[l].resize(kTokens * kN);
      v[l].resize(kTokens * kN);
      q[l].resize(kQueries * kQHeads * kD);
      TensorToFloat(layer_bytes(0, s, l, 0, kTokens), v1::DTYPE_FP16, k[l].size(), k[l].data());
      TensorToFloat(layer_bytes(1, s, l, 0, kTokens), v1::DTYPE_FP16, v[l].size(), v[l].data());
      TensorToFloat(
          raw[2].substr((static_cast<size_t>(s) * kLayers + l) * kQueries * kQHeads * kD * 2, q[l].size() * 2),
          v1::DTYPE_FP16, q[l].size(), q[l].data());
    }
    if (codec.ok()) {
      for (int l = 0; l < kLayers; ++l) {
        replay.push_back(ServiceReplay::Encode(*codec, r, k[l].data(), v[l].data(), kTokens));
        if (!replay.back().ok()) return Fail(replay.back().status());
      }
    }
    Progress progress(absl::StrCat("fixture seq ", s), kQueries);
    AttentionScratch as;
    for (int i = 0; i < kQueries; ++i) {
      const int pos = prefill + i;
      v1::AttendRequest req;
      for (int l = 0; l < kLayers; ++l) {
        v1::AttendItem* it = req.add_items();
        it->set_sequence_id(seq);
        it->set_layer(l);
        it->set_dtype(v1::DTYPE_FP16);
        it->set_q_heads(kQHeads);
        // Query i of the fixture sits at position 896 + i; with another
        // --prefill it is reused at position prefill + i.
        it->set_query(raw[2].substr(((static_cast<size_t>(s) * kLayers + l) * kQueries + i) * kQHeads * kD * 2,
                                    kQHeads * kD * 2));
        it->set_new_key(layer_bytes(0, s, l, pos, 1));
        it->set_new_value(layer_bytes(1, s, l, pos, 1));
        it->set_new_token_index(pos);
      }
      const auto a = Clock::now();
      absl::StatusOr<v1::AttendResponse> resp = client.Attend(req);
      attend_s += SecondsSince(a);
      if (!resp.ok()) return Fail(resp.status());
      for (int l = 0; l < kLayers; ++l) {
        const std::vector<float> out = OutputFloats(resp->results(l));
        const float* qi = q[l].data() + static_cast<size_t>(i) * kQHeads * kD;
        AccumulateError(out, k[l].data(), v[l].data(), pos + 1, kKvHeads, kD, qi, kQHeads, scale, &err[l], &sum[l]);
        if (codec.ok()) {
          std::vector<float> local(kQHeads * kD), lse(kQHeads);
          absl::Status st =
              replay[l]->Attend(pos + 1, qi, kQHeads, static_cast<float>(scale), local.data(), lse.data(), &as);
          if (!st.ok()) return Fail(st);
          AccumulateError(local, k[l].data(), v[l].data(), pos + 1, kKvHeads, kD, qi, kQHeads, scale, &lerr[l],
                          &lsum[l]);
          for (size_t e = 0; e < out.size(); ++e) {
            diff += (out[e] - local[e]) * (out[e] - local[e]);
            dsum += local[e] * local[e];
          }
        }
      }
      progress.Update(i + 1);
    }
    progress.Done();
    if (!client.Release(seq).ok()) return 1;
  }
  double te = 0, ts = 0, tle = 0, tls = 0;
  std::printf("fixture %s: 2 sequences x 4 layers, prefill %d tokens, %d decode steps (new token + query each)\n",
              absl::GetFlag(FLAGS_fixture).c_str(), prefill, kQueries);
  for (int l = 0; l < kLayers; ++l) {
    std::printf("  layer %d: service attn_rel_err %.5f", l, std::sqrt(err[l] / sum[l]));
    if (codec.ok()) std::printf(", in-process codec replay %.5f", std::sqrt(lerr[l] / lsum[l]));
    std::printf("\n");
    te += err[l];
    ts += sum[l];
    tle += lerr[l];
    tls += lsum[l];
  }
  std::printf("  all layers: service attn_rel_err %.5f", std::sqrt(te / ts));
  if (codec.ok()) {
    std::printf(", in-process codec replay %.5f, service vs replay relative L2 difference %.3g", std::sqrt(tle / tls),
                std::sqrt(diff / dsum));
  }
  std::printf("\n  %.2f s total, Attend %.2f ms per call of 4 items on average\n", SecondsSince(t0),
              attend_s / (kSeqs * kQueries) * 1e3);
  return 0;
}

}  // namespace cli
}  // namespace driftkv
