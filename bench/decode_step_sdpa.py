#!/usr/bin/env python3
"""The local baseline of the decode-step benchmark: a decode worker that keeps
its own bf16 KV cache on the GPU and attends it with PyTorch SDPA.

One step = for each of --layers layers, in sequence: write the step's new
key/value into the layer's preallocated cache, then SDPA (bf16,
enable_gqa=True) of the batch's queries over every cached token. Only
attention is timed (the rest of the model is the same with or without
driftkv). Prints per-layer p50/p99 (CUDA events), the step time (host wall
clock, synchronised per step), tokens/s and the KV bytes resident, as one
JSON line (bench/decode_step.md explains the fields):

  python3 bench/decode_step_sdpa.py [--layers 32] [--batch 64] [--context 8192]
      [--q-heads 32] [--kv-heads 8] [--head-dim 128] [--steps 20] [--warmup 3]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def quantile(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    dev = "cuda"
    total = a.context + a.warmup + a.steps
    g = torch.Generator(device=dev).manual_seed(1)
    # Each layer's cache holds the context, then grows by one token a step.
    ks, vs = [], []
    for _ in range(a.layers):
        k = torch.empty(a.batch, a.kv_heads, total, a.head_dim, device=dev, dtype=torch.bfloat16)
        v = torch.empty_like(k)
        k[:, :, : a.context].normal_(generator=g)
        v[:, :, : a.context].normal_(generator=g)
        ks.append(k)
        vs.append(v)
    q = torch.randn(a.layers, a.batch, a.q_heads, 1, a.head_dim, device=dev, dtype=torch.bfloat16, generator=g)
    nk = torch.randn(a.layers, a.batch, a.kv_heads, 1, a.head_dim, device=dev, dtype=torch.bfloat16, generator=g)
    nv = torch.randn_like(nk)
    torch.cuda.synchronize()
    per_layer, steps = [], []
    t = a.context
    for s in range(a.warmup + a.steps):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(a.layers + 1)]
        start = time.perf_counter()
        events[0].record()
        for l in range(a.layers):
            ks[l][:, :, t : t + 1].copy_(nk[l])
            vs[l][:, :, t : t + 1].copy_(nv[l])
            F.scaled_dot_product_attention(q[l], ks[l][:, :, : t + 1], vs[l][:, :, : t + 1], enable_gqa=True)
            events[l + 1].record()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) * 1e3
        t += 1
        if s >= a.warmup:
            steps.append(wall)
            per_layer += [events[l].elapsed_time(events[l + 1]) for l in range(a.layers)]
    kv_bytes = 2 * a.layers * a.batch * a.kv_heads * a.context * a.head_dim * 2
    out = {
        "path": "local SDPA (bf16 KV on the worker's GPU)",
        "layer_p50_ms": quantile(per_layer, 0.5),
        "layer_p99_ms": quantile(per_layer, 0.99),
        "step_p50_ms": quantile(steps, 0.5),
        "tokens_per_s": a.batch / (quantile(steps, 0.5) / 1e3),
        "kv_bytes": kv_bytes,
        "shape": f"{a.layers} layers, batch {a.batch}, context {a.context}, GQA {a.q_heads}/{a.kv_heads}, head_dim {a.head_dim}",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
