"""Lab 03 (carol): one KV head at a time, einsum over the group's query heads."""
from __future__ import annotations

import math

import torch
from torch import nn


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    tensors = {"q": q, "k": k, "v": v}
    for name in tensors:
        t = tensors[name]
        if not torch.is_tensor(t):
            raise TypeError(f"{name} is {type(t).__name__}, not a tensor")
        if not torch.is_floating_point(t):
            raise TypeError(f"{name} has dtype {t.dtype}; a floating dtype is needed")
        if t.ndim != 4:
            raise ValueError(f"{name}.ndim is {t.ndim}; expected 4 (B, H, L, D)")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise TypeError(f"mixed dtypes {q.dtype}/{k.dtype}/{v.dtype}")
    B, Hq, Lq, D = q.shape
    if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[-1] != D:
        raise ValueError(f"k {list(k.shape)} / v {list(v.shape)} do not fit q {list(q.shape)}")
    Hkv, Lk = k.shape[1], k.shape[2]
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"{Hq} query heads cannot be grouped over {Hkv} kv heads")
    if Lk == 0:
        raise ValueError("Lk == 0: there is no key to attend to")
    G = Hq // Hkv
    s = scale if scale is not None else D ** -0.5
    compute = torch.promote_types(q.dtype, torch.float32)
    visible = None
    if is_causal:
        offset = Lk - Lq
        visible = torch.ones(Lq, Lk, dtype=torch.bool, device=q.device).tril(diagonal=offset)
    outs = []
    for h in range(Hkv):
        kh = k[:, h].to(compute)                                    # (B, Lk, D)
        vh = v[:, h].to(compute)
        qg = q[:, h * G:(h + 1) * G].to(compute)                    # (B, G, Lq, D)
        logits = torch.einsum("bgqd,bkd->bgqk", qg, kh) * s
        if visible is not None:
            logits = torch.where(visible, logits, torch.full_like(logits, float("-inf")))
        peak = torch.nan_to_num(logits.amax(-1, keepdim=True), neginf=0.0)
        e = torch.exp(logits - peak)
        z = e.sum(-1, keepdim=True)
        z = torch.where(z > 0, z, torch.ones_like(z))
        outs.append(torch.einsum("bgqk,bkd->bgqd", e / z, vh))
    return torch.cat(outs, dim=1).to(q.dtype)


class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool = False):
        super().__init__()
        bad = (n_heads <= 0 or n_kv_heads <= 0, n_heads % max(n_kv_heads, 1), d_model % max(n_heads, 1))
        if bad[0]:
            raise ValueError(f"need positive head counts (n_heads={n_heads}, n_kv_heads={n_kv_heads})")
        if bad[1]:
            raise ValueError(f"n_kv_heads={n_kv_heads} does not divide n_heads={n_heads}")
        if bad[2]:
            raise ValueError(f"n_heads={n_heads} does not divide d_model={d_model}")
        hd = d_model // n_heads
        self.hd, self.nh, self.nkv = hd, n_heads, n_kv_heads
        self.q_proj = nn.Linear(d_model, n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(n_heads * hd, d_model, bias=bias)

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        B, L, _ = x.shape
        parts = []
        for proj, heads in ((self.q_proj, self.nh), (self.k_proj, self.nkv), (self.v_proj, self.nkv)):
            parts.append(proj(x).reshape(B, L, heads, self.hd).permute(0, 2, 1, 3))
        attended = grouped_query_attention(*parts, is_causal=is_causal)
        merged = attended.permute(0, 2, 1, 3).reshape(B, L, self.nh * self.hd)
        return self.o_proj(merged)
