"""driftkv-generate: a real model decoding through driftkv.

The eval model (kvfix-llama-15m) acts as a prefill worker (runs the prompt
with exact attention, pushes every layer's post-RoPE keys and values with
Append) and as a decode worker (each step, each layer: q/k/v of the new
token, one batched Attend with new_key/new_value/new_token_index for all
prompts, the output through o_proj, the next layer). Side by side, the
same model decodes on its own exact attention over a float32 cache it
holds itself. Printed:
  - the texts, greedy and sampled (both paths draw the same random
    numbers), exact attention next to driftkv;
  - teacher-forced on the held-out continuation: top-1 agreement of the
    next-token distributions and the mean per-token KL(exact || driftkv);
  - decode tokens/s of both paths and the Attend latency.

Prompts: windows of BOS + text from Persuasion (Austen; held out from the
model's training, read from Debian's r-cran-janeaustenr), avoiding the two
windows the fixtures came from; or --text FILE.

    python/driftkv-generate [--server HOST:PORT] [--prompts 4]
        [--prompt-tokens 768] [--new-tokens 128] [--check]

(or python3 python/examples/generate.py with the driftkv package
importable: pip install -e python, or python/ on PYTHONPATH).

Without --server it starts a driftkv-server on a loopback port with
--config (default deploy/driftkv-server.textproto). Any server serving the
model's shape (4 layers x 4 KV heads x 128) works, CUDA backend included.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from typing import List, Optional, Tuple

import numpy as np
import torch

import driftkv
from driftkv.local_server import LocalServer
from eval_data import REPO_ROOT, eval_dir, persuasion_text
from llama import Llama, LocalCache
from tokenizer import Tokenizer


def fixture_ranges(eval_dir: str) -> List[Tuple[int, int]]:
    """Token ranges of Persuasion the fixtures were captured from."""
    try:
        with open(os.path.join(eval_dir, "fixture_public.json")) as f:
            return [tuple(s["text_token_range"]) for s in json.load(f)["sequences"]]
    except (OSError, KeyError, ValueError):
        return [(36397, 37420), (102123, 103146)]


def windows(ids: List[int], count: int, span: int, avoid: List[Tuple[int, int]]) -> List[int]:
    """`count` starts of `span` tokens spread over the text, none overlapping `avoid`."""
    last = len(ids) - span
    if last < 0:
        raise SystemExit(f"driftkv-generate: the text has {len(ids)} tokens; a window needs {span}")
    starts = []
    for i in range(count):
        s = round((i + 0.5) * last / count)
        for a, b in sorted(avoid):
            if s < b and a < s + span:
                s = b if b <= last else max(0, a - span)
        starts.append(s)
    return starts


class Transport:
    """How the decode worker reaches driftkv. "shm": unary gRPC whose
    queries, the step's keys and values, outputs and lse live in a host
    shared-memory region (the server on this host, with a region socket):
    the messages carry references only. "doorbell": the same region, and
    the requests cross it too (no socket; the client sleeps on a futex
    for the answer), each layer's request prepared on the doorbell once
    (a call sends only the layer's slot and the steps taken). "grpc":
    tensors inline. `want` "auto" takes the
    doorbell when the server has a region socket (the fast path: no
    socket per call), else grpc."""

    def __init__(self, client: driftkv.Client, batch: int, q_heads: int, kv_heads: int, head_dim: int, want: str):
        self.bell = None
        self.region = None
        self.name = "grpc"
        if want == "grpc":
            return
        want_bell = want in ("doorbell", "auto")
        try:
            arrays = 4 * batch * (2 * q_heads * head_dim + 2 * kv_heads * head_dim + q_heads) + 5 * 64
            self.region = client.register_host_region(arrays + (5 << 20), name="driftkv-generate")
            self.q = self.region.alloc((batch, q_heads, head_dim), np.float32)
            self.k = self.region.alloc((batch, kv_heads, head_dim), np.float32)
            self.v = self.region.alloc((batch, kv_heads, head_dim), np.float32)
            self.out = self.region.alloc((batch, q_heads, head_dim), np.float32)
            self.lse = self.region.alloc((batch, q_heads), np.float32)
            if want_bell:
                self.bell = client.open_doorbell(self.region)
            self.name = "doorbell in host shared memory" if want_bell else "gRPC, tensors in host shared memory"
        except driftkv.DriftkvError as e:
            if want != "auto":
                raise SystemExit(f"driftkv-generate: no host shared memory: {e}")
            self.close()
            self.name = f"grpc (no host shared memory: {e.details})"

    def by_reference(self) -> bool:
        return self.region is not None

    def close(self) -> None:
        if self.bell is not None:
            self.bell.close()
            self.bell = None
        if self.region is not None:
            self.region.close()
            self.region = None


class DriftkvAttention:
    """The decode worker's attention: one Attend per layer and step, an item
    per sequence, each appending the new token at its index (idempotent, so
    the client may retry it)."""

    def __init__(self, client: driftkv.Client, sequence_ids: List[str], transport: Transport):
        self.client = client
        self.ids = sequence_ids
        self.transport = transport
        self.latencies: List[float] = []
        self.prepared = {}  # layer -> the position its doorbell request was prepared at

    def __call__(self, layer, q, k, v, position):
        t = self.transport
        if t.by_reference() and q.device.type == "cpu":
            t0 = time.perf_counter()
            t.q[...], t.k[...], t.v[...] = q.float().numpy(), k.float().numpy(), v.float().numpy()
            if t.bell is not None:
                # Each layer's request is prepared on the doorbell once; a
                # call then sends only the layer's slot and the steps taken.
                first = self.prepared.get(layer)
                if first is None:
                    items = [driftkv.AttendItem(sid, layer, t.q[b], new_key=t.k[b], new_value=t.v[b],
                                                new_token_index=position) for b, sid in enumerate(self.ids)]
                    t.bell.prepare(layer, items, out=t.out, lse=t.lse)
                    first = self.prepared[layer] = position
                t.bell.attend_prepared(layer, position - first)
            else:
                items = [driftkv.AttendItem(sid, layer, t.q[b], new_key=t.k[b], new_value=t.v[b],
                                            new_token_index=position) for b, sid in enumerate(self.ids)]
                self.client.attend(items, out=t.out, lse=t.lse)
            out = torch.from_numpy(t.out.copy())
            self.latencies.append(time.perf_counter() - t0)
            return out
        items = [driftkv.AttendItem(sid, layer, q[b], new_key=k[b], new_value=v[b], new_token_index=position)
                 for b, sid in enumerate(self.ids)]
        t0 = time.perf_counter()
        out, _ = self.client.attend(items)
        self.latencies.append(time.perf_counter() - t0)
        return out


def push(client: driftkv.Client, kv, sequence_ids: List[str], chunk_tokens: int = 256) -> Tuple[int, float]:
    """The prefill worker's Append: every layer of every sequence, bf16 on the
    wire (what the server stores), one stream of chunks."""
    def chunks():
        for i, (k, v) in enumerate(kv):
            for b, sid in enumerate(sequence_ids):
                for t in range(0, k.shape[1], chunk_tokens):
                    yield driftkv.Chunk(sid, i, t, k[b, t:t + chunk_tokens], v[b, t:t + chunk_tokens], "bf16")

    total = sum(k.shape[0] * k.shape[1] for k, _ in kv)
    tty = sys.stderr.isatty()

    def progress(n, tokens):
        if tty:
            print(f"\r  push {100 * tokens // total}%", end="", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    r = client.append_chunks(chunks(), progress=progress)
    if tty:
        print("\r", end="", file=sys.stderr)
    return r.tokens_stored, time.perf_counter() - t0


def pick(logits: torch.Tensor, temperature: float, top_k: int, noise: Optional[torch.Tensor]) -> torch.Tensor:
    """Greedy (noise None) or Gumbel-max sampling with the given noise, so
    that two paths drawing the same noise pick the same token wherever their
    distributions agree closely enough."""
    if noise is None:
        return logits.argmax(-1)
    scaled = logits.double() / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return (scaled + noise).argmax(-1)


def gumbel(shape, seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    u = torch.rand(shape, generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)
    return -torch.log(-torch.log(u))


def kl_and_top1(exact_logits: torch.Tensor, other_logits: torch.Tensor):
    """Per row: KL(p_exact || p_other) in nats, and whether the argmaxes agree."""
    lp = torch.log_softmax(exact_logits.double(), -1)
    lq = torch.log_softmax(other_logits.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return kl.cpu().tolist(), (exact_logits.argmax(-1) == other_logits.argmax(-1)).cpu().tolist()


def quantile(xs: List[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q)) if xs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="driftkv-generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", help="HOST:PORT of a driftkv-server (default: start one)")
    ap.add_argument("--config", default=os.path.join(REPO_ROOT, "deploy", "driftkv-server.textproto"),
                    help="config of the server started without --server")
    ap.add_argument("--server-bin", help="driftkv-server binary (default: bazel-bin/service/driftkv-server)")
    ap.add_argument("--eval-dir", default=eval_dir(),
                    help="the eval folder (model/; default $DRIFTKV_EVAL_DIR, else ../shared/eval)")
    ap.add_argument("--text", help="prompt text file (default: Persuasion)")
    ap.add_argument("--persuasion-file",
                    help="Persuasion as plain text (default: written from r-cran-janeaustenr to $TMPDIR)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts, decoded as one batch")
    ap.add_argument("--prompt-tokens", type=int, default=768, help="tokens per prompt, BOS included")
    ap.add_argument("--new-tokens", type=int, default=128, help="tokens generated (and teacher-forced)")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=1, help="prompts whose texts are printed")
    ap.add_argument("--device", default="auto", help="torch device: auto, cpu, cuda")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--transport", choices=("auto", "shm", "doorbell", "grpc"), default="auto",
                    help="how Attend reaches the server: shm (gRPC, tensors by reference in host shared memory), "
                         "doorbell (requests through shared memory too), grpc (tensors inline); auto: the doorbell "
                         "when the server has a region socket (the server this starts has one), else grpc")
    ap.add_argument("--json", help="write the metrics to this file")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless top-1 agreement >= 90%% and mean KL <= 0.02 nats")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    model = Llama(os.path.join(args.eval_dir, "model"), device)
    tok = Tokenizer(os.path.join(args.eval_dir, "model", "tokenizer.json"))
    P, N, B = args.prompt_tokens, args.new_tokens, args.prompts
    if P < 1 or N < 1 or P + N > model.context:
        raise SystemExit(f"driftkv-generate: prompt {P} + new {N} tokens must fit the model's context {model.context}")
    if args.text:
        with open(args.text) as f:
            text, source, avoid = f.read(), args.text, []
    else:
        text, source = persuasion_text(args.persuasion_file), "Persuasion (held out from the model's training)"
        avoid = fixture_ranges(args.eval_dir)
    ids = tok.encode(text)
    starts = windows(ids, B, P + N - 1, avoid)
    batch = torch.tensor([[0] + ids[s:s + P + N - 1] for s in starts])  # BOS + text: [B, P + N]

    server = None
    if args.server is None:
        # The sample config plus a region socket, so that the decode worker
        # can take the fast path (docs/data_plane.md).
        sock_dir = tempfile.mkdtemp(prefix="driftkv-generate-")
        with open(args.config) as f:
            config_text = f.read() + f'\nregion_socket: "{os.path.join(sock_dir, "regions.sock")}"\n'
        server = LocalServer(config_text=config_text, binary=args.server_bin)
        target = server.target
    else:
        target = args.server
    run = uuid.uuid4().hex[:8]
    created: List[str] = []
    try:
        with driftkv.Client(target, timeout=60.0) as client:
            info = client.info()
            if (info.layers, info.kv_heads, info.head_dim) != (model.layers, model.kv_heads, model.head_dim):
                raise SystemExit(f"driftkv-generate: the server serves {info.layers} layers x {info.kv_heads} x "
                                 f"{info.head_dim}; the model needs {model.layers} x {model.kv_heads} x {model.head_dim}")
            print(f"== driftkv-generate: kvfix-llama-15m decoding through driftkv ({device}, torch {torch.__version__})")
            print(f"server {target}: driftkv-server {info.server_version}, backend {info.backend}, {info.layers} layers x "
                  f"{info.kv_heads} kv_heads x {info.head_dim}, {info.codec} {info.key_bits_per_value:.2f}/"
                  f"{info.value_bits_per_value:.2f} bits per key/value, pages of {info.page_tokens} tokens, bf16 "
                  f"window {info.window_tokens}, hot tier {'on' if info.hot_tier else 'off'}")
            print(f"text: {source}; {B} prompts of {P} tokens (BOS + text) at token offsets "
                  f"{', '.join(map(str, starts))}" +
                  (f" (the fixtures' windows {', '.join(f'[{a}, {b})' for a, b in avoid)} avoided)" if avoid else ""))

            t0 = time.perf_counter()
            first, kv = model.prefill(batch[:, :P])
            prefill_s = time.perf_counter() - t0

            transport = Transport(client, B, model.q_heads, model.kv_heads, model.head_dim, args.transport)
            print(f"decode worker's transport: {transport.name}")
            results = {}
            latencies: List[float] = []
            pushes = []
            for mode in ("forced", "greedy", "sampled"):
                seqs = [f"generate-{run}-{mode}-{b}" for b in range(B)]
                created += seqs
                stored, push_s = push(client, kv, seqs)
                pushes.append((stored, push_s))
                exact_attn = LocalCache(model, kv, P + N)
                remote_attn = DriftkvAttention(client, seqs, transport)
                times = {"exact": 0.0, "driftkv": 0.0}
                kls: List[float] = []
                agree: List[bool] = []
                nll = {"exact": [], "driftkv": []}
                if mode == "forced":
                    tokens = {"exact": None, "driftkv": None}
                    for i in range(N):
                        p = P + i
                        t0 = time.perf_counter()
                        le = model.decode_step(batch[:, p], p, exact_attn)
                        t1 = time.perf_counter()
                        ld = model.decode_step(batch[:, p], p, remote_attn)
                        t2 = time.perf_counter()
                        times["exact"] += t1 - t0
                        times["driftkv"] += t2 - t1
                        k, a = kl_and_top1(le, ld)
                        kls += k
                        agree += a
                        if p + 1 < P + N:
                            target_ids = batch[:, p + 1].to(le.device)
                            for name, lg in (("exact", le), ("driftkv", ld)):
                                nll[name] += torch.nn.functional.cross_entropy(
                                    lg.double(), target_ids, reduction="none").cpu().tolist()
                else:
                    noise = (lambda step: gumbel((B, model.vocab), args.seed, step).to(first.device)) \
                        if mode == "sampled" else (lambda step: None)
                    t_first = pick(first, args.temperature, args.top_k, noise(0))
                    tokens = {"exact": [t_first], "driftkv": [t_first]}
                    for i in range(N - 1):
                        p = P + i
                        for name, attn in (("exact", exact_attn), ("driftkv", remote_attn)):
                            t0 = time.perf_counter()
                            lg = model.decode_step(tokens[name][-1], p, attn)
                            times[name] += time.perf_counter() - t0
                            tokens[name].append(pick(lg, args.temperature, args.top_k, noise(i + 1)))
                    tokens = {k: torch.stack(v, 1).cpu() for k, v in tokens.items()}  # [B, N]
                latencies += remote_attn.latencies
                results[mode] = {"times": times, "kl": kls, "agree": agree, "nll": nll, "tokens": tokens,
                                 "steps": N if mode == "forced" else N - 1}
            stats = client.stats()
            lengths = client.length(created[0])
            transport.close()
    finally:
        if created:
            try:
                with driftkv.Client(target, timeout=10.0) as c:
                    for sid in created:
                        try:
                            c.release(sid)
                        except driftkv.DriftkvError:
                            pass
            except driftkv.DriftkvError:
                pass
        if server is not None:
            server.stop()
            shutil.rmtree(sock_dir, ignore_errors=True)

    # -- the texts ---------------------------------------------------------
    def same_prefix(a, b):
        n = 0
        while n < len(a) and a[n] == b[n]:
            n += 1
        return n

    for b in range(min(args.show, B)):
        tail = tok.decode(batch[b, 1:P].tolist())[-300:]
        print(f"\n-- prompt {b} (text tokens [{starts[b]}, {starts[b] + P - 1}) after BOS), its last 300 characters:")
        print("   ..." + tail.replace("\n", "\n   "))
        for mode, label in (("greedy", "greedy"), ("sampled", f"sampled (T {args.temperature}, top-k {args.top_k}, "
                                                                f"seed {args.seed}, same draws)")):
            te, td = results[mode]["tokens"]["exact"][b].tolist(), results[mode]["tokens"]["driftkv"][b].tolist()
            print(f"\n   {label}, exact attention:\n   >>> " + tok.decode(te).replace("\n", "\n   >>> "))
            print(f"   {label}, driftkv:\n   >>> " + tok.decode(td).replace("\n", "\n   >>> "))
            print(f"   (identical for the first {same_prefix(te, td)} of {N} tokens)")

    # -- the metrics -------------------------------------------------------
    f = results["forced"]
    agreement = sum(f["agree"]) / len(f["agree"])
    mean_kl = sum(f["kl"]) / len(f["kl"])
    gen = {m: [same_prefix(results[m]["tokens"]["exact"][b].tolist(), results[m]["tokens"]["driftkv"][b].tolist())
               for b in range(B)] for m in ("greedy", "sampled")}
    decode_steps = sum(r["steps"] for r in results.values())
    tps = {name: B * decode_steps / sum(r["times"][name] for r in results.values()) for name in ("exact", "driftkv")}
    pushed = sum(s for s, _ in pushes)
    push_s = sum(t for _, t in pushes)
    print(f"\n== metrics ({B} prompts x {N} tokens after {P}-token prompts)")
    print(f"teacher-forced on the held-out continuation, {len(f['kl'])} next-token distributions:")
    print(f"  top-1 agreement with exact attention  {100 * agreement:.1f}% ({sum(f['agree'])}/{len(f['agree'])})"
          f"{'   [bar >= 90%]' if args.check else ''}")
    print(f"  mean per-token KL(exact || driftkv)   {mean_kl:.4f} nats (median {quantile(f['kl'], 0.5):.4f}, "
          f"p99 {quantile(f['kl'], 0.99):.4f}, max {max(f['kl']):.4f}){'   [bar <= 0.02]' if args.check else ''}")
    print(f"  NLL of the true text                  exact {np.mean(f['nll']['exact']):.4f}, driftkv "
          f"{np.mean(f['nll']['driftkv']):.4f} nats/token")
    for m in ("greedy", "sampled"):
        print(f"{m}: driftkv's text equals exact attention's for the first {', '.join(map(str, gen[m]))} of {N} tokens")
    print(f"prefill: {B} x {P} tokens in {prefill_s:.2f} s; Append of every layer: {pushed} tokens in {push_s:.2f} s "
          f"({pushed / push_s:,.0f} tokens/s, bf16 on the wire, {len(pushes)} pushes)")
    print(f"decode: driftkv {tps['driftkv']:.1f} tokens/s, exact local attention {tps['exact']:.1f} tokens/s "
          f"({B} sequences per step, {model.layers} Attend calls of {B} items per step)")
    print(f"Attend ({transport.name}) latency: p50 {1e3 * quantile(latencies, 0.5):.2f} ms, p90 {1e3 * quantile(latencies, 0.9):.2f} ms, "
          f"p99 {1e3 * quantile(latencies, 0.99):.2f} ms over {len(latencies)} calls of {B} items "
          f"({P}-{P + N - 1} tokens per layer)")
    print(f"server: layer 0 of one sequence holds {lengths[0].tokens} tokens ({lengths[0].compressed_tokens} compressed, "
          f"{lengths[0].window_tokens} in the bf16 window); {stats.pages_in_use} pages in use "
          f"({stats.bytes_in_use / 2**20:.1f} MiB), {stats.hot_pages_in_use} hot")
    print(f"wall time {time.perf_counter() - t_start:.1f} s")
    metrics = {"prompts": B, "prompt_tokens": P, "new_tokens": N, "starts": starts, "source": source,
               "top1_agreement": agreement, "mean_kl": mean_kl, "kl_p99": quantile(f["kl"], 0.99),
               "nll_exact": float(np.mean(f["nll"]["exact"])), "nll_driftkv": float(np.mean(f["nll"]["driftkv"])),
               "greedy_same_prefix": gen["greedy"], "sampled_same_prefix": gen["sampled"],
               "tokens_per_s": tps, "attend_p50_ms": 1e3 * quantile(latencies, 0.5),
               "attend_p99_ms": 1e3 * quantile(latencies, 0.99), "attend_calls": len(latencies),
               "transport": transport.name,
               "backend": info.backend, "device": device}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(metrics, out, indent=1)
    if args.check:
        ok = agreement >= 0.90 and mean_kl <= 0.02
        print("check: " + ("PASS" if ok else "FAIL") + f" (top-1 agreement {100 * agreement:.1f}% >= 90%, "
              f"mean KL {mean_kl:.4f} <= 0.02)")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
