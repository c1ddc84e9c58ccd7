"""Lab 03: grouped-query attention (bob)."""
# My own GQA: every query group scored against its shared K/V head in one matmul.
from __future__ import annotations

import math

import torch
import torch.nn as nn


def _validate(q, k, v):
    for nm, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{nm} must be a floating tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4:
            raise ValueError(f"{nm} must be 4-D, got shape {tuple(t.shape)}")
    if q.dtype != k.dtype or k.dtype != v.dtype:
        raise TypeError(f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    if k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k.shape[1]}")
    if k.shape[2] < 1:
        raise ValueError(f"Lk={k.shape[2]} must be at least 1")


def grouped_query_attention(q, k, v, is_causal=False, scale=None):
    _validate(q, k, v)
    bsz, n_q, len_q, d = q.shape
    n_kv, len_k = k.shape[1], k.shape[2]
    g = n_q // n_kv
    acc_t = torch.float64 if q.dtype == torch.float64 else torch.float32
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    qq = q.to(acc_t).reshape(bsz, n_kv, g * len_q, d)
    att = torch.matmul(qq, k.to(acc_t).transpose(2, 3)) * scale
    att = att.reshape(bsz, n_kv, g, len_q, len_k)
    if is_causal:
        ii = torch.arange(len_q, device=q.device).unsqueeze(1)
        jj = torch.arange(len_k, device=q.device).unsqueeze(0)
        att = att.masked_fill(jj > ii + len_k - len_q, -math.inf)
    mx = att.max(dim=-1, keepdim=True).values
    mx = mx.masked_fill(mx == -math.inf, 0.0)
    probs = (att - mx).exp()
    den = probs.sum(dim=-1, keepdim=True)
    probs = probs / den.masked_fill(den == 0, 1.0)
    res = torch.matmul(probs.reshape(bsz, n_kv, g * len_q, len_k), v.to(acc_t))
    return res.reshape(bsz, n_q, len_q, d).to(q.dtype)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if n_heads < 1 or n_kv_heads < 1:
            raise ValueError(f"n_heads={n_heads} and n_kv_heads={n_kv_heads} must be positive")
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not a multiple of n_kv_heads={n_kv_heads}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x, is_causal=False):
        bsz, seq, _ = x.shape
        heads = lambda t, h: t.view(bsz, seq, h, self.head_dim).transpose(1, 2)
        q = heads(self.q_proj(x), self.n_heads)
        k = heads(self.k_proj(x), self.n_kv_heads)
        v = heads(self.v_proj(x), self.n_kv_heads)
        y = grouped_query_attention(q, k, v, is_causal=is_causal)
        return self.o_proj(y.transpose(1, 2).reshape(bsz, seq, -1))
