#!/usr/bin/python3
"""Plots and summarises the CSV of `driftkv-codec sweep`.

usage: plot_sweep.py DIR/sweep.csv OUTDIR

Writes into OUTDIR:
  attn_vs_bpv.png   attention-output relative error vs mean bits per value
                    (the paper's Figure 4 middle, on this data);
  nmse_vs_bpv.png   key and value NMSE vs their own bits per value;
  matched.png       dquant vs fixed (Appendix B, Figure 5 right): error vs
                    storage, with the extra storage fixed needs to reach
                    dquant's error at dquant's default and 1.96 points;
  summary.md        the tables at the "default" (~2.26) and "b1.96" points
                    and the matched-storage numbers.
Needs Debian's python3-matplotlib; installs it with apt-get when missing
(as root). Uses the system interpreter (/usr/bin/python3): Debian's
matplotlib is not visible to other Pythons.
"""
import csv
import math
import os
import subprocess
import sys


def import_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_sweep: installing python3-matplotlib", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends",
                        "python3-matplotlib"], check=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


NUMERIC = ["key_levels", "value_levels", "bits_k", "bits_v", "bits", "nmse_k",
           "nmse_v", "attn_rel_err", "drift_rate_k", "drift_rate_v",
           "budget_util_k", "budget_util_v", "max_move"]
STYLE = {"dquant": ("tab:red", "o"), "fixed": ("tab:gray", "s"),
         "int": ("tab:blue", "^"), "kivi": ("tab:green", "v"),
         "oscar": ("tab:purple", "D"), "turbo": ("tab:orange", "P"),
         "fp8": ("black", "x"), "bf16": ("black", "+")}


def read(path):
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            for k in NUMERIC:
                r[k] = float(r[k]) if r.get(k, "") != "" else float("nan")
            rows.append(r)
    return rows


def pareto(points):
    """Lower envelope of (x, y): points sorted by x whose y beats all cheaper ones."""
    out = []
    for x, y in sorted(points):
        if not out or y < out[-1][1]:
            out.append((x, y))
    return out


def bits_to_reach(curve, target):
    """Smallest x at which the envelope reaches y <= target, interpolating
    log y linearly between envelope points; None if never reached."""
    env = pareto(curve)
    for i, (x, y) in enumerate(env):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = env[i - 1]
            t = (math.log(y0) - math.log(target)) / (math.log(y0) - math.log(y))
            return x0 + t * (x - x0)
    return None


def by_codec(rows):
    out = {}
    for r in rows:
        out.setdefault(r["codec"], []).append(r)
    return out


def matched_numbers(rows):
    """For each tagged dquant point: error ratios vs the matched fixed point
    and the extra bits fixed needs, per metric."""
    dq = {r["tag"]: r for r in rows if r["codec"] == "dquant" and r["tag"]}
    fixed = [r for r in rows if r["codec"] == "fixed"]
    results = []
    for tag, d in sorted(dq.items()):
        m = next((r for r in fixed if r["tag"] == "matched-" + tag), None)
        entry = {"tag": tag, "dquant": d, "fixed": m, "extra": {}}
        for metric, xcol in (("nmse_k", "bits_k"), ("nmse_v", "bits_v"),
                             ("attn_rel_err", "bits")):
            curve = [(r[xcol], r[metric]) for r in fixed if not math.isnan(r[metric])]
            if math.isnan(d[metric]) or not curve:
                continue
            x = bits_to_reach(curve, d[metric])
            entry["extra"][metric] = None if x is None else x - d[xcol]
        results.append(entry)
    return results


def fmt(x, digits=4):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{x:.{digits}g}"


def table(rows, tag_for):
    lines = ["| codec | config | bits K | bits V | bits | NMSE K | NMSE V | attn err |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if not tag_for(r):
            continue
        lines.append(f"| {r['codec']} | {r['config']} | {r['bits_k']:.3f} | "
                     f"{r['bits_v']:.3f} | {r['bits']:.3f} | {fmt(r['nmse_k'])} | "
                     f"{fmt(r['nmse_v'])} | {fmt(r['attn_rel_err'])} |")
    return "\n".join(lines)


def summary(rows, path):
    label = rows[0]["label"] if rows else "data"
    out = [f"# Sweep summary: {label}", "",
           "## At about 2.26 bits per value (defaults; baselines INT2 / group 128)", "",
           table(rows, lambda r: r["tag"] in ("default", "matched-default")), "",
           "## At about 1.96 bits per value", "",
           "dquant at a 1.96 container and fixed at matched storage; the cheapest "
           "2-bit baseline points (group 512: 2.06 bits per value) for reference.", "",
           table(rows, lambda r: r["tag"] in ("b1.96", "matched-b1.96") or
                 (r["codec"] in ("int", "oscar") and "group 512" in r["config"])), "",
           "## Matched storage (Appendix B): dquant vs fixed", "",
           "| dquant point | metric | dquant | fixed (matched) | ratio dquant/fixed | "
           "extra bits fixed needs |", "|---|---|---|---|---|---|"]
    for e in matched_numbers(rows):
        d, m = e["dquant"], e["fixed"]
        for metric in ("nmse_k", "nmse_v", "attn_rel_err"):
            if metric not in e["extra"]:
                continue
            fv = m[metric] if m else float("nan")
            ratio = d[metric] / fv if m and fv > 0 else float("nan")
            extra = e["extra"][metric]
            out.append(f"| {e['tag']} ({d['bits']:.3f} b/v) | {metric} | {fmt(d[metric])} | "
                       f"{fmt(fv)} ({m['config'].split(' matching')[0] if m else '-'}) | "
                       f"{fmt(ratio, 3)} | {'not reached' if extra is None else f'{extra:+.3f}'} |")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def plot_attention(plt, rows, path):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for codec, rs in by_codec(rows).items():
        rs = [r for r in rs if not math.isnan(r["attn_rel_err"])]
        if not rs:
            continue
        color, marker = STYLE.get(codec, ("tab:brown", "."))
        if codec in ("fp8", "bf16"):
            ax.axhline(rs[0]["attn_rel_err"], color=color, lw=0.8,
                       ls=":" if codec == "fp8" else "--",
                       label=f"{codec} ({rs[0]['bits']:.1f} b/v)")
            continue
        pts = pareto([(r["bits"], r["attn_rel_err"]) for r in rs]) if codec == "fixed" else \
            sorted((r["bits"], r["attn_rel_err"]) for r in rs if not r["tag"].startswith("matched"))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                label=codec, ms=4, lw=1)
        for r in rs:
            if r["tag"] in ("default", "b1.96"):
                ax.plot(r["bits"], r["attn_rel_err"], marker="*", color=color, ms=12)
    ax.set_xlim(1.0, 4.6)
    ax.set_yscale("log")
    ax.set_xlabel("bits per value (keys and values, all metadata)")
    ax.set_ylabel("attention output relative error")
    ax.set_title(f"{rows[0]['label']}: attention error vs storage (stars: defaults, 1.96)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_nmse(plt, rows, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, metric, xcol, what in ((axes[0], "nmse_k", "bits_k", "keys"),
                                   (axes[1], "nmse_v", "bits_v", "values")):
        for codec, rs in by_codec(rows).items():
            if codec in ("fp8", "bf16"):
                continue
            color, marker = STYLE.get(codec, ("tab:brown", "."))
            pts = pareto([(r[xcol], r[metric]) for r in rs]) if codec == "fixed" else \
                sorted((r[xcol], r[metric]) for r in rs if not r["tag"].startswith("matched"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color,
                    label=codec, ms=4, lw=1)
            for r in rs:
                if r["tag"] in ("default", "b1.96"):
                    ax.plot(r[xcol], r[metric], marker="*", color=color, ms=12)
        ax.set_xlim(0.9, 5.0)
        ax.set_yscale("log")
        ax.set_xlabel(f"bits per value ({what})")
        ax.set_ylabel(f"NMSE ({what})")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{rows[0]['label']}: reconstruction error vs storage")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_matched(plt, rows, path):
    fixed = [r for r in rows if r["codec"] == "fixed"]
    dq = [r for r in rows if r["codec"] == "dquant"]
    if not fixed or not dq:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, metric, xcol in ((axes[0], "nmse_k", "bits_k"), (axes[1], "nmse_v", "bits_v"),
                             (axes[2], "attn_rel_err", "bits")):
        f_pts = pareto([(r[xcol], r[metric]) for r in fixed if not math.isnan(r[metric])])
        d_pts = sorted((r[xcol], r[metric]) for r in dq if not math.isnan(r[metric]))
        if not f_pts or not d_pts:
            continue
        ax.plot(*zip(*f_pts), marker="s", color="tab:gray", label="fixed (envelope)", ms=4)
        ax.plot(*zip(*d_pts), marker="o", color="tab:red", label="dquant", ms=4)
        for r in dq:
            if r["tag"] not in ("default", "b1.96"):
                continue
            ax.plot(r[xcol], r[metric], marker="*", color="tab:red", ms=13)
            x = bits_to_reach(f_pts, r[metric])
            if x is not None:
                ax.annotate("", xy=(x, r[metric]), xytext=(r[xcol], r[metric]),
                            arrowprops=dict(arrowstyle="->", color="black"))
                ax.text(0.5 * (x + r[xcol]), r[metric] * 1.08, f"{x - r[xcol]:+.2f}",
                        ha="center", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel(f"bits per value ({xcol})")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{rows[0]['label']}: dquant vs fixed-width at matched storage "
                 "(arrows: extra bits fixed needs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = read(sys.argv[1])
    if not rows:
        print("plot_sweep: no rows", file=sys.stderr)
        return 1
    outdir = sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    summary(rows, os.path.join(outdir, "summary.md"))
    plt = import_matplotlib()
    plot_attention(plt, rows, os.path.join(outdir, "attn_vs_bpv.png"))
    plot_nmse(plt, rows, os.path.join(outdir, "nmse_vs_bpv.png"))
    plot_matched(plt, rows, os.path.join(outdir, "matched.png"))
    print(f"wrote {outdir}/{{attn_vs_bpv,nmse_vs_bpv,matched}}.png and summary.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
