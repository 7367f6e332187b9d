#!/usr/bin/env python3
"""Finds the value decoder's constants (kernels/level_decode.cuh, Triple).

A digit's floor division is one fused multiply-add whose exact result must
round (fp16, to nearest) to K + floor(n / div) in [1024, 2048) for every
input x = A + n: this tries every fp16 factor within 10% of 1/div and every
fp16 addend, for the bases A the byte permute can give, and prints the
candidates whose exact sums stay farthest from a rounding boundary (the
first column: the largest distance from the rounded value, 0.5 a tie).

  /usr/bin/python3 docs/hot_tier/triple_constants.py
"""
import numpy as np

h = np.arange(0x0001, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)


def search(xs, want, div, name):
    best = []
    cs = h[h < 2048]
    cs = np.concatenate([cs, -cs])
    for r in h[(h > 0.9 / div) & (h < 1.1 / div)]:
        v = xs[None, :] * r + cs[:, None]  # exact in float64
        out = v.astype(np.float16).astype(np.float64)  # one rounding, as the fma
        k = out - want[None, :]
        ok = np.all(k == k[:, :1], axis=1) & (k[:, 0] >= 1024) & (k[:, 0] + want.max() < 2048)
        for i in np.nonzero(ok)[0]:
            best.append((np.abs(v[i] - out[i]).max(), r, cs[i], k[i, 0]))
    best.sort()
    print(name, len(best), "candidates; best:", [tuple(float(x) for x in c) for c in best[:2]])


b = np.arange(216, dtype=np.float64)
r = np.arange(36, dtype=np.float64)
for base in (1024, 1280, 1536, 1792):
    search(base + b, np.floor(b / 36), 36, f"l2 from x = {base} + b:")
    search(base + r, np.floor(r / 6), 6, f"l1 from rm = {base} + r:")
