"""Inline bf16 Attend over gRPC (8 layers x 64 x 8192, no decode step):
each run's p50 round trip over the kernel alone, against the bar (kernel +
0.8 ms), read from the device logs beside this script: every
`decode_step_bench` line of an inline path, attributed to the server named
by the `== round` line above it. Run:
/usr/bin/python3 docs/data_plane/plot_inline_bar.py"""
import os
import re

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = os.path.dirname(os.path.abspath(__file__))

# The builds: before the per-thread request and answer (PREV), the one
# that stays since (KEPT: its server is 6c62c20's), and builds tried beside
# it and not kept (TRIED).
PREV, KEPT, TRIED = "before the per-thread messages", "the build that stays", "tried, not kept"
STYLE = {PREV: ("#999999", "o"), KEPT: ("#1f77b4", "s"), TRIED: ("#ff7f0e", "^")}

# (log, kernel log, x label, {server in the `== round` line: build}, the
# build of runs whose line names no server).
CALLS = [
    ("apart_ab_h200_2026-12-06.log", "apart_kernel_h200_2026-12-06.log", "H200\n12-06 a", {}, PREV),
    ("uds_ab_h200_2026-12-06.log", "uds_kernel_h200_2026-12-06.log", "H200\n12-06 b", {}, PREV),
    ("trace_h100_2026-12-06.log", "trace_kernel_h100_2026-12-06.log", "H100 #1\ncall 1", {}, PREV),
    ("trace_phases_h100_2026-12-06.log", "trace_phases_kernel_h100_2026-12-06.log", "H100 #1\ncall 2", {}, PREV),
    ("scratch_ab_h100_2026-12-06_call1.log", "scratch_ab_kernel_h100_2026-12-06.log", "H100 #1\ncall 3",
     {"driftkv-server-cuda-before": PREV, "driftkv-server-cuda": KEPT}, None),
    ("scratch_ab_h100_2026-12-06_call2.log", "scratch_ab_kernel_h100_2026-12-06.log", "H100 #1\ncall 4",
     {"driftkv-server-cuda-before": PREV, "driftkv-server-cuda": KEPT}, None),
    ("copy_helpers_h100_2026-12-06_call1.log", "copy_helpers_kernel_h100_2026-12-06_call1.log", "H100 #2",
     {"driftkv-server-cuda-before": KEPT, "driftkv-server-cuda": TRIED}, None),
    ("copy_helpers_h100_2026-12-06_call2.log", "copy_helpers_kernel_h100_2026-12-06_call2.log", "H100 #3",
     {"driftkv-server-cuda-before": KEPT, "driftkv-server-cuda-v1": TRIED, "driftkv-server-cuda": TRIED}, None),
    ("inline_bar_h100_2026-12-06.log", "inline_bar_kernel_h100_2026-12-06.log", "H100 #4",
     {"driftkv-server-cuda-before": KEPT}, None),
    ("inline_bar_h100_2026-12-06_host5.log", "inline_bar_kernel_h100_2026-12-06_host5.log", "H100 #5",
     {"driftkv-server-cuda": KEPT}, None),
]
BAR_MS = 0.8


def kernel_ms(path):
    with open(os.path.join(HERE, path)) as f:
        for line in f:
            if line.startswith("| hot |"):
                return float(line.split("|")[2])
    raise ValueError(f"no hot kernel line in {path}")


def runs(path, servers, default):
    """(build, p50 us) of every inline run in the log."""
    build, out = default, []
    with open(os.path.join(HERE, path)) as f:
        for line in f:
            m = re.match(r"== round \d+: (\S+)", line)
            if m:
                build = servers.get(m.group(1), default)
                continue
            # (The scripts cut these lines at 300 characters: read the field.)
            if line.startswith('{"path": "inline_bf16') and '"with_step": 1' not in line:
                out.append((build, float(re.search(r'"layer_p50_us": ([0-9.]+)', line).group(1))))
    return out


fig, ax = plt.subplots(figsize=(9, 4.4))
seen = set()
for x, (log, klog, label, servers, default) in enumerate(CALLS):
    k = kernel_ms(klog)
    got = runs(log, servers, default)
    for j, (build, p50) in enumerate(got):
        if build is None:
            raise ValueError(f"{log}: a run of no known build")
        color, marker = STYLE[build]
        dx = (j - (len(got) - 1) / 2) * 0.06
        ax.scatter(x + dx, p50 / 1000 - k, color=color, marker=marker, s=28, zorder=3,
                   label=build if build not in seen else None)
        seen.add(build)
ax.axhline(BAR_MS, color="#d62728", lw=1.2, ls="--", label="bar: kernel + 0.8 ms")
ax.set_xticks(range(len(CALLS)))
ax.set_xticklabels([c[2] for c in CALLS], fontsize=8)
ax.set_ylabel("p50 round trip - kernel (ms)")
ax.set_title("Inline bf16 Attend over gRPC, 64 x 8K, 2026-12-06: each run against the bar", fontsize=10)
ax.grid(axis="y", alpha=0.3)
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()
fig.savefig(os.path.join(HERE, "inline_bar.png"), dpi=110)
print("wrote", os.path.join(HERE, "inline_bar.png"))
