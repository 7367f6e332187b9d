#!/usr/bin/env python3
"""Shared-memory wavefronts of one warp's random decode-table lookups.

32 lanes look up entries z uniform in [0, 256) of a table of 4-byte words
held `copies` times, entry z's copies side by side (word copies * z + c),
lane l reading copy l % copies. A lookup takes as many wavefronts as the
most distinct words any one of the 32 banks is asked for. Prints the mean
over random warps for 1, 2, 4, 8 and 32 copies.

    /usr/bin/python3 docs/hot_tier/lookup_banks_sim.py
"""
import numpy as np


def wavefronts(copies, warps, rng):
    total = 0
    lanes = np.arange(32)
    for _ in range(warps):
        word = rng.integers(0, 256, 32) * copies + lanes % copies
        bank = word % 32
        total += max(len(set(word[bank == b])) for b in range(32))
    return total / warps


def main():
    rng = np.random.default_rng(1)
    for copies in (1, 2, 4, 8, 32):
        print(f"{copies:2d} copies: {wavefronts(copies, 5000, rng):.2f} wavefronts a lookup")


if __name__ == "__main__":
    main()
