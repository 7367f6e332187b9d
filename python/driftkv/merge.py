"""merge_attention: THE log-sum-exp merge of codec/lse_merge.h for callers.

Two partial attentions of the same queries over disjoint token sets, each
normalised (output o_k, lse_k = ln sum_t exp(scale q.k_t)), merge into the
attention over the union:
    M = max(lse_1, lse_2),  w_k = exp(lse_k - M)  (0 for an empty part, lse -inf),
    o = (w_1 o_1 + w_2 o_2) / (w_1 + w_2),  lse = M + ln(w_1 + w_2);
both parts empty: o = 0, lse = -inf. So a decode worker can attend driftkv's
stored tokens and tokens it holds itself, and merge the two.
"""
from typing import Tuple

import numpy as np

from driftkv import _tensors as T


def merge_attention(o1, lse1, o2, lse2) -> Tuple[object, object]:
    """o: [..., q_heads, head_dim], lse: [..., q_heads] (numpy arrays or torch
    tensors, not mixed). Returns (o, lse) of the same kind, in float32
    (numpy) or the inputs' dtype (torch)."""
    if T.is_torch(o1):
        import torch
        m = torch.maximum(lse1, lse2)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        ninf = float("-inf")
        w1 = torch.where(lse1 == ninf, torch.zeros_like(lse1), torch.exp(lse1 - m_safe))
        w2 = torch.where(lse2 == ninf, torch.zeros_like(lse2), torch.exp(lse2 - m_safe))
        total = w1 + w2
        safe = torch.where(total > 0, total, torch.ones_like(total))
        o = (w1[..., None] * o1 + w2[..., None] * o2) / safe[..., None]
        lse = torch.where(total > 0, m_safe + torch.log(safe), torch.full_like(total, ninf))
        return o, lse
    o1, o2 = np.asarray(o1, dtype=np.float32), np.asarray(o2, dtype=np.float32)
    lse1, lse2 = np.asarray(lse1, dtype=np.float32), np.asarray(lse2, dtype=np.float32)
    m = np.maximum(lse1, lse2)
    m_safe = np.where(np.isfinite(m), m, np.float32(0))
    with np.errstate(invalid="ignore", over="ignore"):
        w1 = np.where(lse1 == -np.inf, np.float32(0), np.exp(lse1 - m_safe))
        w2 = np.where(lse2 == -np.inf, np.float32(0), np.exp(lse2 - m_safe))
    total = w1 + w2
    safe = np.where(total > 0, total, np.float32(1))
    o = (w1[..., None] * o1 + w2[..., None] * o2) / safe[..., None]
    lse = np.where(total > 0, m_safe + np.log(safe), np.float32(-np.inf))
    return o.astype(np.float32), lse.astype(np.float32)
