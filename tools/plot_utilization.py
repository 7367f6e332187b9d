#!/usr/bin/env python3
"""Histogram of container budget utilisation per stream (Appendix C).

usage: plot_utilization.py DIR   (reads DIR/utilization.csv from appendix-c,
writes DIR/utilization.png)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(d):
    rows = list(csv.DictReader(open(f"{d}/utilization.csv")))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for kind, color in (("key", "tab:blue"), ("value", "tab:orange")):
        u = [int(r["bytes_used"]) / int(r["payload_bytes"]) for r in rows if r["stream"] == kind]
        ax.hist(u, bins=60, range=(0.7, 1.0), alpha=0.6, color=color, label=f"{kind}s ({len(u)} streams)")
    ax.set_xlabel("rANS bytes used / container payload bytes")
    ax.set_ylabel("streams")
    ax.set_title("Budget utilisation after drift (fixture, D-Quant defaults)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(f"{d}/utilization.png", dpi=110)


if __name__ == "__main__":
    main(sys.argv[1])
