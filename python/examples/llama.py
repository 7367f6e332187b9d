"""The eval model (kvfix-llama-15m, $DRIFTKV_EVAL_DIR/model) in plain
PyTorch: the one forward pass of the demo (generate.py) and of the bench/
KL scripts (kl_eval.py, wush_kl.py, wush_capture.py).

Architecture (the eval folder's README.md): Llama, RMSNorm pre-norm (eps
1e-5, fp32), rotate-half RoPE theta 10000 on the full head_dim, GQA (query
head h reads KV head h // (q_heads / kv_heads)), SwiGLU MLP, tied
embeddings, causal attention with logits q.k / sqrt(head_dim). Weights are
bf16 safetensors computed in float32, as the fixtures were. Runs on
`device` (a torch device name: "cpu", "cuda"); the weights are moved there
once, inputs on use, outputs stay there. On the CPU every product goes
through torch's BLAS: Debian's libblas.so.3 alternative, which must be
OpenBLAS (libopenblas0-pthread, tools/install_deps.sh), not the reference
BLAS (README.md, "Two commands").

Keys and values are post-RoPE ([.., T, kv_heads, head_dim], what a KV
cache holds). Batched, for the demo's prefill and decode workers:
  prefill(ids [B, T]) -> last position's logits, every layer's (k, v);
  decode_step(tokens [B], position, attend) -> next-token logits, where
  `attend` appends each layer's new key and value to its cache and returns
  the attention output (an Attend RPC to driftkv, or LocalCache below).
One sequence, for the KL evaluation:
  forward_full(ids [T]) -> logits [T, vocab], every layer's (k, v);
  forward_continuation(ids, start, past) -> logits of positions
  [start, start + len(ids)) attending to `past` (possibly reconstructed
  keys and values of [0, start)), which is how a decoder sees a quantized
  cache;
  window_qkv(ids [T]) -> every layer's (q, k, v), for calibration.
"""
import json
import math
import os
import struct
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}

# attend(layer, q [B, q_heads, D], k [B, kv_heads, D], v [B, kv_heads, D],
#        position) -> attention output [B, q_heads, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
KV = List[Tuple[torch.Tensor, torch.Tensor]]


def read_safetensors(path: str) -> dict:
    """8-byte LE header length N, N bytes of JSON, then raw LE data."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        a, b = spec["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=_DTYPES[spec["dtype"]])
        out[name] = t.reshape(spec["shape"]).float()
    return out


class Llama:
    def __init__(self, model_dir: str, device: str = "cpu"):
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        w = {}
        for shard in sorted(set(index["weight_map"].values())):
            w.update(read_safetensors(os.path.join(model_dir, shard)))
        self.device = torch.device(device)
        self.w = {k: v.to(self.device) for k, v in w.items()}
        self.layers = c["num_hidden_layers"]
        self.q_heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c["head_dim"]
        self.context = c.get("max_position_embeddings", 1024)
        self.vocab = c["vocab_size"]
        self.eps = c["rms_norm_eps"]
        self.embed = self.w["model.embed_tokens.weight"]
        hd = self.head_dim
        inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        freqs = torch.outer(torch.arange(self.context, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos, self.sin = emb.cos().to(self.device), emb.sin().to(self.device)

    def _linear(self, x, name):
        """x [..., in] @ W.T for the weight `name` [out, in]."""
        return x @ self.w[name].T

    def _norm(self, x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x, positions):
        """x: [B, T, heads, D] at positions [T] (rotate-half)."""
        cos, sin = self.cos[positions][None, :, None, :], self.sin[positions][None, :, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _qkv(self, i, x, positions):
        p = f"model.layers.{i}.self_attn."
        B, T, _ = x.shape
        h = self._norm(x, self.w[f"model.layers.{i}.input_layernorm.weight"])
        q = self._linear(h, p + "q_proj.weight").view(B, T, self.q_heads, self.head_dim)
        k = self._linear(h, p + "k_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        v = self._linear(h, p + "v_proj.weight").view(B, T, self.kv_heads, self.head_dim)
        return self._rope(q, positions), self._rope(k, positions), v

    def _finish(self, i, x, o):
        """x + o_proj(attention output o [B, T, q_heads * D]), then the MLP."""
        p = f"model.layers.{i}."
        x = x + self._linear(o, p + "self_attn.o_proj.weight")
        h = self._norm(x, self.w[p + "post_attention_layernorm.weight"])
        gate = self._linear(h, p + "mlp.gate_proj.weight")
        up = self._linear(h, p + "mlp.up_proj.weight")
        return x + self._linear(F.silu(gate) * up, p + "mlp.down_proj.weight")

    def logits(self, x):
        return self._linear(self._norm(x, self.w["model.norm.weight"]), "model.embed_tokens.weight")

    def _attention(self, q, k, v, q_positions):
        """Exact causal attention: q [B, Tq, q_heads, D] at q_positions [Tq];
        k, v [B, Tk, kv_heads, D] at positions 0..Tk-1 -> [B, Tq, q_heads, D].
        One 2-D product per sequence and query head (query head h reads KV
        head h // rep): 7x faster on the CPU than one broadcast 5-D product."""
        B, Tq, _, D = q.shape
        rep = self.q_heads // self.kv_heads
        mask = torch.arange(k.shape[1], device=k.device)[None, :] > q_positions[:, None]  # [Tq, Tk]
        o = torch.empty_like(q)
        for b in range(B):
            for h in range(self.q_heads):
                s = (q[b, :, h] @ k[b, :, h // rep].T) / math.sqrt(D)
                o[b, :, h] = s.masked_fill(mask, float("-inf")).softmax(-1) @ v[b, :, h // rep]
        return o

    def _forward(self, ids: torch.Tensor, start: int = 0, past: Optional[KV] = None):
        """ids [B, T] at positions [start, start + T), attending to `past`
        (per layer (k, v) [B, start, kv_heads, D]) and to themselves.
        Returns the last hidden states [B, T, hidden] and per layer the
        new tokens' (q, k, v)."""
        ids = ids.to(self.device)
        B, T = ids.shape
        positions = torch.arange(start, start + T, device=self.device)
        x = self.embed[ids]
        qkv = []
        for i in range(self.layers):
            q, k, v = self._qkv(i, x, positions)
            k_all = k if past is None else torch.cat([past[i][0].to(k.dtype), k], 1)
            v_all = v if past is None else torch.cat([past[i][1].to(v.dtype), v], 1)
            o = self._attention(q, k_all, v_all, positions)
            x = self._finish(i, x, o.reshape(B, T, -1))
            qkv.append((q, k, v))
        return x, qkv

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> Tuple[torch.Tensor, KV]:
        """ids [B, T] (T <= context). Returns the last position's logits
        [B, vocab] and per layer (k, v) [B, T, kv_heads, D]."""
        x, qkv = self._forward(ids)
        return self.logits(x[:, -1]), [(k, v) for _, k, v in qkv]

    @torch.no_grad()
    def decode_step(self, tokens: torch.Tensor, position: int, attend: Attend) -> torch.Tensor:
        """One new token per sequence (tokens [B]) at `position`; returns the
        next-token logits [B, vocab]."""
        tokens = tokens.to(self.device)
        B = tokens.shape[0]
        positions = torch.tensor([position], device=self.device)
        x = self.embed[tokens][:, None, :]
        for i in range(self.layers):
            q, k, v = self._qkv(i, x, positions)
            o = attend(i, q[:, 0], k[:, 0], v[:, 0], position)
            x = self._finish(i, x, o.reshape(B, 1, -1).to(x.dtype))
        return self.logits(x[:, 0])

    @torch.no_grad()
    def forward_full(self, ids: torch.Tensor) -> Tuple[torch.Tensor, KV]:
        """ids [T]. Returns logits [T, vocab] and per layer (k, v) [T, kv_heads, D]."""
        x, qkv = self._forward(ids[None])
        return self.logits(x[0]), [(k[0], v[0]) for _, k, v in qkv]

    @torch.no_grad()
    def forward_continuation(self, ids: torch.Tensor, start: int, past: KV) -> torch.Tensor:
        """ids: tokens of positions [start, start + len); past: per layer
        (k, v) [start, kv_heads, D] of positions [0, start). Returns the
        logits of those positions [len, vocab]."""
        x, _ = self._forward(ids[None], start, [(k[None], v[None]) for k, v in past])
        return self.logits(x[0])

    @torch.no_grad()
    def window_qkv(self, ids: torch.Tensor) -> List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """ids [T]. Per layer the post-RoPE queries [T, q_heads, D], keys and
        values [T, kv_heads, D]."""
        _, qkv = self._forward(ids[None])
        return [(q[0], k[0], v[0]) for q, k, v in qkv]


class LocalCache:
    """The reference decode worker's attention: exact, over a float32 cache
    it holds itself (the prefill's keys and values, then each step's)."""

    def __init__(self, model: Llama, kv: KV, capacity: int):
        B, T = kv[0][0].shape[:2]
        self.model = model
        # [B, kv_heads, capacity, D]: a head's tokens are contiguous.
        self.k = [torch.zeros(B, model.kv_heads, capacity, model.head_dim, device=model.device) for _ in kv]
        self.v = [torch.zeros_like(x) for x in self.k]
        for i, (k, v) in enumerate(kv):
            self.k[i][:, :, :T], self.v[i][:, :, :T] = k.transpose(1, 2), v.transpose(1, 2)

    def __call__(self, layer, q, k, v, position):
        self.k[layer][:, :, position], self.v[layer][:, :, position] = k, v
        B, kvh, d = q.shape[0], self.model.kv_heads, self.model.head_dim
        qg = q.reshape(B, kvh, -1, d)  # query head h reads KV head h // rep
        s = qg @ self.k[layer][:, :, :position + 1].transpose(-1, -2) / math.sqrt(d)  # [B, kvh, rep, T]
        return (s.softmax(-1) @ self.v[layer][:, :, :position + 1]).reshape(B, -1, d)
