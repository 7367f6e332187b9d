#!/usr/bin/python3
"""Paired KL ratios of every configuration of a kl_eval.py run against one of
them, from the run's kl.json (no model, no codec): geometric mean over the
documents of the per-document KL ratio, its paired-bootstrap 95% interval
(numpy, as kl_eval.py) and the documents where the configuration is lower.

usage: bench/kl_compare.py KL_JSON [--ref "dquant"] [--bootstrap 20000] [--seed 0]
--ref is a configuration as kl_eval.py prints it: the codec name and its
flags ("dquant --v-refit least_squares"); the first match is the reference.
"""
import argparse
import json
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("kl_json")
    ap.add_argument("--ref", default="dquant")
    ap.add_argument("--bootstrap", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    d = json.load(open(a.kl_json))
    name = lambda r: " ".join([r["codec"], *r["flags"]])
    ref = next((r for r in d["results"] if name(r) == a.ref), None)
    if ref is None:
        raise SystemExit(f"--ref {a.ref!r}: no such configuration in {a.kl_json}")
    rng = np.random.default_rng(a.seed)
    base = np.asarray(ref["kl"])
    print(f"replaced: {d.get('mode', d['args'].get('only'))}; reference {a.ref} "
          f"(mean KL {base.mean():.5f})\n")
    print("| configuration | mean KL | ratio to reference | bootstrap 95% | docs lower |")
    print("|---|---|---|---|---|")
    for r in d["results"]:
        if r is ref:
            continue
        logs = np.log(np.asarray(r["kl"]) / base)
        n = len(logs)
        means = np.sort(logs[rng.integers(0, n, size=(a.bootstrap, n))].mean(1))
        lo, hi = means[int(0.025 * a.bootstrap)], means[int(0.975 * a.bootstrap) - 1]
        print(f"| {name(r)} | {np.mean(r['kl']):.5f} | {np.exp(logs.mean()):.3f} | "
              f"[{np.exp(lo):.3f}, {np.exp(hi):.3f}] | {int((logs < 0).sum())}/{n} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
