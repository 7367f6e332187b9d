#!/usr/bin/python3
"""Captures calibration and evaluation tensors for WUSH-KV (docs/quality.md) from the
eval model on held-out *Persuasion*, keeping the two sets of text apart.

Text: Persuasion from Debian's r-cran-janeaustenr, tokenized in one piece
(python/examples/tokenizer.py, checked against fixture_public.json's token ids). Every window
is BOS + 1023 consecutive tokens.

  evaluation windows: the two fixture windows (fixture_public.json's
    text_token_range) and six of bench/kl_eval.py's 24 default windows
    (indices 2, 6, 10, 14, 18, 22);
  calibration windows: --calib windows, each centred in a gap between two
    consecutive kl_eval windows, skipping any that would overlap an
    evaluation window or one of kl_eval's 24 windows (so the KL evaluation
    never sees calibration text either).
The script asserts that no calibration token index lies in any evaluation
or kl_eval window and prints the ranges it used.

Outputs (raw little-endian, C order, no header) in --out:
  calib{0,1}.{k,v}.f16  [layer][tokens][kv_head][head_dim], the calibration
                        windows split in two halves (two --keys/--values/
                        --queries triples for driftkv-calibrate);
  calib{0,1}.q.f16      [layer][tokens][q_head][head_dim], post-RoPE queries
                        of every position;
  wo.f32                [layer][hidden][q_heads*head_dim], o_proj weights;
  eval.{k,v}.f16        [window][layer][1024][kv_head][head_dim];
  eval.q.f16            [window][layer][128][q_head][head_dim], positions
                        896..1023 (the fixture's layout);
  ranges.json           token ranges of every window.
usage: bench/wush_capture.py --out DIR [--calib 16]
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
from eval_data import check_tokens, eval_dir, persuasion_text  # noqa: E402
from kl_eval import WINDOW  # noqa: E402
from llama import Llama  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

SPAN = WINDOW - 1
EVAL_QUERIES = 128


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--calib", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    model = Llama(os.path.join(eval_dir(), "model"))
    tok = Tokenizer(os.path.join(eval_dir(), "model", "tokenizer.json"))
    ids = tok.encode(persuasion_text(""))
    fixture = json.load(open(os.path.join(eval_dir(), "fixture_public.json")))
    check_tokens(ids, os.path.join(eval_dir(), "fixture_public.json"))

    kl_starts = [round(i * (len(ids) - SPAN) / 23) for i in range(24)]
    kl_ranges = [(s, s + SPAN) for s in kl_starts]
    eval_ranges = [tuple(s["text_token_range"]) for s in fixture["sequences"]]
    eval_ranges += [kl_ranges[i] for i in (2, 6, 10, 14, 18, 22)]
    calib = []
    for a, b in zip(kl_ranges, kl_ranges[1:]):
        s = (a[1] + b[0]) // 2 - SPAN // 2
        r = (s, s + SPAN)
        if any(overlaps(r, e) for e in eval_ranges + kl_ranges):
            continue
        calib.append(r)
    if len(calib) < args.calib:
        raise SystemExit(f"only {len(calib)} disjoint calibration windows")
    step = len(calib) / args.calib
    calib = [calib[int(i * step)] for i in range(args.calib)]
    for r in calib:
        assert not any(overlaps(r, e) for e in eval_ranges + kl_ranges), r

    L, H, N, D = model.layers, model.kv_heads, model.q_heads, model.head_dim
    halves = [calib[: len(calib) // 2], calib[len(calib) // 2:]]
    for part, ranges in enumerate(halves):
        T = len(ranges) * WINDOW
        k = np.empty((L, T, H, D), np.float16)
        v = np.empty_like(k)
        q = np.empty((L, T, N, D), np.float16)
        for w, (s, e) in enumerate(ranges):
            tensors = model.window_qkv(torch.tensor([0] + ids[s:e]))
            for l, (ql, kl, vl) in enumerate(tensors):
                sl = slice(w * WINDOW, (w + 1) * WINDOW)
                q[l, sl], k[l, sl], v[l, sl] = ql.numpy(), kl.numpy(), vl.numpy()
        for name, t in (("k", k), ("v", v), ("q", q)):
            t.tofile(os.path.join(args.out, f"calib{part}.{name}.f16"))
        print(f"calib{part}: {len(ranges)} windows, shape {L},{T},{H},{D}", file=sys.stderr)

    wo = np.stack([model.w[f"model.layers.{l}.self_attn.o_proj.weight"].numpy()
                   for l in range(L)]).astype(np.float32)
    wo.tofile(os.path.join(args.out, "wo.f32"))

    W = len(eval_ranges)
    ek = np.empty((W, L, WINDOW, H, D), np.float16)
    ev = np.empty_like(ek)
    eq = np.empty((W, L, EVAL_QUERIES, N, D), np.float16)
    for w, (s, e) in enumerate(eval_ranges):
        tensors = model.window_qkv(torch.tensor([0] + ids[s:e]))
        for l, (ql, kl, vl) in enumerate(tensors):
            ek[w, l], ev[w, l] = kl.numpy(), vl.numpy()
            eq[w, l] = ql[WINDOW - EVAL_QUERIES:].numpy()
    for name, t in (("k", ek), ("v", ev), ("q", eq)):
        t.tofile(os.path.join(args.out, f"eval.{name}.f16"))
    json.dump({"tokens": len(ids), "calibration": halves, "evaluation": eval_ranges,
               "kl_eval_windows": kl_ranges}, open(os.path.join(args.out, "ranges.json"), "w"),
              indent=1)
    print(f"eval: {W} windows; calibration ranges {calib}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
