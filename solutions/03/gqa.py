"""Grouped-query attention (GQA): the reference solution of lab 03.

Hq query heads share Hkv key/value heads in groups of G = Hq // Hkv adjacent
query heads (Ainslie et al., 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints"). Hkv = 1 is multi-query
attention (Shazeer, 2019), Hkv = Hq is ordinary multi-head attention.

The trick that saves memory: never repeat K/V to Hq heads. Query head
h = kv * G + g, so viewing q as (B, Hkv, G * Lq, D) puts the G query heads of
one KV head next to each other as extra *rows*; one batched matmul per KV
head then scores all of them against the single, shared K.

Part A: grouped_query_attention   Part B: GroupedQueryAttention module
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


# --- Part A: grouped_query_attention ---

def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v with KV heads shared by query groups.

    q: (B, Hq, Lq, D); k, v: (B, Hkv, Lk, D), same dtype; Hq % Hkv == 0.
    Query head h uses KV head h // (Hq // Hkv) (the repeat_interleave order).
    is_causal: bottom-right aligned, query i sees key j iff j <= i + (Lk - Lq);
    a query with no visible key outputs zeros. scale=None means 1/sqrt(D).
    Returns (B, Hq, Lq, D) in q's dtype, computed in float32 (float64 inputs in float64).
    Raises ValueError (ranks, shapes, Hq % Hkv != 0, Lk < 1) or TypeError (dtypes).
    Never materialises K/V repeated to Hq heads; does not call SDPA.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, L, D), got shape {tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    B, Hq, Lq, D = q.shape
    _, Hkv, Lk, _ = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} in batch or head_dim")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"Hq={Hq} must be a multiple of Hkv={Hkv}")
    if Lk < 1:
        raise ValueError(f"Lk must be >= 1, got Lk={Lk}")
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale

    acc = torch.promote_types(q.dtype, torch.float32)             # fp16/bf16 -> fp32; fp64 stays
    # query head h = kv * G + g: group the G heads of a KV head as extra rows
    qf = q.to(acc).reshape(B, Hkv, G * Lq, D)                     # (B, Hkv, G*Lq, D)
    kf, vf = k.to(acc), v.to(acc)                                 # (B, Hkv, Lk, D), no repeat
    s = (qf @ kf.transpose(-1, -2)) * scale                       # (B, Hkv, G*Lq, Lk)
    s = s.view(B, Hkv, G, Lq, Lk)
    if is_causal:
        i = torch.arange(Lq, device=q.device)[:, None]
        j = torch.arange(Lk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (Lk - Lq), float("-inf"))       # bottom-right aligned
    # stable softmax; a fully masked row shifts by 0 so exp(-inf) = 0 and its sum is 0
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    l = p.sum(dim=-1, keepdim=True)
    p = p / torch.where(l == 0, torch.ones_like(l), l)
    out = p.view(B, Hkv, G * Lq, Lk) @ vf                         # (B, Hkv, G*Lq, D)
    return out.view(B, Hq, Lq, D).to(q.dtype)


# --- Part B: GroupedQueryAttention module ---

class GroupedQueryAttention(nn.Module):
    """Self-attention block with n_heads query heads and n_kv_heads K/V heads.

    head_dim = d_model // n_heads; q_proj: d_model -> n_heads*head_dim,
    k_proj, v_proj: d_model -> n_kv_heads*head_dim, o_proj: n_heads*head_dim -> d_model,
    all with ``bias``. Head h is columns [h*head_dim, (h+1)*head_dim) of its projection.
    Raises ValueError for non-positive head counts, n_heads % n_kv_heads != 0
    or d_model % n_heads != 0.
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool = False):
        super().__init__()
        if n_heads < 1 or n_kv_heads < 1:
            raise ValueError(f"head counts must be >= 1, got n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=bias)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model)."""
        B, L, _ = x.shape
        hd = self.head_dim
        q = self.q_proj(x).view(B, L, self.n_heads, hd).transpose(1, 2)     # (B, Hq, L, hd)
        k = self.k_proj(x).view(B, L, self.n_kv_heads, hd).transpose(1, 2)  # (B, Hkv, L, hd)
        v = self.v_proj(x).view(B, L, self.n_kv_heads, hd).transpose(1, 2)  # (B, Hkv, L, hd)
        y = grouped_query_attention(q, k, v, is_causal=is_causal)           # (B, Hq, L, hd)
        y = y.transpose(1, 2).reshape(B, L, self.n_heads * hd)              # (B, L, Hq*hd)
        return self.o_proj(y)
