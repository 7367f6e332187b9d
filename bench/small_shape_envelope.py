#!/usr/bin/env python3
"""D-Quant's quality against the stream length n = kv_heads * head_dim.

Runs `driftkv-codec eval` (default containers) for n in 64..2048 on
  synthetic: i.i.d. N(0, 1) keys, values and queries (4 layers x 1024
             tokens, 128 queries, 2 query heads per KV head; heads of 128,
             n = 64 is 1 head of 64), seed 1;
  real:      the captured fixture (DRIFTKV_EVAL_DIR, else ../shared/eval
             beside the repository), regrouped into streams of n: n = 128
             one KV head, 256 two, 512 the model's four, 1024 and 2048 the
             heads of 2 and 4 layers side by side (each keeps its own
             queries, so attention is per real head); n = 64 splits each
             head into dims 0-63 and 64-127 (not a real head: RoPE pairs
             dim i with i + 64, so no attention figure).
and prints a markdown table (nmse_k, nmse_v, attn_rel_err, stored bits
per value as `Info` counts them). Each n < 512 is run twice on the same
data: at today's default containers and at the default of earlier releases
(BEFORE, pinned with --k-bytes/--v-bytes; --no-before skips it).

  bench/small_shape_envelope.py --codec-bin bazel-bin/tools/driftkv-codec [--out DIR] [--no-before]
"""
import argparse
import json
import os
import subprocess
import tempfile

import numpy as np

NS = [64, 128, 256, 512, 1024, 2048]

# Key and value payload bytes of the default containers of n < 512 before
# they coded the reference's bits per value (LegacyDefaultPayloadBytes,
# docs/api.md "Default containers", column "before"); n >= 512 kept theirs.
BEFORE = {64: (18, 15), 128: (40, 25), 256: (80, 56)}


def eval_dir(repo):
    d = os.environ.get("DRIFTKV_EVAL_DIR") or os.path.join(repo, "..", "shared", "eval")
    return d if os.path.exists(os.path.join(d, "fixture_public.k.bin")) else None


def run(codec_bin, out, name, k, v, q, q_heads, extra=()):
    """k, v: [L][T][H][D]; q: [L][Q][QH][D] or None; extra: more eval flags. Returns eval's JSON."""
    paths = {}
    for what, x in (("k", k), ("v", v), ("q", q)):
        if x is None:
            continue
        paths[what] = os.path.join(out, f"{name}.{what}.bin")
        np.ascontiguousarray(x, dtype=np.float32).tofile(paths[what])
    cmd = [codec_bin, "eval", "--keys", paths["k"], "--values", paths["v"], "--shape", ",".join(map(str, k.shape)),
           "--json", *extra]
    if q is not None:
        cmd += ["--queries", paths["q"], "--q-heads", str(q_heads)]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    for p in paths.values():
        os.remove(p)
    return json.loads(res.stdout.strip().splitlines()[-1])


def synthetic(n, rng):
    h, d = (1, 64) if n == 64 else (n // 128, 128)
    layers, tokens, queries = 4, 1024, 128
    k = rng.standard_normal((layers, tokens, h, d), dtype=np.float32)
    v = rng.standard_normal((layers, tokens, h, d), dtype=np.float32)
    q = rng.standard_normal((layers, queries, 2 * h, d), dtype=np.float32)
    return k, v, q, 2 * h


def real(n, e):
    k = np.fromfile(os.path.join(e, "fixture_public.k.bin"), np.float16).reshape(2, 4, 1024, 4, 128)
    v = np.fromfile(os.path.join(e, "fixture_public.v.bin"), np.float16).reshape(2, 4, 1024, 4, 128)
    q = np.fromfile(os.path.join(e, "fixture_public.q.bin"), np.float16).reshape(2, 4, 128, 8, 128)
    k, v, q = (x.astype(np.float32) for x in (k, v, q))
    if n == 64:  # [s][l][t][h][2][64] -> streams [(s, l, h, half)][t][1][64]
        kk = k.reshape(2, 4, 1024, 4, 2, 64).transpose(0, 1, 3, 4, 2, 5).reshape(-1, 1024, 1, 64)
        vv = v.reshape(2, 4, 1024, 4, 2, 64).transpose(0, 1, 3, 4, 2, 5).reshape(-1, 1024, 1, 64)
        return kk, vv, None, 0
    if n <= 512:  # groups of g heads of one layer; query heads 2h, 2h+1 read KV head h
        g = n // 128
        kk = k.reshape(2, 4, 1024, 4 // g, g, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 1024, g, 128)
        vv = v.reshape(2, 4, 1024, 4 // g, g, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 1024, g, 128)
        qq = q.reshape(2, 4, 128, 4 // g, 2 * g, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 128, 2 * g, 128)
        return kk, vv, qq, 2 * g
    m = n // 512  # layers side by side: KV head (l, h), query head (l, qh) reads (l, qh // 2)
    kk = k.reshape(2, 4 // m, m, 1024, 4, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 1024, 4 * m, 128)
    vv = v.reshape(2, 4 // m, m, 1024, 4, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 1024, 4 * m, 128)
    qq = q.reshape(2, 4 // m, m, 128, 8, 128).transpose(0, 1, 3, 2, 4, 5).reshape(-1, 128, 8 * m, 128)
    return kk, vv, qq, 8 * m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec-bin", required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-before", action="store_true", help="skip the runs at the earlier containers")
    a = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = a.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    e = eval_dir(repo)
    rng = np.random.default_rng(1)
    rows = []
    for n in NS:
        for data in ("synthetic", "real"):
            if data == "real" and e is None:
                continue
            k, v, q, qh = synthetic(n, rng) if data == "synthetic" else real(n, e)
            r = run(a.codec_bin, out, f"{data}{n}", k, v, q, qh)
            rows.append((n, data, k.shape, "default", r))
            if n in BEFORE and not a.no_before:
                kb, vb = BEFORE[n]
                r = run(a.codec_bin, out, f"{data}{n}", k, v, q, qh, ["--k-bytes", str(kb), "--v-bytes", str(vb)])
                rows.append((n, data, k.shape, f"before: {kb}, {vb}", r))
    print("| n | data | shape L,T,H,D | containers | nmse_k | nmse_v | attn_rel_err | bits/value k, v |")
    print("| ---: | --- | --- | --- | ---: | ---: | ---: | --- |")
    for n, data, shape, containers, r in rows:
        attn = r.get("attn_rel_err")
        bpv = r.get("bits_per_value", {})
        print(f"| {n} | {data} | {','.join(map(str, shape))} | {containers} | {r['nmse_k']:.4f} | "
              f"{r['nmse_v']:.4f} | {'-' if attn is None else f'{attn:.3f}'} | "
              f"{bpv.get('k', 0):.3f}, {bpv.get('v', 0):.3f} |")
    with open(os.path.join(out, "envelope.json"), "w") as f:
        json.dump([{"n": n, "data": d, "shape": list(s), "containers": c, "eval": r} for n, d, s, c, r in rows], f,
                  indent=1)


if __name__ == "__main__":
    main()
