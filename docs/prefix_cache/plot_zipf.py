#!/usr/bin/python3
"""Draws zipf_hit_rate.png from zipf_hit_rate.csv (bench/zipf_hit_rate_bench
--csv=...): the prefix hit rate against the memory budget, driftkv's pool
(measured) against a bf16 store of the same bytes (modelled: the same LRU
over pages of bf16 keys and values; docs/prefix_cache.md).

    /usr/bin/python3 docs/prefix_cache/plot_zipf.py
"""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    rows = list(csv.DictReader(open(os.path.join(HERE, "zipf_hit_rate.csv"))))
    mib = [int(r["budget_bytes"]) / 2**20 for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ax.plot(mib, [100 * float(r["driftkv_hit_rate"]) for r in rows], marker="o", label="driftkv (measured)")
    ax.plot(mib, [100 * float(r["bf16_hit_rate"]) for r in rows], marker="s", label="bf16 store, same bytes (modelled)")
    ax.set_xscale("log")
    ax.set_xlabel("memory budget, MiB (log)")
    ax.set_ylabel("prompt pages found by Lookup, %")
    ax.set_ylim(0, 100)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Prefix hit rate against memory, Zipf trace (zipf_hit_rate_bench defaults)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "zipf_hit_rate.png"), dpi=110)


if __name__ == "__main__":
    main()
