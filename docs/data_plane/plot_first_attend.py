"""The H200's first Attend of 64 x 8K (hot server) by Handler phase, before
and after the warm-up, the window ring and Prefetch; figures from the logs
beside this script (warm_ab_2026-12-03.log round 1, prefetch_hot_bench_
2026-12-03.log). Run: /usr/bin/python3 docs/data_plane/plot_first_attend.py"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# (label, {phase: ms}) from the logs' "phases ms:" lines.
RUNS = [
    ("first Attend,\nbuild before", {"validate": 2.39, "hot_tier": 3.47, "backend_plan": 19.62,
                                     "backend_host": 6.38, "device_wait": 0.29}),
    ("first Attend,\nbuffers warm + ring", {"validate": 0.18, "hot_tier": 3.49, "backend_plan": 1.74,
                                            "backend_host": 5.46, "device_wait": 0.30}),
    ("first Attend\nafter Prefetch", {"validate": 0.22, "hot_tier": 0.83, "backend_plan": 0.06,
                                      "backend_host": 0.40, "device_wait": 0.30}),
    ("a later Attend", {"validate": 0.21, "hot_tier": 0.12, "backend_plan": 0.03, "backend_host": 0.08,
                        "device_wait": 0.31}),
]
PHASES = ["validate", "hot_tier", "backend_plan", "backend_host", "device_wait"]
COLORS = ["#8da0cb", "#e78ac3", "#fc8d62", "#66c2a5", "#a6d854"]

fig, ax = plt.subplots(figsize=(8, 4.2))
for i, (label, ph) in enumerate(RUNS):
    left = 0.0
    for p, c in zip(PHASES, COLORS):
        ax.barh(i, ph[p], left=left, color=c, label=p if i == 0 else None)
        left += ph[p]
    ax.text(left + 0.3, i, f"{left:.1f} ms", va="center", fontsize=9)
ax.set_yticks(range(len(RUNS)), [r[0] for r in RUNS], fontsize=9)
ax.invert_yaxis()
ax.set_xlabel("ms (sum of the Handler's phases; the rest of the call is gRPC and smaller phases)")
ax.set_title("H200, hot tier, 64 sequences x 8K tokens: the first Attend by phase", fontsize=10)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_attend_h200.png"), dpi=120)
