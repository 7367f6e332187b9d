#!/usr/bin/python3
"""Draws phases_h200.png from phases_h200.json: per decode-step path, the
server's mean time per Attend by phase (driftkv_attend_phase_seconds),
the rest of the client's p50 round trip as 'transport and wake-up', and
the kernel alone as a line.

    /usr/bin/python3 docs/data_plane/plot_phases.py
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ["request", "validate", "client_read", "lookup", "hot_tier", "state", "backend_plan", "backend_host",
          "device_wait", "finish"]


def main():
    data = json.load(open(os.path.join(HERE, "phases_h200.json")))
    paths = data["paths"]
    fig, ax = plt.subplots(figsize=(12.5, 5.6))
    names = [p["path"] for p in paths]
    left = [0.0] * len(paths)
    for phase in PHASES:
        widths = [p["phases"][phase] for p in paths]
        ax.barh(names, widths, left=left, label=phase)
        left = [a + b for a, b in zip(left, widths)]
    rest = [max(0.0, p["layer_p50_us"] - l) for p, l in zip(paths, left)]
    ax.barh(names, rest, left=left, label="transport and wake-up (client p50 - server)", color="lightgray")
    ax.axvline(data["kernel_us"], color="black", linestyle="--", linewidth=1)
    ax.text(data["kernel_us"] + 10, len(paths) - 0.6, f"kernel alone {data['kernel_us']} us", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("us per Attend (64 items x 8K tokens, hot tier); 'no step': attend only")
    ax.set_title("Where a layer's Attend goes, H200, decode_step_bench (server phases: means)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "phases_h200.png"), dpi=110)


if __name__ == "__main__":
    main()
