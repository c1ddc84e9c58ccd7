"""Lab 11 reference: multi-head latent attention (MLA), DeepSeek-V2 sec. 2.1.

DeepSeek-V2 (arXiv:2405.04434) compresses keys and values into one low-rank
latent per token, ``c_kv = kv_norm(x W_DKV)`` of ``kv_lora_rank`` numbers, plus
one small RoPE key ``k_rope`` shared by every head ("decoupled RoPE"). A decode
cache then holds ``kv_lora_rank + qk_rope`` numbers per token instead of
``2 * n_heads * head_dim``. Without the query compression of the paper.

One file, in dependency order:
  MLAConfig                 the layer's sizes, checked                        (Part A)
  _rope                     interleaved RoPE at explicit positions            (Part A)
  MultiHeadLatentAttention  the layer: naive path (Part A), cache (Part B),
                            absorbed path (Part C)
  MLACache                  the preallocated latent cache                     (Part B)

Shapes: B batch, L new tokens this call, S = cache.seq_len positions already
cached, Lk = S + L keys, H heads, r = kv_lora_rank, dn = qk_nope_head_dim,
dr = qk_rope_head_dim, dv = v_head_dim, d = d_model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


# --- Part A: the configuration ----------------------------------------------------------

@dataclass(frozen=True)
class MLAConfig:
    """Sizes of one MLA layer (``qk_nope``, ``qk_rope``, ``v`` below: the head dims).

    Raises ValueError naming the field for a size < 1, an odd ``qk_rope_head_dim``
    (RoPE turns pairs), or ``rope_theta <= 0``. ``d_model`` need not be divisible by
    ``n_heads``: every projection has its own width."""

    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in ("d_model", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MLAConfig: {name} must be an int >= 1, got {value!r}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"MLAConfig: qk_rope_head_dim must be even (RoPE turns pairs), "
                             f"got {self.qk_rope_head_dim}")
        if isinstance(self.rope_theta, bool) or not isinstance(self.rope_theta, (int, float)) \
                or not self.rope_theta > 0 or not math.isfinite(self.rope_theta):
            raise ValueError(f"MLAConfig: rope_theta must be a finite number > 0, got {self.rope_theta!r}")


# --- Part A: decoupled RoPE --------------------------------------------------------------

def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Turn the interleaved pairs ``(x[..., 2i], x[..., 2i+1])`` of ``x (..., dr)`` by the
    angles whose ``cos``/``sin`` (broadcastable to ``(..., dr/2)``) are given."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).flatten(-2)


def _angles(S: int, L: int, dr: int, theta: float, dtype, device):
    """``cos, sin (L, dr/2)`` of ``pos * theta**(-2i/dr)`` for positions ``S .. S+L-1``,
    computed in float64 (a float32 angle is off by ~1e-4 rad at position 1000) and
    rounded to ``dtype``."""
    inv = theta ** (-torch.arange(0, dr, 2, dtype=torch.float64, device=device) / dr)
    ang = torch.arange(S, S + L, dtype=torch.float64, device=device)[:, None] * inv
    return ang.cos().to(dtype), ang.sin().to(dtype)


# --- Parts A, B, C: the layer ------------------------------------------------------------

class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2, without the query compression).

    Submodules (the contract; all without bias):
      wq:      Linear(d, H*(dn+dr))   viewed (B, L, H, dn+dr) = [q_nope | q_rope] per head
      wkv_a:   Linear(d, r+dr)        [c_kv | k_rope]: the latent and the shared rope key
      kv_norm: RMSNorm(r, eps=1e-6)   on c_kv only, before it is cached or expanded
      wkv_b:   Linear(r, H*(dn+dv))   viewed (B, Lk, H, dn+dv) = [k_nope | v] per head;
                                      wkv_b.weight.view(H, dn+dv, r): W_UK rows, then W_UV
      wo:      Linear(H*dv, d)        on the heads' outputs (B, L, H, dv), head-major
    """

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
        """Causal self-attention of ``x (B, L, d_model)``, ``L >= 1`` -> ``(B, L, d_model)`` in x's dtype.

        Queries: ``[q_nope | q_rope] = x wq`` per head; keys: ``[k_nope | v] = c_kv wkv_b``
        per head with ``c_kv = kv_norm(latent part of x wkv_a)``, and the rope part of
        ``x wkv_a``, one ``(dr)`` vector per token shared by all heads. RoPE (interleaved
        pairs, positions ``S .. S+L-1``) turns ``q_rope`` and ``k_rope`` only. Scores
        ``(q_nope . k_nope + q_rope . k_rope) / sqrt(dn + dr)``, causal bottom-right
        (query i sees key j iff ``j <= i + S``). Maths in the wider of float32 and x's dtype.

        ``cache``: an MLACache of this config; the L tokens are written at
        ``[S, S+L)`` and every stored token is attended. ``absorb``: attend against the
        latent directly, W_UK folded into the query and W_UV applied to the attended
        latent (no per-head key or value is ever formed).
        Raises ValueError (x not (B, L>=1, d_model); cache batch, config, overflow of
        max_seq_len: nothing written), TypeError (x's dtype is not the layer's parameters'
        dtype, or not the cache's)."""
        cfg = self.cfg
        H, r = cfg.n_heads, cfg.kv_lora_rank
        dn, dr, dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        if x.dim() != 3 or x.shape[-1] != cfg.d_model or x.shape[1] < 1:
            raise ValueError(f"x must be (B, L >= 1, d_model={cfg.d_model}), got {tuple(x.shape)}")
        if x.dtype != self.wq.weight.dtype:
            raise TypeError(f"x is {x.dtype}, the layer's parameters are {self.wq.weight.dtype}: convert one to "
                            f"the other (layer.to(dtype))")
        B, L, _ = x.shape
        S = 0 if cache is None else cache._admit(x, cfg)  # every check before the first write
        wide = torch.promote_types(x.dtype, torch.float32)

        q = self.wq(x).view(B, L, H, dn + dr).to(wide)
        q_nope, q_rope = q.split([dn, dr], dim=-1)                # (B, L, H, dn), (B, L, H, dr)
        c_kv, k_rope = self.wkv_a(x).split([r, dr], dim=-1)      # (B, L, r), (B, L, dr)
        c_kv = self.kv_norm(c_kv)                                 # the latent, as cached
        cos, sin = _angles(S, L, dr, cfg.rope_theta, wide, x.device)
        q_rope = _rope(q_rope, cos[:, None], sin[:, None])        # (L, 1, dr/2) over the heads
        k_rope = _rope(k_rope.to(wide), cos, sin).to(x.dtype)     # stored in x's dtype, as cached

        if cache is None:
            c_all, kr_all = c_kv, k_rope                          # (B, Lk, r), (B, Lk, dr)
        else:
            c_all, kr_all = cache._append(c_kv, k_rope)           # views of the stored prefix
        Lk = c_all.shape[1]
        scale = 1.0 / math.sqrt(dn + dr)
        i = torch.arange(L, device=x.device)[:, None]
        j = torch.arange(Lk, device=x.device)[None, :]
        hidden = j > i + (Lk - L)                                 # (L, Lk): bottom-right causal

        if absorb:
            w = self.wkv_b.weight.to(wide).view(H, dn + dv, r)   # recomputed each call: never stale
            w_uk, w_uv = w[:, :dn], w[:, dn:]                    # (H, dn, r), (H, dv, r)
            q_lat = torch.einsum("blhd,hdr->bhlr", q_nope, w_uk)  # W_UK folded into the query
            c = c_all.to(wide)                                    # (B, Lk, r): a view for float32 and up
            s = q_lat.reshape(B, H * L, r) @ c.transpose(1, 2)    # (B, H*L, Lk)
            s = s + q_rope.transpose(1, 2).reshape(B, H * L, dr) @ kr_all.to(wide).transpose(1, 2)
            s = (s * scale).view(B, H, L, Lk)
            if L > 1:
                s = s.masked_fill(hidden, float("-inf"))
            p = torch.softmax(s, dim=-1)
            o_lat = p.view(B, H * L, Lk) @ c                      # (B, H*L, r): the attended latent
            o = torch.einsum("bhlr,hvr->blhv", o_lat.view(B, H, L, r), w_uv)  # W_UV after attention
        else:
            kv = self.wkv_b(c_all).view(B, Lk, H, dn + dv).to(wide)
            k_nope, v = kv.split([dn, dv], dim=-1)                # (B, Lk, H, dn), (B, Lk, H, dv)
            s = torch.einsum("blhd,bkhd->bhlk", q_nope, k_nope)
            s = s + torch.einsum("blhd,bkd->bhlk", q_rope, kr_all.to(wide))
            s = (s * scale).masked_fill(hidden, float("-inf"))
            p = torch.softmax(s, dim=-1)
            o = torch.einsum("bhlk,bkhv->blhv", p, v)             # (B, L, H, dv)
        return self.wo(o.reshape(B, L, H * dv).to(x.dtype))


# --- Part B: the latent cache ------------------------------------------------------------

class MLACache:
    """Preallocated decode cache of one MLA layer: per token, ``kv_norm(c_kv)`` (r numbers)
    and the roped shared key (dr numbers), nothing per head.

    ``latent (batch_size, max_seq_len, r + dr)`` is allocated once, ``[c_kv | k_rope]``
    along the last dim; ``nbytes = batch_size * max_seq_len * (r + dr) * itemsize``.
    ``seq_len`` counts the stored positions; ``reset()`` sets it to 0. The layer writes
    through ``_admit`` (all checks, nothing written) and ``_append``."""

    def __init__(self, batch_size: int, max_seq_len: int, cfg: MLAConfig, dtype: torch.dtype = torch.float32,
                 device="cpu"):
        for name, value in (("batch_size", batch_size), ("max_seq_len", max_seq_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MLACache: {name} must be an int >= 1, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise TypeError(f"MLACache: dtype must be a floating torch.dtype, got {dtype!r}")
        self.cfg = cfg
        self.batch_size, self.max_seq_len, self.dtype = batch_size, max_seq_len, dtype
        self.latent = torch.zeros(batch_size, max_seq_len, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                                  dtype=dtype, device=device)
        self.device = self.latent.device
        self.seq_len = 0

    @property
    def nbytes(self) -> int:
        """Bytes of the storage: ``batch_size * max_seq_len * (kv_lora_rank + qk_rope) * itemsize``."""
        return self.latent.numel() * self.latent.element_size()

    def reset(self) -> None:
        """Forget every stored position (the storage stays)."""
        self.seq_len = 0

    def _admit(self, x: torch.Tensor, cfg: MLAConfig) -> int:
        """Check that ``x (B, L, d)`` of a layer with ``cfg`` may be appended; return ``seq_len``."""
        if cfg != self.cfg:
            raise ValueError(f"cache for another config: the cache holds {self.cfg}, the layer is {cfg}")
        if x.shape[0] != self.batch_size:
            raise ValueError(f"x has batch {x.shape[0]}, the cache's batch_size is {self.batch_size}")
        if x.dtype != self.dtype:
            raise TypeError(f"x is {x.dtype}, the cache holds {self.dtype}")
        if x.device != self.device:
            raise ValueError(f"x is on {x.device}, the cache on {self.device}")
        L = x.shape[1]
        if self.seq_len + L > self.max_seq_len:
            raise ValueError(f"cache overflow: {L} new tokens after {self.seq_len} stored exceed "
                             f"max_seq_len={self.max_seq_len}")
        return self.seq_len

    def _append(self, c_kv: torch.Tensor, k_rope: torch.Tensor):
        """Write ``c_kv (B, L, r)``, ``k_rope (B, L, dr)`` at ``[seq_len, seq_len+L)``; return
        views ``(B, seq_len, r)``, ``(B, seq_len, dr)`` of everything stored."""
        S, L, r = self.seq_len, c_kv.shape[1], self.cfg.kv_lora_rank
        self.latent[:, S:S + L, :r] = c_kv
        self.latent[:, S:S + L, r:] = k_rope
        self.seq_len = S + L
        return self.latent[:, :S + L, :r], self.latent[:, :S + L, r:]
