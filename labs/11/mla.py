"""Lab 11: multi-head latent attention (MLA), DeepSeek-V2 sec. 2.1.

You build the attention layer of DeepSeek-V2 (arXiv:2405.04434), without its query
compression: keys and values are expanded from one low-rank latent per token,
``c_kv = kv_norm(x W_DKV)`` (``kv_lora_rank`` numbers), and position enters through
a small RoPE key shared by every head ("decoupled RoPE"). A decode cache then holds
``kv_lora_rank + qk_rope`` numbers per token instead of ``2 * n_heads * head_dim``,
and the "absorbed" decode path attends against the latent directly.

Parts (see README.md):
  A  MLAConfig checks; the naive forward with decoupled RoPE     pytest labs/11 -k naive
  B  MLACache and the cached forward                              pytest labs/11 -k cache
  C  the absorbed path (forward(..., absorb=True))                pytest labs/11 -k absorb
Run everything with `pytest labs/11`; self-grade with `labs grade . --lab 11`.

Shapes: B batch, L new tokens this call, S = cache.seq_len positions already cached,
Lk = S + L keys, H heads, r = kv_lora_rank, dn = qk_nope_head_dim, dr = qk_rope_head_dim,
dv = v_head_dim, d = d_model. Write any private helpers you like (RoPE, masks).
"""
from __future__ import annotations

import math  # noqa: F401  (you will want it)
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: F401


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
        raise NotImplementedError("Part A: raise ValueError naming the field for any size < 1, an odd "
                                  "qk_rope_head_dim, or rope_theta <= 0 (otherwise do nothing)")


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
        ``x wkv_a``, one ``(dr)`` vector per token shared by all heads. RoPE turns the
        interleaved pairs ``(t[2i], t[2i+1])`` of ``q_rope`` and ``k_rope`` only, by
        ``pos * rope_theta**(-2i/dr)``, positions ``S .. S+L-1`` (0-based; S = 0 without a
        cache). Scores ``(q_nope . k_nope + q_rope . k_rope) / sqrt(dn + dr)``, causal
        bottom-right (query i sees key j iff ``j <= i + S``). Maths in the wider of
        float32 and x's dtype (float32, float64, bfloat16).

        ``cache``: an MLACache of this config; the L tokens (``kv_norm(c_kv)`` and the
        roped ``k_rope``) are written at ``[S, S+L)``, seq_len advances by L, and every
        stored token is attended. ``absorb``: attend against the latent directly, W_UK
        folded into the query and W_UV applied to the attended latent; during a decode
        step (L = 1, a cache) no tensor of ``>= B * H * Lk * min(dn, dv)`` elements.
        Outputs follow the current parameters (a folded weight never goes stale).
        Raises ValueError (x not (B, L >= 1, d_model); a cache of another batch_size or
        config; an append past max_seq_len, naming it, with nothing written),
        TypeError (x's dtype is not the layer's parameters' dtype, e.g. a float64 x into a
        float32 layer, or not the cache's), naming x's dtype."""
        raise NotImplementedError("Part A: the naive path (expand k_nope and v from the latent, decoupled "
                                  "RoPE, bottom-right causal softmax); Part B: read and write the cache; "
                                  "Part C: absorb=True")


# --- Part B: the latent cache ------------------------------------------------------------

class MLACache:
    """Preallocated decode cache of one MLA layer: per token, ``kv_norm(c_kv)`` (r numbers)
    and the roped shared key (dr numbers), nothing per head.

    Allocate its storage once, here: from construction on, the tensors it holds take
    exactly ``nbytes = batch_size * max_seq_len * (kv_lora_rank + qk_rope) * itemsize``
    bytes. ``seq_len`` (int) counts the stored positions, 0 at first. The layer's
    forward writes into it (how you split the work between the two classes is yours).
    Raises ValueError for a size < 1."""

    def __init__(self, batch_size: int, max_seq_len: int, cfg: MLAConfig, dtype: torch.dtype = torch.float32,
                 device="cpu"):
        raise NotImplementedError("Part B: keep cfg, sizes and dtype; preallocate the latent and rope-key "
                                  "storage (batch_size, max_seq_len, ...) once; seq_len = 0")

    @property
    def nbytes(self) -> int:
        """Bytes of the storage: ``batch_size * max_seq_len * (kv_lora_rank + qk_rope) * itemsize`` (an int)."""
        raise NotImplementedError("Part B: return the storage's size in bytes")

    def reset(self) -> None:
        """Forget every stored position: seq_len = 0 (the storage stays)."""
        raise NotImplementedError("Part B: set seq_len to 0")
