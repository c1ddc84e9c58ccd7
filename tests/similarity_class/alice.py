"""Lab 03: grouped-query attention (alice)."""
from __future__ import annotations

import math

import torch
import torch.nn as nn


def _check(q, k, v):
    for label, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{label} must be a floating tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4:
            raise ValueError(f"{label} must be 4-D, got shape {tuple(t.shape)}")
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
    _check(q, k, v)
    batch, hq, lq, dim = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    groups = hq // hkv
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    if scale is None:
        scale = 1.0 / math.sqrt(dim)
    rows = q.to(work).reshape(batch, hkv, groups * lq, dim)
    scores = torch.matmul(rows, k.to(work).transpose(2, 3)) * scale
    scores = scores.reshape(batch, hkv, groups, lq, lk)
    if is_causal:
        qi = torch.arange(lq, device=q.device).unsqueeze(1)
        kj = torch.arange(lk, device=q.device).unsqueeze(0)
        scores = scores.masked_fill(kj > qi + lk - lq, -math.inf)
    top = scores.max(dim=-1, keepdim=True).values
    top = top.masked_fill(top == -math.inf, 0.0)
    weights = (scores - top).exp()
    total = weights.sum(dim=-1, keepdim=True)
    weights = weights / total.masked_fill(total == 0, 1.0)
    out = torch.matmul(weights.reshape(batch, hkv, groups * lq, lk), v.to(work))
    return out.reshape(batch, hq, lq, dim).to(q.dtype)


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
        batch, length, _ = x.shape
        split = lambda t, h: t.view(batch, length, h, self.head_dim).transpose(1, 2)
        q = split(self.q_proj(x), self.n_heads)
        k = split(self.k_proj(x), self.n_kv_heads)
        v = split(self.v_proj(x), self.n_kv_heads)
        y = grouped_query_attention(q, k, v, is_causal=is_causal)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))
