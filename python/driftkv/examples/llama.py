"""The eval model (kvfix-llama-15m, ../shared/eval/model) as a prefill
worker and a decode worker, in plain PyTorch (Debian's python3-torch on the
CPU; CUDA where present).

Architecture (shared/eval/README.md): Llama, RMSNorm pre-norm (eps 1e-5,
fp32), rotate-half RoPE theta 10000 on the full head_dim, GQA (query head h
reads KV head h // (q_heads / kv_heads)), SwiGLU MLP, tied embeddings,
logits q.k / sqrt(head_dim). Weights are bf16 safetensors computed in
float32, as the fixtures were (bench/llama.py is the same forward pass,
one sequence at a time, for kl_eval.py).

prefill(ids) runs whole prompts [B, T] with exact causal attention and
returns the logits and every layer's post-RoPE keys and values
([B, T, kv_heads, head_dim]: what a KV cache holds). decode_step(tokens,
position, attend) runs one new token per sequence; in every layer it hands
the token's query, key and value to `attend`, which appends the key and
value to its cache and returns the attention output over the cache; a
decode worker's attend is an Attend RPC to driftkv (new_key, new_value,
new_token_index), the reference's is LocalCache below.
"""
import json
import math
import os
import struct
from typing import Callable, List, Tuple

import torch
import torch.nn.functional as F

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}

# attend(layer, q [B, q_heads, D], k [B, kv_heads, D], v [B, kv_heads, D],
#        position) -> attention output [B, q_heads, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


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
        # On the CPU, products go through oneDNN when torch has it: Debian's
        # torch calls the reference BLAS otherwise, 20-30x slower.
        self._mk = {}
        if self.device.type == "cpu" and _onednn_works():
            self._mk = {k: v.to_mkldnn() for k, v in self.w.items() if v.dim() == 2}

    def _linear(self, x, name):
        """x [..., in] @ W.T for the weight `name` [out, in]."""
        if name in self._mk:
            return _onednn_mm(x, self._mk[name])
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

    def _causal_attention(self, q, k, v):
        """Exact causal attention of a prompt: q [B, T, q_heads, D], k, v
        [B, T, kv_heads, D] -> [B, T, q_heads, D]."""
        B, T = q.shape[:2]
        rep = self.q_heads // self.kv_heads
        mask = torch.ones(T, T, dtype=torch.bool, device=self.device).triu(1)
        o = torch.empty_like(q)
        for b in range(B):
            for h in range(self.q_heads):
                kh, vh = k[b, :, h // rep], v[b, :, h // rep]
                if self._mk:
                    s = _onednn_mm(q[b, :, h], kh.contiguous().to_mkldnn())
                else:
                    s = q[b, :, h] @ kh.T
                p = (s / math.sqrt(self.head_dim)).masked_fill(mask, float("-inf")).softmax(-1)
                o[b, :, h] = _onednn_mm(p, vh.T.contiguous().to_mkldnn()) if self._mk else p @ vh
        return o

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> Tuple[torch.Tensor, List[Tuple[torch.Tensor, torch.Tensor]]]:
        """ids [B, T] (T <= context). Returns the last position's logits
        [B, vocab] and per layer (k, v) [B, T, kv_heads, D], post-RoPE."""
        ids = ids.to(self.device)
        B, T = ids.shape
        positions = torch.arange(T, device=self.device)
        x = self.embed[ids]
        kv = []
        for i in range(self.layers):
            q, k, v = self._qkv(i, x, positions)
            o = self._causal_attention(q, k, v)
            x = self._finish(i, x, o.reshape(B, T, -1))
            kv.append((k, v))
        return self.logits(x[:, -1]), kv

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


def _onednn_works() -> bool:
    try:
        x = torch.ones(2, 3)
        return bool((_onednn_mm(x, torch.ones(4, 3).to_mkldnn()) == 3).all())
    except (RuntimeError, AttributeError):
        return False


def _onednn_mm(x: torch.Tensor, w_mkldnn) -> torch.Tensor:
    """x [..., in] @ W.T with W [out, in] an oneDNN tensor."""
    lead = x.shape[:-1]
    y = torch._C._nn.mkldnn_linear(x.reshape(-1, x.shape[-1]).contiguous().to_mkldnn(), w_mkldnn, None)
    return y.to_dense().reshape(*lead, -1)


class LocalCache:
    """The reference decode worker's attention: exact, over a float32 cache
    it holds itself (the prefill's keys and values, then each step's)."""

    def __init__(self, model: Llama, kv: List[Tuple[torch.Tensor, torch.Tensor]], capacity: int):
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
