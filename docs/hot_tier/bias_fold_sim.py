#!/usr/bin/env python3
"""Would biased key levels keep the hot kernel within the float64 rule?

The level kernel turns a 3-bit key field into an exact fp16 level with one
LOP3 (mask, OR an exponent) and one sub.f16x2 (take the exponent's value
away). Leaving the bias in (fields at exponents 128 and 16) saves the
subtraction, and the dot product would lose sum(q' M) afterwards. This
simulates, in float64 with the tensor core's fp32 accumulator (one rounding
per 16-channel k-step), the scores of both ways on the eval fixture's real
keys and queries (Hadamard-rotated, a page's channel mean removed, 8
levels per token) and prints the softmax output's error against float64
attention on the same dequantised keys, relative to its norm. The rule of
the GPU tests is 4 x naive fp32's error + 2e-5 of the norm.

  /usr/bin/python3 docs/hot_tier/bias_fold_sim.py
"""
import os
import pathlib

import numpy as np

here = pathlib.Path(__file__).resolve()
E = pathlib.Path(os.environ.get("DRIFTKV_EVAL_DIR", here.parents[3] / "shared" / "eval"))
k = np.fromfile(E / "fixture_public.k.bin", np.float16).reshape(2, 4, 1024, 4, 128).astype(np.float64)
v = np.fromfile(E / "fixture_public.v.bin", np.float16).reshape(2, 4, 1024, 4, 128).astype(np.float64)
q = np.fromfile(E / "fixture_public.q.bin", np.float16).reshape(2, 4, 128, 8, 128).astype(np.float64)

H = np.array([[1.0]])
while H.shape[0] < 128:
    H = np.block([[H, H], [H, -H]])
H /= np.sqrt(128)

# The exponent a biased field would keep, per pair of a 16-pair group
# (fields at bits 3-5 with 128, at bits 6-8 with 16; pair 15 with 128).
pair_bias = np.array([128, 128, 16, 128, 16] * 3 + [128], float)
chan_bias = np.tile(np.repeat(pair_bias, 2), 4)[:128]


def mma_dot(qv, A):
    acc = np.zeros(A.shape[0], np.float32)
    for ks in range(8):
        s = slice(16 * ks, 16 * ks + 16)
        acc = acc + (A[:, s] * qv[s].astype(np.float64)).sum(1).astype(np.float32)
    return acc.astype(np.float64)


errs = {"exact levels": [], "biased levels": []}
for s in range(2):
    for L in range(4):
        K = k[s, L, :, 0, :] @ H.T
        V = v[s, L, :, 0, :]
        for qi in range(0, 128, 16):
            qq = q[s, L, qi, 0, :] @ H.T
            qf = qq.astype(np.float32)
            for mode in errs:
                got, ref = [], []
                for p in range(8):
                    X = K[128 * p:128 * p + 128]
                    mu = X.mean(0)
                    X = X - mu
                    lo, hi = X.min(1, keepdims=True), X.max(1, keepdims=True)
                    sc = (hi - lo) / 7
                    lev = np.clip(np.round((X - lo) / sc), 0, 7)
                    if mode == "exact levels":
                        d = mma_dot(qf, lev)
                    else:
                        d = mma_dot(qf, lev + chan_bias) - mma_dot(qf, np.tile(chan_bias, (128, 1)))
                    got.append((sc[:, 0] * d + lo[:, 0] * qf.sum() + qf @ mu) / np.sqrt(128))
                    ref.append(((lev * sc + lo + mu) @ qq) / np.sqrt(128))
                g, r = np.concatenate(got), np.concatenate(ref)
                wg, wr = np.exp(g - g.max()), np.exp(r - r.max())
                og, orf = (wg / wg.sum()) @ V, (wr / wr.sum()) @ V
                errs[mode].append(np.linalg.norm(og - orf) / np.linalg.norm(orf))
for mode, e in errs.items():
    print(f"{mode}: output error / norm, median {np.median(e):.2e}, max {np.max(e):.2e} ({len(e)} queries)")
