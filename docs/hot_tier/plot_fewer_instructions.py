#!/usr/bin/env python3
"""Plots the hot kernel's times by build and shape from an A/B log.

Reads an A/B log of builds in turn, two rounds, SDPA timed right after
each run, and draws, per shape, each build's kernel time relative to the
first build's (mean of its two rounds, the rounds as ticks), and SDPA's
time over each build's. Three logs: the second call of
docs/hot_tier/fewer_instructions_ab_h100_2026-12-06.log (the default),
docs/hot_tier/subnormal_keys_ab_h100_2026-12-06.log (`subnormal`) and
docs/hot_tier/ftz_prefetch_ab_h200_2026-12-06.log (`h200`).

  /usr/bin/python3 docs/hot_tier/plot_fewer_instructions.py [subnormal|h200]
"""
import collections
import pathlib
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = pathlib.Path(__file__).resolve().parent
RUNS = {
    "fewer": ("fewer_instructions_ab_h100_2026-12-06.log", "# Call 2", "fewer_instructions_h100.png",
              {"bench_gpu-before": "db9d894", "bench_gpu-p3": "dbda5bd", "bench_gpu": "b86c72d"}, "H100"),
    "subnormal": ("subnormal_keys_ab_h100_2026-12-06.log", None, "subnormal_keys_h100.png",
                  {"bench_gpu-before": "8b93c0b", "bench_gpu-k": "3d8f9d4 keys", "bench_gpu": "fb1da87 keys+values"},
                  "H100"),
    "h200": ("ftz_prefetch_ab_h200_2026-12-06.log", None, "ftz_prefetch_h200.png",
             {"bench_gpu-before": "8b93c0b", "bench_gpu-base": "9545896 subnormal keys", "bench_gpu": "2daeb7a ftz",
              "bench_gpu-pf1": "9545896 + L2 prefetch"}, "H200"),
}
log_name, call, png, names, card = RUNS[sys.argv[1] if len(sys.argv) > 1 else "fewer"]
log = (here / log_name).read_text()
if call:
    log = log.split(call)[1]
ref = next(iter(names))  # every build's time is read against the first's
first = names[ref].split()[0]
hot = collections.defaultdict(list)   # (build, shape) -> ms per round
sdpa = collections.defaultdict(list)  # shape -> ms
build = None
for line in log.splitlines():
    m = re.match(r"== round \d+: (\S+)", line)
    if m:
        build = m.group(1)
        continue
    m = re.match(r"\| (\d+) \| (\d+) \| ([\d.]+) \| \d+ \| ([\d.]+) \|", line)
    if m and build:
        shape = f"{m.group(1)} x {int(m.group(2)) // 1024}K"
        hot[(build, shape)].append(float(m.group(4)))
        sdpa[shape].append(float(m.group(3)))
shapes = list(dict.fromkeys(s for _, s in hot))
mean = {k: sum(v) / len(v) for k, v in hot.items()}
fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
width = 0.8 / len(names)
for i, (b, label) in enumerate(names.items()):
    xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(shapes))]
    base = [mean[(ref, s)] for s in shapes]
    ax.bar(xs, [mean[(b, s)] / m for s, m in zip(shapes, base)], width, label=f"{label} ({b})")
    for x, s, m in zip(xs, shapes, base):
        ax.plot([x] * len(hot[(b, s)]), [t / m for t in hot[(b, s)]], "k_", markersize=7)
    ax2.bar(xs, [sum(sdpa[s]) / len(sdpa[s]) / mean[(b, s)] for s in shapes], width, label=label)
for a in (ax, ax2):
    a.set_xticks(range(len(shapes)))
    a.set_xticklabels(shapes, fontsize=8)
ax.set_ylim(0.6, 1.05)
ax.set_ylabel(f"kernel time / {first}'s (ticks: the two rounds)")
ax.set_title(f"Hot kernel time by build, {card}", fontsize=10)
ax.legend(fontsize=8, loc="lower right")
ax2.axhline(3.0, color="r", linestyle="--", linewidth=1)
bar_note = "3.0x (the bar)" if card == "H200" else "3.0x (the bar is on the H200)"
ax2.text(len(shapes) - 0.5, 3.05, bar_note, color="r", fontsize=8, ha="right")
ax2.set_ylabel(f"SDPA / hot kernel, this {card}")
ax2.set_title("Against PyTorch SDPA in the same call" + ("" if card == "H200" else " (H100: not the bar's card)"),
              fontsize=10)
fig.tight_layout()
out = here / png
fig.savefig(out, dpi=110)
print(out)
