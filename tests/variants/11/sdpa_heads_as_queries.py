"""Correct, written another way (issue "Graders that charge one deviation once", lab 11): RoPE
in complex numbers (Meta's Llama convention: the interleaved pairs as complex numbers times
``e^{i pos theta_i}``); both paths through ``F.scaled_dot_product_attention``, the absorbed one
as a single-key-head (MQA) attention whose query axis is the heads times the new tokens, as
FlashMLA runs a decode step (``q = [q_rope | W_UK^T q_nope]`` against the cached ``[k_rope |
c_kv]``, values ``c_kv``); the cache keeps its latent rope key first, ``[k_rope | c_kv]``, does
its own checks and writes (``check`` / ``append``), and ``nbytes`` is a plain int attribute.
The config is validated field by field with ``dataclasses.fields``. Every layout the contract
leaves open is another one here: it must lose no point."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

MAY_FAIL = []


@dataclass(frozen=True)
class MLAConfig:
    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float = 10000.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name == "rope_theta":
                ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
                if not ok:
                    raise ValueError(f"rope_theta={v!r}: the RoPE base must be a finite number > 0")
            elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f.name}={v!r}: sizes are ints >= 1")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} is odd: RoPE turns pairs")


def _rotate(t: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """Interleaved RoPE of ``t (B, L, [H,] dr)`` at positions ``start .. start+L-1``, in complex
    numbers: ``(t[2i] + i t[2i+1]) * e^{i pos theta^(-2i/dr)}``; angles in float64."""
    B, L, dr = t.shape[0], t.shape[1], t.shape[-1]
    pos = torch.arange(start, start + L, dtype=torch.float64, device=t.device)
    freqs = theta ** (-torch.arange(0, dr, 2, dtype=torch.float64, device=t.device) / dr)
    ang = torch.outer(pos, freqs)                                           # (L, dr/2)
    rot = torch.polar(torch.ones_like(ang), ang).to(torch.complex64 if t.dtype == torch.float32 else torch.complex128)
    if t.dim() == 4:
        rot = rot[:, None]
    z = torch.view_as_complex(t.reshape(*t.shape[:-1], dr // 2, 2).contiguous())
    return torch.view_as_real(z * rot).flatten(-2)


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, cfg: MLAConfig):
        super().__init__()
        self.cfg = cfg
        H, r = cfg.n_heads, cfg.kv_lora_rank
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        self.wq = nn.Linear(cfg.d_model, H * (dn + dr), bias=False)
        self.wkv_a = nn.Linear(cfg.d_model, r + dr, bias=False)
        self.kv_norm = nn.RMSNorm(r, eps=1e-6)
        self.wkv_b = nn.Linear(r, H * (dn + dv), bias=False)
        self.wo = nn.Linear(H * dv, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cache: "MLACache | None" = None, absorb: bool = False) -> torch.Tensor:
        c = self.cfg
        H, r, dn, dr, dv = c.n_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        if x.dim() != 3 or x.shape[1] < 1 or x.shape[2] != c.d_model:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected (B, L >= 1, d_model={c.d_model})")
        if x.dtype != self.wkv_a.weight.dtype:
            raise TypeError(f"x.dtype={x.dtype} differs from the layer's dtype {self.wkv_a.weight.dtype}")
        start = 0 if cache is None else cache.check(x, c)
        B, L, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)

        q_nope, q_rope = self.wq(x).unflatten(-1, (H, dn + dr)).to(f).split([dn, dr], -1)
        q_rope = _rotate(q_rope, start, c.rope_theta)                            # (B, L, H, dr)
        lat = self.wkv_a(x)
        kr = _rotate(lat[..., r:].to(f), start, c.rope_theta).to(x.dtype)       # (B, L, dr), as stored
        ckv = self.kv_norm(lat[..., :r])                                         # (B, L, r)
        if cache is None:
            kr_all, c_all = kr, ckv
        else:
            kr_all, c_all = cache.append(kr, ckv)
        Lk = c_all.shape[1]
        allowed = None
        if L > 1:   # bottom-right causal: query i sees key j iff j <= i + Lk - L
            allowed = torch.ones(L, Lk, dtype=torch.bool, device=x.device).tril(Lk - L)
        scale = (dn + dr) ** -0.5

        if not absorb:
            k_nope, v = self.wkv_b(c_all).unflatten(-1, (H, dn + dv)).to(f).split([dn, dv], -1)
            q = torch.cat([q_nope, q_rope], -1).transpose(1, 2)                  # (B, H, L, dn+dr)
            k = torch.cat([k_nope, kr_all.to(f)[:, :, None].expand(B, Lk, H, dr)], -1).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v.transpose(1, 2), attn_mask=allowed, scale=scale)
            o = o.transpose(1, 2)                                                # (B, L, H, dv)
        else:
            w = self.wkv_b.weight.to(f).unflatten(0, (H, dn + dv))               # (H, dn+dv, r)
            q_lat = torch.einsum("blhd,hdr->bhlr", q_nope, w[:, :dn])            # (B, H, L, r)
            q = torch.cat([q_rope.transpose(1, 2), q_lat], -1).reshape(B, 1, H * L, dr + r)
            kv = torch.cat([kr_all, c_all], -1).to(f)[:, None]                   # (B, 1, Lk, dr+r)
            mask = None if allowed is None else allowed.repeat(H, 1)             # row h*L + i: query i
            o_lat = F.scaled_dot_product_attention(q, kv, kv[..., dr:], attn_mask=mask, scale=scale)
            o = torch.einsum("bhlr,hvr->blhv", o_lat.view(B, H, L, r), w[:, dn:])
        return self.wo(o.flatten(2).to(x.dtype))


class MLACache:
    def __init__(self, batch_size: int, max_seq_len: int, cfg: MLAConfig, dtype: torch.dtype = torch.float32,
                 device="cpu"):
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (batch_size, max_seq_len)):
            raise ValueError(f"batch_size={batch_size!r}, max_seq_len={max_seq_len!r}: ints >= 1")
        self.cfg, self.batch_size, self.max_seq_len, self.dtype = cfg, batch_size, max_seq_len, dtype
        self.kv = torch.zeros(batch_size, max_seq_len, cfg.qk_rope_head_dim + cfg.kv_lora_rank, dtype=dtype,
                              device=device)   # [k_rope | c_kv] per token
        self.nbytes = self.kv.numel() * self.kv.element_size()
        self.seq_len = 0

    def reset(self) -> None:
        self.seq_len = 0

    def check(self, x: torch.Tensor, cfg: MLAConfig) -> int:
        """Every refusal before any write; the number of stored positions."""
        if cfg != self.cfg:
            raise ValueError("this cache was made for another MLAConfig")
        if x.shape[0] != self.batch_size:
            raise ValueError(f"x batch {x.shape[0]} != batch_size {self.batch_size}")
        if x.dtype != self.dtype:
            raise TypeError(f"x.dtype={x.dtype}, the cache's dtype is {self.dtype}")
        if self.seq_len + x.shape[1] > self.max_seq_len:
            raise ValueError(f"{x.shape[1]} more tokens after {self.seq_len} exceed max_seq_len={self.max_seq_len}")
        return self.seq_len

    def append(self, kr: torch.Tensor, ckv: torch.Tensor):
        S, L, dr = self.seq_len, kr.shape[1], self.cfg.qk_rope_head_dim
        self.kv[:, S:S + L, :dr] = kr
        self.kv[:, S:S + L, dr:] = ckv
        self.seq_len = S + L
        return self.kv[:, :S + L, :dr], self.kv[:, :S + L, dr:]
