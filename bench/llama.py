"""The eval model (kvfix-llama-15m, ../shared/eval/model) in plain PyTorch,
with the two forward passes kl_eval.py needs.

Weights are bf16 safetensors, computed in float32 (as the fixtures were).
Architecture (eval/README.md): Llama, RMSNorm pre-norm eps 1e-5 in fp32,
rotate-half RoPE theta 10000 on the full head_dim, GQA (query head h reads
KV head h // 2), SwiGLU MLP, tied embeddings, causal attention with logits
q.k / sqrt(head_dim).

`forward_full` runs a whole window and returns logits plus every layer's
post-RoPE keys and values ([T][kv_heads][head_dim], what a KV cache holds).
Runs on `device` (a torch device name: "cpu", "cuda"); the weights are
moved there once, inputs on use, outputs stay there.
`forward_continuation` runs only positions [start, start + n) with the keys
and values of positions [0, start) given per layer (the possibly
reconstructed cache), which is how a decoder sees a quantized cache.
"""
import json
import math
import os
import struct

import torch
import torch.nn.functional as F

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def read_safetensors(path):
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
    def __init__(self, model_dir, device="cpu"):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.w = {}
        for shard in sorted(set(index["weight_map"].values())):
            self.w.update(read_safetensors(os.path.join(model_dir, shard)))
        self.device = torch.device(device)
        self.w = {k: v.to(self.device) for k, v in self.w.items()}
        c = self.cfg
        self.layers = c["num_hidden_layers"]
        self.q_heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        self.head_dim = c["head_dim"]
        self.eps = c["rms_norm_eps"]
        self.theta = c["rope_theta"]
        self.embed = self.w["model.embed_tokens.weight"]

    def _norm(self, x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def _rope(self, x, positions):
        """x: [T, heads, hd]; rotate-half convention."""
        hd = self.head_dim
        inv = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.float32, device=x.device) / hd))
        freqs = torch.outer(positions.float(), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def _attend(self, q, k, v, q_positions):
        """q: [Tq, QH, hd] at q_positions; k, v: [Tk, KH, hd] at 0..Tk-1."""
        rep = self.q_heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)  # KV head j serves query heads j*rep..
        v = v.repeat_interleave(rep, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.head_dim)
        key_pos = torch.arange(k.shape[0], device=k.device)
        s = s.masked_fill(key_pos[None, None, :] > q_positions[None, :, None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)

    def _layer(self, i, x, positions, past_k=None, past_v=None):
        p = f"model.layers.{i}."
        w = self.w
        h = self._norm(x, w[p + "input_layernorm.weight"])
        T = x.shape[0]
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, self.q_heads, self.head_dim)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, self.kv_heads, self.head_dim)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, self.kv_heads, self.head_dim)
        q, k = self._rope(q, positions), self._rope(k, positions)
        k_all = k if past_k is None else torch.cat([past_k, k], 0)
        v_all = v if past_v is None else torch.cat([past_v, v], 0)
        o = self._attend(q, k_all, v_all, positions).reshape(T, -1)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = self._norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        return x, k, v

    def _logits(self, x):
        return self._norm(x, self.w["model.norm.weight"]) @ self.embed.T

    @torch.no_grad()
    def forward_full(self, ids):
        """ids: 1-D LongTensor. Returns (logits [T][vocab], [(k, v)] per layer)."""
        ids = ids.to(self.device)
        positions = torch.arange(ids.shape[0], device=self.device)
        x = self.embed[ids]
        kv = []
        for i in range(self.layers):
            x, k, v = self._layer(i, x, positions)
            kv.append((k, v))
        return self._logits(x), kv

    @torch.no_grad()
    def forward_continuation(self, ids, start, past):
        """ids: tokens of positions [start, start + len); past: per layer
        (k, v) of positions [0, start). Returns logits of those positions."""
        ids = ids.to(self.device)
        positions = torch.arange(start, start + ids.shape[0], device=self.device)
        x = self.embed[ids]
        for i in range(self.layers):
            x, _, _ = self._layer(i, x, positions, past[i][0], past[i][1])
        return self._logits(x)
