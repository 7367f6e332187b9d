#!/usr/bin/python3
"""Markdown tables of docs/quality.md (the baselines and sweeps) from the sweep CSVs of
`driftkv-codec sweep` and the kl.json of kl_eval.py.

usage: quality_tables.py --sweep LABEL=DIR/sweep.csv [--sweep ...] [--kl kl.json]
Prints: one table per operating point ("default" ~2.26 and "b1.96" bits
per value) with NMSE and attention error per data set and the model KL,
then the matched-storage (Appendix B) table per data set.
"""
import argparse
import csv
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from plot_sweep import bits_to_reach, read  # noqa: E402

ORDER = ["dquant", "fixed", "int", "kivi", "oscar", "turbo", "fp8", "bf16"]


def pick(rows, point):
    """The row of each codec at an operating point."""
    out = {}
    for r in rows:
        c, tag = r["codec"], r["tag"]
        if point == "default":
            ok = tag == "default" or tag == "matched-default"
        else:
            ok = tag in ("b1.96", "matched-b1.96") or (
                c in ("int", "oscar") and r["config"] == "bits 2 group 512") or (
                c in ("kivi", "turbo") and tag == "default") or c in ("fp8", "bf16")
        if ok:
            out[c] = r
    return out


def kl_for(kl, codec, point):
    if not kl:
        return None
    tag = {"default": "default", "b1.96": "b1.96"}[point]
    if codec == "fixed":
        tag = "matched-" + tag
    elif codec != "dquant":
        tag = "default"
    for r in kl["results"]:
        if r["codec"] == codec and r["tag"] == tag:
            return r
    return None


def ratio_for(kl, codec, tag):
    if not kl:
        return None
    for c in kl["comparisons"]:
        if c["a"] == f"{codec} {tag}":
            return c
    return None


def g(x, d=3):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}g}"


def point_table(sweeps, kl, point):
    labels = list(sweeps)
    head = "| codec | config | bits K / V / mean | " + " | ".join(
        f"{l}: NMSE K / V, attn" for l in labels) + " | model KL | KL / int INT2 [95%] |"
    lines = [head, "|" + "---|" * (5 + len(labels))]
    picks = {l: pick(rows, point) for l, rows in sweeps.items()}
    for codec in ORDER:
        ref = next((picks[l][codec] for l in labels if codec in picks[l]), None)
        if ref is None:
            continue
        cells = [codec, ref["config"].split(" matching")[0],
                 f"{ref['bits_k']:.3f} / {ref['bits_v']:.3f} / {ref['bits']:.3f}"]
        for l in labels:
            r = picks[l].get(codec)
            cells.append("-" if r is None else
                         f"{g(r['nmse_k'])} / {g(r['nmse_v'])}, {g(r['attn_rel_err'])}")
        k = kl_for(kl, codec, point)
        # The KL run evaluates int/kivi/oscar/turbo at group 128 only.
        if k is not None and abs(k["bits"] - ref["bits"]) > 0.01:
            k = None
        cells.append("-" if k is None else f"{sum(k['kl']) / len(k['kl']):.4g}")
        rc = None if k is None else (ratio_for(kl, codec, k["tag"]) if codec != "int" else "base")
        cells.append("1 (reference)" if rc == "base" else "-" if rc is None else
                     f"{rc['ratio']:.3f} [{rc['lo']:.3f}, {rc['hi']:.3f}]")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def matched_table(sweeps):
    lines = ["| data | dquant point | metric | dquant | fixed at matched storage | "
             "ratio dquant/fixed | extra bits fixed needs |", "|---|---|---|---|---|---|---|"]
    for label, rows in sweeps.items():
        fixed = [r for r in rows if r["codec"] == "fixed"]
        for tag in ("default", "b1.96"):
            d = next((r for r in rows if r["codec"] == "dquant" and r["tag"] == tag), None)
            m = next((r for r in fixed if r["tag"] == "matched-" + tag), None)
            if d is None or m is None:
                continue
            for metric, xcol in (("nmse_k", "bits_k"), ("nmse_v", "bits_v"),
                                 ("attn_rel_err", "bits")):
                curve = [(r[xcol], r[metric]) for r in fixed if not math.isnan(r[metric])]
                x = bits_to_reach(curve, d[metric]) if curve and not math.isnan(d[metric]) else None
                lines.append(
                    f"| {label} | {tag} ({d[xcol]:.3f} b/v) | {metric} | {g(d[metric], 4)} | "
                    f"{g(m[metric], 4)} ({m[xcol]:.3f} b/v, levels {int(m['key_levels'])}/"
                    f"{int(m['value_levels'])}) | {m[metric] and d[metric] / m[metric]:.3f} | "
                    f"{'not reached' if x is None else f'{x - d[xcol]:+.3f}'} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="append", default=[])
    ap.add_argument("--kl", default="")
    a = ap.parse_args()
    sweeps = {}
    for s in a.sweep:
        label, path = s.split("=", 1)
        sweeps[label] = read(path)
    kl = json.load(open(a.kl)) if a.kl else None
    print("### At about 2.26 bits per value\n")
    print(point_table(sweeps, kl, "default"))
    print("\n### At about 1.96 bits per value\n")
    print(point_table(sweeps, kl, "b1.96"))
    print("\n### Matched storage (Appendix B), tensor metrics\n")
    print(matched_table(sweeps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
