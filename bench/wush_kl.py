#!/usr/bin/python3
"""Model-level KL of codecs behind the identity, Hadamard and WUSH transforms
(docs/quality.md), with bench/kl_eval.py's protocol and windows: 24 windows of
held-out Persuasion, cache of the first 768 positions encoded and decoded by
`driftkv-codec encode|decode --transform T [--transforms F]`, forward KL of
the next-token distributions over positions 768..1023, per window.

The transforms must be calibrated on text disjoint from these windows
(bench/wush_capture.py guarantees it). The cache file is laid out
[window][layer], so tensor layer i uses model layer i % 4 of the transforms
(driftkv-codec's rule without --layer).

usage: bench/wush_kl.py --codec-bin PATH/driftkv-codec --transforms F [--windows 24] [--out DIR]
       [--codecs int,dquant] [--kinds identity,hadamard,wush]
(--codecs keeps the CODECS entries whose label starts with one of the names;
the WUSH/Hadamard ratio table needs both kinds in the same run.)
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
from eval_data import check_tokens, eval_dir, persuasion_text  # noqa: E402
from kl_eval import WINDOW, geo_ratio, kl_per_doc  # noqa: E402
from llama import Llama  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

CODECS = [
    ("int", ["--bits", "2", "--group", "128"], "int INT2"),
    ("int", ["--bits", "4", "--group", "128"], "int INT4"),
    ("dquant", [], "dquant default"),
    ("dquant", ["--k-bytes", "140", "--v-bytes", "96", "--k-levels", "6", "--v-levels", "5"], "dquant 1.96 point"),
]


def run(binary, name, flags, transform, transforms, prefix, shape, work):
    tflags = ["--transform", transform] + (["--transforms", transforms] if transform == "wush" else [])
    pool = os.path.join(work, "pool")
    cmd = [binary, "encode", "--codec", name, *flags, *tflags, "--keys", prefix + ".k", "--values",
           prefix + ".v", "--shape", shape, "--out", pool, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{r.stderr}")
    stats = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))
    out = os.path.join(work, "decoded")
    r = subprocess.run([binary, "decode", "--in", pool, "--out", out, *tflags], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"decode: {r.stderr}")
    return stats, np.fromfile(out + ".k", dtype=np.float32), np.fromfile(out + ".v", dtype=np.float32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec-bin", required=True)
    ap.add_argument("--transforms", required=True)
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--context", type=int, default=768)
    ap.add_argument("--bootstrap", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    ap.add_argument("--codecs", default="int,dquant")
    ap.add_argument("--kinds", default="identity,hadamard,wush")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.time()
    model = Llama(os.path.join(eval_dir(), "model"))
    tok = Tokenizer(os.path.join(eval_dir(), "model", "tokenizer.json"))
    ids = tok.encode(persuasion_text(""))
    check_tokens(ids, os.path.join(eval_dir(), "fixture_public.json"))
    span = WINDOW - 1
    starts = [round(i * (len(ids) - span) / max(1, args.windows - 1)) for i in range(args.windows)]
    windows = [torch.tensor([0] + ids[s:s + span]) for s in starts]
    ctx, L, H, D = args.context, model.layers, model.kv_heads, model.head_dim
    work = tempfile.mkdtemp(prefix="wush_kl_")
    ref_logp = []
    k_all = np.empty((len(windows), L, ctx, H, D), dtype=np.float32)
    v_all = np.empty_like(k_all)
    for w, wids in enumerate(windows):
        logits, kv = model.forward_full(wids)
        ref_logp.append(torch.log_softmax(logits[ctx:].double(), -1))
        for l, (k, v) in enumerate(kv):
            k_all[w, l], v_all[w, l] = k[:ctx].numpy(), v[:ctx].numpy()
    prefix = os.path.join(work, "cache")
    k_all.tofile(prefix + ".k")
    v_all.tofile(prefix + ".v")
    shape = f"{len(windows) * L},{ctx},{H},{D}"
    results = {}
    lines = [f"Model KL, {len(windows)} windows of Persuasion (bench/kl_eval.py's), context {ctx}, "
             f"KL over {WINDOW - ctx} positions, no bf16 window", "",
             "| codec | transform | bits/value | mean KL (nats/token) |", "|---|---|---|---|"]
    codecs = [c for c in CODECS if any(c[2].startswith(p) for p in args.codecs.split(","))]
    kinds = args.kinds.split(",")
    for name, flags, label in codecs:
        for transform in kinds:
            stats, k, v = run(args.codec_bin, name, flags, transform, args.transforms, prefix, shape, work)
            kl = kl_per_doc(model, windows, ref_logp, k, v, ctx, L, H, D)
            results[(label, transform)] = (stats["bits_per_value"]["mean"], kl)
            lines.append(f"| {label} | {transform} | {stats['bits_per_value']['mean']:.3f} | "
                         f"{sum(kl) / len(kl):.5f} |")
            print(lines[-1], f"({time.time() - t0:.0f} s)", file=sys.stderr)
    rng = random.Random(0)
    lines += ["", "| codec | WUSH vs Hadamard: geometric-mean KL ratio | bootstrap 95% | windows where WUSH lower |",
              "|---|---|---|---|"]
    for _, _, label in (codecs if "hadamard" in kinds and "wush" in kinds else []):
        g, lo, hi, wins = geo_ratio(results[(label, "wush")][1], results[(label, "hadamard")][1], args.bootstrap, rng)
        lines.append(f"| {label} | {g:.3f} | [{lo:.3f}, {hi:.3f}] | {wins}/{len(windows)} |")
    report = "\n".join(lines)
    print(report)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        open(os.path.join(args.out, "wush_kl.md"), "w").write(report + "\n")
        json.dump({f"{a}|{b}": {"bits": r[0], "kl": r[1]} for (a, b), r in results.items()},
                  open(os.path.join(args.out, "wush_kl.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
