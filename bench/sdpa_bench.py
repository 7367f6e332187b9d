#!/usr/bin/env python3
"""PyTorch SDPA (bf16, enable_gqa=True) for the shapes of bench_gpu, in the
same run, and the side-by-side table with bench_gpu's CSV.

Each timed call uses another of R replicas of K/V (R so that the replicas
total >= 512 MB: no L2 reuse between calls); CUDA-event median over --reps
calls after warm-up. Each shape is timed twice: as bench_gpu's columns
(events around the call: at a launch-bound shape, such as 1 x 8K, the
interval includes Python's dispatch while the device waits for it), and
with the device's time alone (a spin kernel of ~0.5 ms queued first, so
the events and SDPA's kernels are queued before the device reaches them),
against bench_gpu's hot_gpu_ms, timed the same way.

  python3 bench/sdpa_bench.py --cxx bench.csv [--reps 30] [--out table.md]
"""
import argparse
import csv
import math

import torch
import torch.nn.functional as F

SHAPES = [(1, 8192), (32, 8192), (64, 8192), (128, 8192), (1, 131072), (16, 32768)]
QH, KVH, D = 32, 8, 128


def time_sdpa(q, ks, vs, reps, gpu_only=False):
    r = len(ks)
    for i in range(5):
        F.scaled_dot_product_attention(q, ks[i % r], vs[i % r], enable_gqa=True)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        if gpu_only:
            torch.cuda._sleep(1_000_000)  # cycles: ~0.5 ms, longer than queueing the call
        a.record()
        F.scaled_dot_product_attention(q, ks[i % r], vs[i % r], enable_gqa=True)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def time_shape(batch, context, reps):
    """(median ms, median ms of the device alone, KV bytes)."""
    kv_bytes = 2 * batch * KVH * context * D * 2
    r = max(1, math.ceil(512 * 2**20 / kv_bytes))
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + context)
    q = torch.randn(batch, QH, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    ks = [torch.randn(batch, KVH, context, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(r)]
    vs = [torch.randn(batch, KVH, context, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(r)]
    ms = time_sdpa(q, ks, vs, reps)
    gpu_ms = time_sdpa(q, ks, vs, reps, gpu_only=True)
    del ks, vs
    torch.cuda.empty_cache()
    return ms, gpu_ms, kv_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cxx", help="bench_gpu --csv output")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out")
    args = ap.parse_args()
    cxx = {}
    if args.cxx:
        with open(args.cxx) as f:
            for row in csv.DictReader(f):
                cxx[(int(row["batch"]), int(row["context"]))] = row
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    lines = ["| batch | context | SDPA ms | SDPA GB/s | hot ms | hot GB/s | SDPA/hot | hot, window and merge in its launch / a 2nd launch, ms "
             "| cold D-Quant ms | SDPA/cold | bf16 kernel ms | SDPA/bf16 kernel "
             "| device alone: SDPA ms | hot ms | SDPA/hot | cold promoted + hot ms | SDPA/that |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for batch, context in SHAPES:
        ms, gpu_ms, nbytes = time_shape(batch, context, args.reps)
        row = cxx.get((batch, context))
        if row:
            dq, bf = float(row["dquant_ms"]), float(row["bf16_ms"])
            hot, hotb = float(row["hot_ms"]), float(row["hot_bytes"])
            one = float(row.get("hot_in_launch_ms") or "nan")
            two = float(row.get("hot_two_launch_ms") or "nan")
            hot_gpu = float(row.get("hot_gpu_ms") or "nan")
            promoted = float(row.get("cold_promoted_ms") or "nan")
            lines.append(f"| {batch} | {context} | {ms:.4f} | {nbytes / ms / 1e6:.0f} | {hot:.4f} | {hotb / hot / 1e6:.0f} | "
                         f"**{ms / hot:.2f}x** | {one:.4f} / {two:.4f} | {dq:.4f} | {ms / dq:.2f}x | {bf:.4f} | "
                         f"{ms / bf:.2f}x | {gpu_ms:.4f} | {hot_gpu:.4f} | {gpu_ms / hot_gpu:.2f}x | "
                         f"{promoted:.4f} | {ms / promoted:.2f}x |")
        else:
            lines.append(f"| {batch} | {context} | {ms:.4f} | {nbytes / ms / 1e6:.0f} | | | | | | | | | {gpu_ms:.4f} | | | | |")
        print(lines[-1], flush=True)
    table = "\n".join(lines)
    print("\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
