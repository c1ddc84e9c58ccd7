"""Lab 03 written another way, correct (issue "Graders that charge one deviation once", item V):
``torch.einsum`` on q viewed as (B, Hkv, G, Lq, D) against the shared K/V (einsum folds the
group into the rows of one bmm per KV head: K/V are never repeated), the causal mask as a
boolean ``tril`` with diagonal Lk - Lq, ``torch.softmax`` with the NaN of a row that sees no
key turned into zeros, and a module written with ``einops.rearrange`` (a public library's
head-splitting convention). It must score the reference's marks."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from einops import rearrange


def grouped_query_attention(q, k, v, is_causal=False, scale=None):
    for name, t in {"q": q, "k": k, "v": v}.items():
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor, got {getattr(t, 'dtype', type(t).__name__)}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be (B, H, L, D), got shape {tuple(t.shape)}")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise TypeError(f"q, k, v must share one dtype: q {q.dtype}, k {k.dtype}, v {v.dtype}")
    B, Hq, Lq, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"k {tuple(k.shape)} / v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    if Lk < 1:
        raise ValueError(f"Lk={Lk}: need at least one key")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)
    qg = q.to(acc).view(B, Hkv, Hq // Hkv, Lq, D)                     # query head h = kv * G + g
    s = torch.einsum("bkgqd,bkld->bkgql", qg, k.to(acc)) * scale       # (B, Hkv, G, Lq, Lk)
    if is_causal:
        allowed = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(Lk - Lq)
        s = s.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                       # a row with no key: zeros
    out = torch.einsum("bkgql,bkld->bkgqd", p, v.to(acc))
    return out.reshape(B, Hq, Lq, D).to(q.dtype)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads, bias=False):
        super().__init__()
        if min(n_heads, n_kv_heads) < 1 or n_heads % n_kv_heads or d_model % n_heads:
            raise ValueError(f"invalid d_model={d_model}, n_heads={n_heads}, n_kv_heads={n_kv_heads}")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        hd = d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(n_heads * hd, d_model, bias=bias)

    def forward(self, x, is_causal=False):
        q = rearrange(self.q_proj(x), "b l (h d) -> b h l d", h=self.n_heads)
        k = rearrange(self.k_proj(x), "b l (h d) -> b h l d", h=self.n_kv_heads)
        v = rearrange(self.v_proj(x), "b l (h d) -> b h l d", h=self.n_kv_heads)
        y = grouped_query_attention(q, k, v, is_causal=is_causal)
        return self.o_proj(rearrange(y, "b h l d -> b l (h d)"))


# graded as a variant (tests/variants/README.md)
MAY_FAIL = []
