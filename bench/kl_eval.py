#!/usr/bin/python3
"""Model-level KL evaluation of the KV codecs (docs/quality.md, D-Quant Appendix B
protocol scaled to the 1024-token eval model).

For each window of held-out *Persuasion* (Austen; never seen in training):
  1. tokens = BOS + 1023 consecutive tokens of the novel;
  2. the unquantized model runs the whole window; its post-RoPE keys and
     values of the first `--context` (768) positions, every layer, are the
     cache;
  3. each codec encodes that cache and decodes it, through
     `driftkv-codec encode` / `decode` (all windows and layers in one call);
  4. the model runs positions [768, 1024) again, teacher-forced on the true
     text, attending to the reconstructed cache of [0, 768) and to its own
     exact keys/values of [768, pos]; the per-position forward KL
     KL(p_ref || p_codec) of the next-token distributions is averaged over
     the 256 positions: one number per window ("document").
Reported per codec: bits per value (from the codec, all metadata), mean KL,
and against a reference codec the geometric mean over documents of the
per-document KL ratio with a paired bootstrap 95% interval (--bootstrap
resamples of the documents). Appendix B: dquant vs `fixed` at matched
storage, and the extra bits per value `fixed` needs to reach dquant's KL
(log-KL interpolated along the lower envelope of fixed's level grid).

The model runs on the GPU when torch sees one (--device auto; fp32, TF32
off) and otherwise on the CPU (Debian's python3-torch 1.13, /usr/bin/python3);
the codec runs are separate processes, --jobs at a time. Outside this
repository pass --eval-dir (model/, fixture_public.json) and --text.
usage: bench/kl_eval.py --codec-bin PATH/driftkv-codec [--windows 24]
       [--residual 0] [--out DIR] [--threads 2] [--jobs 1] [--device auto]
       [--only both|keys|values[,...]] [--config "NAME FLAGS..." ...]
       [--extra "NAME FLAGS..." ...]
--only replaces just the keys (or just the values) by the reconstruction,
the other stays exact (a diagnostic of where the divergence comes from);
a comma list evaluates several modes on one encoding and writes kl.*,
kl_keys_only.* and kl_values_only.* into --out. --config evaluates only
the listed configurations (the first is the reference of the ratios)
instead of the standard set; --extra adds configurations to the standard
set (ratios against `int` INT2 and, for dquant, the matched `fixed`).
Each result carries NMSE and the shrinkage statistic over the evaluated
cache: the mean over token streams of (xhat - x).x / x.x and |xhat| / |x|.
"""
import argparse
import concurrent.futures
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

# The eval model, its tokenizer and the eval data: python/examples/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "examples"))
from eval_data import check_tokens, eval_dir, persuasion_text  # noqa: E402
from llama import Llama  # noqa: E402
from tokenizer import Tokenizer  # noqa: E402

WINDOW = 1024  # model context; BOS + 1023 text tokens


def fixed_bytes(n, m):
    """BaseMBytes of codec/baselines/base_m.h: bytes holding M^n - 1."""
    return ((m ** n - 1).bit_length() + 7) // 8


def configs(n, dq_bits):
    """(name, flags, tag) of every evaluated configuration. dq_bits maps
    dquant tags to (key bits, value bits) measured on this cache, so the
    matched `fixed` levels are the largest whose storage fits."""
    mean_stride = (n + 4 + 3) // 4 * 4
    out = [("dquant", [], "default")]
    # The sweep's 1.96 point (tools/sweep_points.cc).
    kb, vb = 2.69 / 2.265 * 1.96, 1.84 / 2.265 * 1.96
    lk = min(16, max(3, round(2 ** (kb + 0.31))))
    lv = min(16, max(3, round(2 ** (vb + 0.74))))
    pk = int((kb * n / 8 - mean_stride / 128) // 4) * 4 - 4
    pv = int((vb * n / 8) // 4) * 4 - 4
    out.append(("dquant", ["--k-bytes", str(pk), "--v-bytes", str(pv), "--k-levels", str(lk),
                           "--v-levels", str(lv)], "b1.96"))
    for tag, (bk, bv) in dq_bits.items():
        mk = max(m for m in range(2, 65)
                 if 8 * (4 + fixed_bytes(n, m) + mean_stride / 128) / n <= bk + 1e-9)
        mv = max(m for m in range(2, 65) if 8 * (4 + fixed_bytes(n, m)) / n <= bv + 1e-9)
        out.append(("fixed", ["--k-levels", str(mk), "--v-levels", str(mv)], "matched-" + tag))
    for name in ("int", "kivi", "oscar", "turbo"):
        out.append((name, ["--bits", "2", "--group", "128"], "default"))
    out += [("fp8", [], "default"), ("bf16", [], "default")]
    for mk, mv in ((4, 3), (6, 4), (7, 5), (8, 6), (10, 7)):
        out.append(("fixed", ["--k-levels", str(mk), "--v-levels", str(mv)], "grid"))
    return out


def run_codec(binary, name, flags, kv_prefix, shape, residual, work):
    pool = os.path.join(work, "pool")
    cmd = [binary, "encode", "--codec", name, *flags, "--keys", kv_prefix + ".k",
           "--values", kv_prefix + ".v", "--shape", shape, "--residual", str(residual),
           "--out", pool, "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\n{r.stderr}")
    stats = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))
    out = os.path.join(work, "decoded")
    r = subprocess.run([binary, "decode", "--in", pool, "--out", out], capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise SystemExit(f"decode {name}: {r.stderr}")
    k = np.fromfile(out + ".k", dtype=np.float32)
    v = np.fromfile(out + ".v", dtype=np.float32)
    return stats, k, v, " ".join([os.path.basename(binary), "encode", "--codec", name, *flags])


def kl_per_doc(model, windows, ref_logp, k, v, ctx, layers, heads, hd):
    """Mean forward KL over the continuation of each window."""
    dev = model.device
    k = torch.from_numpy(k).view(len(windows), layers, ctx, heads, hd)
    v = torch.from_numpy(v).view(len(windows), layers, ctx, heads, hd)
    out = []
    for w, ids in enumerate(windows):
        past = [(k[w, l].to(dev), v[w, l].to(dev)) for l in range(layers)]
        logits = model.forward_continuation(ids[ctx:], ctx, past)
        logq = torch.log_softmax(logits.double(), -1)
        logp = ref_logp[w]
        out.append(float((logp.exp() * (logp - logq)).sum(-1).mean()))
    return out


def shrinkage(x, xhat, n):
    """Mean over token streams (n values: one token's keys or values at one
    layer) of (xhat - x).x / x.x, and of |xhat| / |x|."""
    x = x.reshape(-1, n).astype(np.float64)
    xhat = xhat.reshape(-1, n).astype(np.float64)
    xx = (x * x).sum(1)
    keep = xx > 0
    proj = ((xhat - x) * x).sum(1)[keep] / xx[keep]
    norm = np.sqrt((xhat * xhat).sum(1)[keep] / xx[keep])
    return float(proj.mean()), float(norm.mean())


def geo_ratio(a, b, resamples, rng):
    """Geometric mean of a_i / b_i and its paired-bootstrap 95% interval
    (resampling the documents; numpy's generator)."""
    logs = np.log(np.asarray(a) / np.asarray(b))
    n = len(logs)
    means = np.sort(logs[rng.integers(0, n, size=(resamples, n))].mean(1))
    lo, hi = means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]
    return (float(math.exp(logs.mean())), float(math.exp(lo)), float(math.exp(hi)),
            int((logs < 0).sum()))


def extra_bits(curve, target):
    """Bits at which the lower envelope of (bits, kl) first reaches target."""
    env = []
    for x, y in sorted(curve):
        if not env or y < env[-1][1]:
            env.append((x, y))
    for i, (x, y) in enumerate(env):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = env[i - 1]
            return x0 + (math.log(y0 / target) / math.log(y0 / y)) * (x - x0)
    return None


def encode_all(binary, todo, prefix, shape, residual, jobs):
    """run_codec for every (name, flags, tag) of todo, `jobs` at a time
    (each in its own work folder); results in todo's order."""
    def one(c):
        work = tempfile.mkdtemp(prefix="kl_codec_")
        t0 = time.time()
        out = run_codec(binary, c[0], c[1], prefix, shape, residual, work)
        shutil.rmtree(work, ignore_errors=True)
        return out + (time.time() - t0,)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, todo))


def report(args, mode, results, windows, ctx, device_note, elapsed, seed):
    """The tables of one replacement mode: text and JSON."""
    rng = np.random.default_rng(seed)
    custom = bool(args.config)
    by_tag = {(r["codec"], r["tag"]): r for r in results}
    comparisons = []
    base = results[0] if custom else by_tag.get(("int", "default"))
    fixed_ref = by_tag.get(("fixed", "matched-default"))
    for r in results:
        if base is None or r is base or r["tag"] == "grid":
            continue
        g, lo, hi, wins = geo_ratio(r["kl"], base["kl"], args.bootstrap, rng)
        comparisons.append({"a": f"{r['codec']} {r['tag']}", "flags": r["flags"],
                            "b": base["command"] if custom else "int INT2 g128",
                            "ratio": g, "lo": lo, "hi": hi, "wins": wins})
        if r["codec"] == "dquant" and fixed_ref is not None:
            g, lo, hi, wins = geo_ratio(r["kl"], fixed_ref["kl"], args.bootstrap, rng)
            comparisons.append({"a": f"{r['codec']} {r['tag']}", "flags": r["flags"],
                                "b": "fixed " + " ".join(fixed_ref["flags"]),
                                "ratio": g, "lo": lo, "hi": hi, "wins": wins})
    fixed_curve = [(r["bits"], sum(r["kl"]) / len(r["kl"])) for r in results if r["codec"] == "fixed"]
    appendix_b = []
    for tag in ("default", "b1.96"):
        d, f = by_tag.get(("dquant", tag)), by_tag.get(("fixed", "matched-" + tag))
        if not d or not f:
            continue
        g, lo, hi, wins = geo_ratio(d["kl"], f["kl"], args.bootstrap, rng)
        mean_d = sum(d["kl"]) / len(d["kl"])
        x = extra_bits(fixed_curve, mean_d)
        appendix_b.append({"dquant": tag, "dquant_bits": d["bits"], "fixed_bits": f["bits"],
                           "fixed_flags": f["flags"], "ratio": g, "lo": lo, "hi": hi,
                           "dquant_better_docs": wins, "docs": len(d["kl"]),
                           "extra_bits": None if x is None else x - d["bits"]})

    lines = [f"Model KL, {len(windows)} windows of Persuasion, context {ctx}, KL over "
             f"{WINDOW - ctx} positions, residual {args.residual}, replaced: {mode}, "
             f"{device_note}, {elapsed:.0f} s",
             "", "| codec | tag | bits K | bits V | bits | NMSE K / V | projection K / V | "
             "norm V | mean KL (nats/token) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['codec']} {' '.join(r['flags'])} | {r['tag']} | {r['bits_k']:.3f} | "
                     f"{r['bits_v']:.3f} | {r['bits']:.3f} | {r['nmse_k']:.4g} / {r['nmse_v']:.4g} | "
                     f"{r['proj_k']:+.4f} / {r['proj_v']:+.4f} | {r['norm_v']:.3f} | "
                     f"{sum(r['kl']) / len(r['kl']):.5f} |")
    lines += ["", "| codec | vs | geometric-mean KL ratio | bootstrap 95% | docs where lower |",
              "|---|---|---|---|---|"]
    for c in comparisons:
        lines.append(f"| {c['a']} {' '.join(c['flags'])} | {c['b']} | {c['ratio']:.3f} | "
                     f"[{c['lo']:.3f}, {c['hi']:.3f}] | {c['wins']}/{len(windows)} |")
    lines += ["", "| dquant point | bits dquant / fixed | fixed levels | KL ratio dquant/fixed | "
              "bootstrap 95% | docs dquant lower | extra bits fixed needs |",
              "|---|---|---|---|---|---|---|"]
    for a in appendix_b:
        extra = "not reached" if a["extra_bits"] is None else f"{a['extra_bits']:+.3f}"
        lines.append(f"| {a['dquant']} | {a['dquant_bits']:.3f} / {a['fixed_bits']:.3f} | "
                     f"{' '.join(a['fixed_flags'])} | {a['ratio']:.3f} | [{a['lo']:.3f}, {a['hi']:.3f}] | "
                     f"{a['dquant_better_docs']}/{a['docs']} | {extra} |")
    return "\n".join(lines), {"comparisons": comparisons, "appendix_b": appendix_b}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--codec-bin", required=True)
    ap.add_argument("--eval-dir", default=eval_dir(), help="default $DRIFTKV_EVAL_DIR, else ../shared/eval")
    ap.add_argument("--text", default="", help="Persuasion as plain text (default: written from janeaustenr to $TMPDIR)")
    ap.add_argument("--windows", type=int, default=24)
    ap.add_argument("--context", type=int, default=768)
    ap.add_argument("--residual", type=int, default=0)
    ap.add_argument("--bootstrap", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=1, help="codec runs at a time")
    ap.add_argument("--device", default="auto", help="torch device of the model: auto (cuda "
                    "when present), cpu, cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    ap.add_argument("--only", default="both",
                    help="both, keys or values; a comma list runs several on one encoding")
    ap.add_argument("--config", action="append", default=[],
                    help='"NAME FLAGS..." e.g. "fixed --k-levels 5 --v-levels 3"')
    ap.add_argument("--extra", action="append", default=[],
                    help='"NAME FLAGS..." evaluated in addition to the standard set')
    args = ap.parse_args()
    modes = args.only.split(",")
    for m in modes:
        if m not in ("both", "keys", "values"):
            raise SystemExit(f"--only {m}: use both, keys or values")
    torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        device_note = f"GPU ({torch.cuda.get_device_name(0)}, torch {torch.__version__}, fp32, no TF32)"
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    else:
        device_note = f"CPU (torch {torch.__version__}, {args.threads} threads)"
    t_start = time.time()

    model = Llama(os.path.join(args.eval_dir, "model"), device)
    tok = Tokenizer(os.path.join(args.eval_dir, "model", "tokenizer.json"))
    ids = tok.encode(persuasion_text(args.text or None))
    check_tokens(ids, os.path.join(args.eval_dir, "fixture_public.json"))
    span = WINDOW - 1
    starts = [round(i * (len(ids) - span) / max(1, args.windows - 1)) for i in range(args.windows)]
    windows = [torch.tensor([0] + ids[s:s + span]) for s in starts]
    ctx, layers = args.context, model.layers
    heads, hd = model.kv_heads, model.head_dim
    print(f"{len(ids)} tokens of Persuasion; {len(windows)} windows, context {ctx}, "
          f"KL over {WINDOW - ctx} positions; residual {args.residual}; {device_note}",
          file=sys.stderr)

    work = tempfile.mkdtemp(prefix="kl_eval_")
    ref_logp = []
    k_all = np.empty((len(windows), layers, ctx, heads, hd), dtype=np.float32)
    v_all = np.empty_like(k_all)
    for w, wids in enumerate(windows):
        logits, kv = model.forward_full(wids)
        ref_logp.append(torch.log_softmax(logits[ctx:].double(), -1))
        for l, (k, v) in enumerate(kv):
            k_all[w, l] = k[:ctx].cpu().numpy()
            v_all[w, l] = v[:ctx].cpu().numpy()
    prefix = os.path.join(work, "cache")
    k_all.tofile(prefix + ".k")
    v_all.tofile(prefix + ".v")
    shape = f"{len(windows) * layers},{ctx},{heads},{hd}"
    print(f"reference passes: {time.time() - t_start:.0f} s", file=sys.stderr)

    def parse(c, tag):
        return (c.split()[0], c.split()[1:], tag)
    custom = [parse(c, f"config{i}") for i, c in enumerate(args.config)]
    extra = [parse(c, f"extra{i}") for i, c in enumerate(args.extra)]
    todo = list(custom) or configs(heads * hd, {})
    todo += extra
    results = {m: [] for m in modes}
    done = set()
    n = heads * hd
    while todo:
        batch = []
        for c in todo:
            key = (c[0], tuple(c[1]))
            if key not in done:
                done.add(key)
                batch.append(c)
        todo = []
        dq_bits = {}
        for (name, flags, tag), (stats, k, v, cmd, secs) in zip(
                batch, encode_all(args.codec_bin, batch, prefix, shape, args.residual, args.jobs)):
            proj_k, norm_k = shrinkage(k_all, k, n)
            proj_v, norm_v = shrinkage(v_all, v, n)
            bits = stats["bits_per_value"]
            for mode in modes:
                kk = k_all.reshape(-1) if mode == "values" else k
                vv = v_all.reshape(-1) if mode == "keys" else v
                kl = kl_per_doc(model, windows, ref_logp, kk, vv, ctx, layers, heads, hd)
                results[mode].append({
                    "codec": name, "flags": flags, "tag": tag, "command": cmd,
                    "bits_k": bits["k"], "bits_v": bits["v"], "bits": bits["mean"],
                    "nmse_k": stats["nmse_k"], "nmse_v": stats["nmse_v"],
                    "proj_k": proj_k, "proj_v": proj_v, "norm_k": norm_k, "norm_v": norm_v,
                    "kl": kl})
                print(f"{mode:6s} {name:7s} {' '.join(flags):50s} {bits['mean']:.3f} b/v  "
                      f"proj_v {proj_v:+.4f}  mean KL {sum(kl) / len(kl):.5f}  (codec {secs:.0f} s)",
                      file=sys.stderr)
            if name == "dquant" and tag in ("default", "b1.96") and not custom:
                dq_bits[tag] = (bits["k"], bits["v"])
        if len(dq_bits) == 2:  # both dquant points known: add the matched `fixed`
            todo = [c for c in configs(n, dq_bits) if c[2].startswith("matched")]

    elapsed = time.time() - t_start
    for mode in modes:
        text, extra_json = report(args, mode, results[mode], windows, ctx, device_note, elapsed,
                                  args.seed)
        print(text)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            stem = "kl" if mode == "both" else f"kl_{mode}_only"
            with open(os.path.join(args.out, stem + ".md"), "w") as f:
                f.write(text + "\n")
            with open(os.path.join(args.out, stem + ".json"), "w") as f:
                json.dump({"args": vars(args), "mode": mode, "windows": starts,
                           "results": results[mode], **extra_json}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
