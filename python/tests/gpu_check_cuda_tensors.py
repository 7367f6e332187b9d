#!/usr/bin/env python3
"""Torch CUDA tensors on the data plane, against a running driftkv-server-cuda
(not collected by pytest: it needs a GPU and that server; without a GPU it
prints "skipped: no GPU" and exits 0).

    PYTHONPATH=python python3 python/tests/gpu_check_cuda_tensors.py \\
        --target 127.0.0.1:50051 [--region-socket /tmp/driftkv-dp.sock]

Needs the stubs python/gen_stubs.sh writes (python/driftkv/_proto/
driftkv_pb2{,_grpc}.py), torch with CUDA, and the server on this node, on the
GPU the tensors live on (RegisterRegion's `device` is torch's ordinal).

It prefills --sequences sequences of --tokens random tokens in layer 0 (the
model's shape from Info), then for queries of each wire dtype (f32, bf16,
fp16) and outputs of each output dtype (f32, bf16) calls attend(items,
out=<CUDA tensor>, lse=<CUDA f32 tensor>) with CUDA queries, and checks:
  - the request carries query_ref, output_ref and lse_ref for every item
    (else the equality below would only compare inline with inline);
  - out and lse equal, bit for bit, the inline answers to the same query
    bytes (the queries copied to the host, the answers into host tensors);
  - the IPC registrations: repeated calls with the same tensors register
    nothing more (Stats.regions_registered, which counts every client's,
    does not move: run it against a server nobody else uses meanwhile),
    and the client caches one registration per allocation of torch's
    caching allocator.
The same for driftkv.aio.Client (after the sync client's close(), which
unregisters its allocations: a handle may be registered once); a decode step
with CUDA new_key/new_value against its inline twin (outputs and Length);
and numpy arrays in a host region attached through the region socket.

One JSON line on stdout; exit status 1 when any check fails.
"""
import argparse
import asyncio
import json
import os
import sys
import uuid

import numpy as np

try:
    import driftkv  # PYTHONPATH=python
except ImportError:  # run as python/tests/gpu_check_cuda_tensors.py
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import driftkv
import driftkv.aio
from driftkv import AttendItem
from driftkv._errors import DriftkvError
from driftkv._tensors import bf16_bits_to_f32, f32_to_bf16_bits
from driftkv.regions import CudaRegions

Q_DTYPES = ("f32", "bf16", "fp16")
OUT_DTYPES = ("f32", "bf16")
CHECKS = ("sync", "step", "host_region", "aio")


def bf16_exact(rng, shape):
    """float32 values that bf16 holds exactly (what the server stores)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(rng.standard_normal(shape).astype(np.float32)))


def bits(t, torch):
    """A tensor's bytes as integers of its width, on the host (bitwise equality, NaN included)."""
    return t.detach().cpu().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


class Buffers:
    """One case's CUDA tensors, made once and reused by every round."""

    def __init__(self, torch, n, q_heads, head_dim, q_dtype, out_dtype, gen):
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        self.q = torch.randn((n, q_heads, head_dim), generator=gen, device="cuda").to(dt[q_dtype])
        self.out = torch.empty((n, q_heads, head_dim), dtype=dt[out_dtype], device="cuda")
        self.lse = torch.empty((n, q_heads), dtype=torch.float32, device="cuda")
        self.q_host = self.q.cpu()  # the same bytes, for the inline call
        self.out_host = torch.empty((n, q_heads, head_dim), dtype=dt[out_dtype])
        self.lse_host = torch.empty((n, q_heads), dtype=torch.float32)

    def tensors(self):
        return [self.q, self.out, self.lse]


def by_reference(req) -> bool:
    return all(m.HasField("query_ref") and not m.query and m.HasField("output_ref") and m.HasField("lse_ref")
               for m in req.items)


class Cases:
    """Each case's results over the rounds: by reference in every round,
    the most mismatching elements of any round."""

    def __init__(self):
        self.cases = {}

    def add(self, torch, key, b: Buffers, req, got) -> None:
        c = self.cases.setdefault(f"q={key[0]} out={key[1]}", {
            "by_reference": True, "returned_destinations": True, "out_mismatches": 0, "lse_mismatches": 0,
            "inline_finite": bool(torch.isfinite(b.out_host.float()).all() and torch.isfinite(b.lse_host).all())})
        c["by_reference"] &= by_reference(req)
        c["returned_destinations"] &= got.output is b.out and got.lse is b.lse
        c["out_mismatches"] = max(c["out_mismatches"], int((bits(b.out, torch) != bits(b.out_host, torch)).sum()))
        c["lse_mismatches"] = max(c["lse_mismatches"], int((bits(b.lse, torch) != bits(b.lse_host, torch)).sum()))

    def ok(self) -> bool:
        for c in self.cases.values():
            c["ok"] = (c["by_reference"] and c["returned_destinations"] and c["inline_finite"]
                       and c["out_mismatches"] == 0 and c["lse_mismatches"] == 0)
        return bool(self.cases) and all(c["ok"] for c in self.cases.values())


def registrations(before: int, first: int, after: int, cuda: CudaRegions, buffers, rounds: int) -> dict:
    """RegisterRegion calls in the first round (one per allocation, more
    when a later tensor of an allocation re-registers it larger) and in the
    repeated rounds (none), against the allocations the tensors live in."""
    allocations = len({CudaRegions._where(t)[0] for b in buffers for t in b.tensors()})
    r = {"first_round": first - before, "repeated_rounds": rounds - 1, "during_repeats": after - first,
         "cached": cuda.registered(), "allocations": allocations}
    r["ok"] = r["during_repeats"] == 0 and r["cached"] == allocations and r["first_round"] >= allocations
    return r


def inline_answers(c, seqs, buffers) -> None:
    """The inline answers to the same query bytes, into the host tensors."""
    for b in buffers.values():
        c.attend([AttendItem(s, 0, b.q_host[i]) for i, s in enumerate(seqs)], out=b.out_host, lse=b.lse_host)


def prepared(torch, seqs, b: Buffers):
    b.out.fill_(float("nan"))
    b.lse.fill_(float("nan"))
    torch.cuda.synchronize()  # the server reads the tensors from its own process
    return [AttendItem(s, 0, b.q[i]) for i, s in enumerate(seqs)]


def check_sync(torch, c, seqs, buffers, rounds) -> dict:
    cases = Cases()
    before = c.stats().regions_registered
    for rnd in range(rounds):
        for key, b in buffers.items():
            items = prepared(torch, seqs, b)
            req, _, _ = c.prepare_attend(items, out=b.out, lse=b.lse)
            cases.add(torch, key, b, req, c.attend(items, out=b.out, lse=b.lse))
        if rnd == 0:
            first = c.stats().regions_registered
    regs = registrations(before, first, c.stats().regions_registered, c._places.cuda(), buffers.values(), rounds)
    return {"cases": cases.cases, "registrations": regs, "ok": cases.ok() and regs["ok"]}


async def check_aio(torch, target, timeout, seqs, buffers, rounds) -> dict:
    cases = Cases()
    async with driftkv.aio.Client(target, timeout=timeout) as c:
        before = (await c.stats()).regions_registered
        for rnd in range(rounds):
            for key, b in buffers.items():
                items = prepared(torch, seqs, b)
                req, _, _ = await c.prepare_attend(items, out=b.out, lse=b.lse)
                cases.add(torch, key, b, req, await c.attend(items, out=b.out, lse=b.lse))
            if rnd == 0:
                first = (await c.stats()).regions_registered
        regs = registrations(before, first, (await c.stats()).regions_registered, c._places.cuda(),
                             buffers.values(), rounds)
    return {"cases": cases.cases, "registrations": regs, "ok": cases.ok() and regs["ok"]}


def check_step(torch, c, info, q_heads, tokens, rng, prefix) -> dict:
    """A decode step with CUDA query, new_key and new_value against the same
    step inline on a twin sequence."""
    a, b = f"{prefix}-step-a", f"{prefix}-step-b"
    keys = bf16_exact(rng, (tokens, info.kv_heads, info.head_dim))
    values = bf16_exact(rng, (tokens, info.kv_heads, info.head_dim))
    for s in (a, b):
        c.append(s, 0, keys, values)
    try:
        nk = torch.from_numpy(bf16_exact(rng, (info.kv_heads, info.head_dim))).cuda()
        nv = torch.from_numpy(bf16_exact(rng, (info.kv_heads, info.head_dim))).cuda()
        q = torch.randn((q_heads, info.head_dim), device="cuda")
        out = torch.full((q_heads, info.head_dim), float("nan"), device="cuda")
        lse = torch.full((q_heads,), float("nan"), device="cuda")
        torch.cuda.synchronize()
        item = AttendItem(b, 0, q, nk, nv, new_token_index=tokens)
        req, _, _ = c.prepare_attend(item, out=out, lse=lse)
        refs = all(req.items[0].HasField(f) for f in ("query_ref", "new_key_ref", "new_value_ref", "output_ref",
                                                     "lse_ref"))
        c.attend(item, out=out, lse=lse)
        inline = c.attend(AttendItem(a, 0, q.cpu(), nk.cpu(), nv.cpu(), new_token_index=tokens))
        r = {"by_reference": refs,
             "out_mismatches": int((bits(out, torch) != bits(inline.output, torch)).sum()),
             "lse_mismatches": int((bits(lse, torch) != bits(inline.lse, torch)).sum()),
             "length_a": c.length(a)[0].tokens, "length_b": c.length(b)[0].tokens}
        r["ok"] = (refs and r["out_mismatches"] == 0 and r["lse_mismatches"] == 0
                   and r["length_a"] == r["length_b"] == tokens + 1)
        return r
    finally:
        for s in (a, b):
            c.release(s)


def check_host_region(c, seqs, q_heads, head_dim, rng, socket_path) -> dict:
    """numpy queries and destinations in a host region (through the region socket)."""
    n = len(seqs)
    q = rng.standard_normal((n, q_heads, head_dim)).astype(np.float32)
    want = c.attend([AttendItem(s, 0, q[i]) for i, s in enumerate(seqs)])
    with c.register_host_region(4 << 20, name="gpu-check", socket_path=socket_path) as region:
        q_ref = region.alloc(q.shape, np.float32)
        q_ref[...] = q
        out = region.alloc(q.shape, np.float32)
        lse = region.alloc((n, q_heads), np.float32)
        out[...] = np.nan
        items = [AttendItem(s, 0, q_ref[i]) for i, s in enumerate(seqs)]
        req, _, _ = c.prepare_attend(items, out=out, lse=lse)
        c.attend(items, out=out, lse=lse)
        r = {"region_id": region.id, "by_reference": by_reference(req),
             "out_mismatches": int((out.view(np.uint32) != want.output.view(np.uint32)).sum()),
             "lse_mismatches": int((lse.view(np.uint32) != want.lse.view(np.uint32)).sum())}
    r["ok"] = r["by_reference"] and r["out_mismatches"] == 0 and r["lse_mismatches"] == 0
    return r


def run_check(name, report, fn, *args):
    try:
        report[name] = fn(*args)
    except DriftkvError as e:
        report[name] = {"ok": False, "error": f"{e.code.name}: {e.details}"}
    except Exception as e:  # noqa: BLE001 - reported, the other checks still run
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"}


def checks(torch, args, report) -> None:
    rng = np.random.default_rng(args.seed)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    prefix = "gpu-check-" + uuid.uuid4().hex[:8]
    c = driftkv.Client(args.target, timeout=args.timeout)
    info = c.info()
    q_heads = args.q_heads or 4 * info.kv_heads
    report.update(model={"layers": info.layers, "kv_heads": info.kv_heads, "head_dim": info.head_dim},
                  q_heads=q_heads, region_socket=args.region_socket or info.region_socket)
    seqs = [f"{prefix}-{i}" for i in range(args.sequences)]
    try:
        for s in seqs:
            c.append(s, 0, bf16_exact(rng, (args.tokens, info.kv_heads, info.head_dim)),
                     bf16_exact(rng, (args.tokens, info.kv_heads, info.head_dim)))
        buffers = {(qd, od): Buffers(torch, len(seqs), q_heads, info.head_dim, qd, od, gen)
                   for qd in Q_DTYPES for od in OUT_DTYPES}
        inline_answers(c, seqs, buffers)
        run_check("sync", report, check_sync, torch, c, seqs, buffers, args.rounds)
        run_check("step", report, check_step, torch, c, info, q_heads, args.tokens, rng, prefix)
        run_check("host_region", report, check_host_region, c, seqs, q_heads, info.head_dim, rng,
                  args.region_socket)
        c.close()  # unregisters the CUDA allocations, which the aio client registers anew
        run_check("aio", report, lambda: asyncio.run(
            check_aio(torch, args.target, args.timeout, seqs, buffers, args.rounds)))
    finally:
        for s in seqs:
            try:
                c.release(s)
            except DriftkvError:
                pass
        c.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="HOST:PORT of driftkv-server-cuda")
    p.add_argument("--region-socket", default=None,
                   help="the server's region_socket (default: the one its Info names)")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--q-heads", type=int, default=0, help="query heads (default: 4 x the model's kv_heads)")
    p.add_argument("--rounds", type=int, default=5, help="calls per case with the same tensors")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        print("skipped: no GPU")
        return 0

    report = {"target": args.target, "torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "sequences": args.sequences, "tokens": args.tokens, "rounds": args.rounds}
    try:
        checks(torch, args, report)
    except Exception as e:  # noqa: BLE001 - the report says what broke
        report["error"] = f"{type(e).__name__}: {e}"
    report["ok"] = "error" not in report and all(report.get(k, {}).get("ok") for k in CHECKS)
    print(json.dumps(report, sort_keys=True))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
