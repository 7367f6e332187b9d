#!/usr/bin/env python3
"""Per-layer p50 and p99 of prepared requests without a decode step, each
server run of docs/data_plane/kept_ab_2026-12-03.log, against the kernel
alone measured in the same call (0.300 ms) and the bar (kernel + 60 us).

    /usr/bin/python3 docs/data_plane/plot_kept_ab.py   # writes kept_ab_h200.png beside it
"""
import json
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_US = 300.0

runs = []  # (variant, path, p50, p99)
variant = None
for line in open(os.path.join(HERE, "kept_ab_2026-12-03.log")):
    m = re.match(r"== round \d+: (\w+)", line)
    if m:
        variant = m.group(1)
        continue
    if line.startswith("{") and variant:
        r = json.loads(line)
        if r["with_step"] == 0:
            runs.append((variant, r["path"], r["layer_p50_us"], r["layer_p99_us"]))

fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
colors = {"before": "tab:gray", "after": "tab:blue", "nokept": "tab:orange"}
for ax, path, title in zip(axes, ["ipc_prepared", "shm_prepared"],
                           ["CUDA IPC, prepared, no step", "host shm (CPU client), prepared, no step"]):
    for v in ["before", "nokept", "after"]:
        pts = [(p50, p99) for (vv, pp, p50, p99) in runs if vv == v and pp == path]
        if not pts:
            continue
        xs = range(len(pts))
        ax.plot(xs, [p for p, _ in pts], "o-", color=colors[v], label=f"{v} p50")
        ax.plot(xs, [min(q, 600) for _, q in pts], "x:", color=colors[v], alpha=0.6, label=f"{v} p99 (capped at 600)")
    ax.axhline(KERNEL_US, color="k", lw=1)
    ax.axhline(KERNEL_US + 60, color="tab:red", ls="--", lw=1, label="bar: kernel + 60 us")
    ax.text(0, KERNEL_US + 3, "kernel alone 0.300 ms", fontsize=8)
    ax.set_title(title)
    ax.set_xlabel("server run (fresh server, in order within each variant)")
    ax.set_ylim(280, 620)
axes[0].set_ylabel("per-layer round trip (us), 64 x 8K, H200")
axes[1].legend(fontsize=7, loc="upper right")
fig.suptitle("Kept launch plans + answers written by the merge: 3 device calls, alternating servers")
fig.tight_layout()
fig.savefig(os.path.join(HERE, "kept_ab_h200.png"), dpi=110)
print("wrote", os.path.join(HERE, "kept_ab_h200.png"), len(runs), "runs")
