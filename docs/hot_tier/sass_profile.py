#!/usr/bin/env python3
"""Where the level kernel's warp instructions go, from ncu's source page.

Reads the CSV of `ncu -i REPORT --page source --csv --print-source sass`
(bench/device/sass_counts.sh writes it as source_BIN.csv) and prints, per
page of one KV head (a warp's unit of work), the instructions executed:
by opcode, and by how often each instruction ran. The page loop's body runs
about once a page; code run once a warp per split, once a block, or in the
prologue's rounds shows up as its own frequency, which is how the loop's
cost and the split's fixed cost were told apart.

  python3 docs/hot_tier/sass_profile.py source_bench_gpu.csv [PAGE_HEADS]

PAGE_HEADS: pages x KV heads of the profiled launch (64 x 8K: 64 x 8 x 64).
"""
import collections
import csv
import re
import signal
import sys

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head

path = sys.argv[1]
pages = int(sys.argv[2]) if len(sys.argv) > 2 else 64 * 8 * 64
rows = list(csv.reader(open(path)))
head = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
hdr, data = rows[head], rows[head + 1:]
i_src, i_exec = hdr.index("Source"), hdr.index("Instructions Executed")
by_op, by_freq, n_freq = collections.Counter(), collections.Counter(), collections.Counter()
total = 0
for r in data:
    if len(r) <= i_exec or not r[i_exec].isdigit():
        continue
    n = int(r[i_exec])
    if n == 0:
        continue
    m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[i_src].strip())
    by_op[m.group(2) if m else "?"] += n
    f = round(n / pages, 2)
    by_freq[f] += n
    n_freq[f] += 1
    total += n
print(f"{total} warp instructions, {total / pages:.1f} a page of one KV head")
print("by opcode (a page):")
for op, n in by_op.most_common(25):
    print(f"  {op:8s} {n / pages:8.1f}")
print("by how often an instruction ran (runs a page: instructions, their share a page):")
for f, n in sorted(by_freq.items(), key=lambda kv: -kv[1])[:10]:
    print(f"  {f:6.2f}: {n_freq[f]:5d} instructions, {n / pages:7.1f} a page")
