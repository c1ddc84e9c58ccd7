"""Lab 03: grouped-query attention (GQA).

You build attention in which Hq query heads share Hkv key/value heads: query
head h reads KV head h // (Hq // Hkv), so G = Hq // Hkv *adjacent* query heads
form a group (Ainslie et al., 2023, "GQA"; Hkv = 1 is multi-query attention,
Shazeer 2019; Hkv = Hq is plain multi-head attention). The point of GQA is a
KV cache Hq/Hkv times smaller, so your code must never copy K or V out to Hq
heads (no repeat_interleave / expand + contiguous of K/V).

Parts (see README.md):
  A  grouped_query_attention(q, k, v, is_causal, scale)    pytest labs/03 -k "not module"
  B  GroupedQueryAttention(d_model, n_heads, n_kv_heads)   pytest labs/03 -k module
  C  memory (no repeated K/V) and speed vs SDPA            graded by the hidden graders
Run everything with `pytest labs/03`; self-grade with `labs grade . --lab 03`.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


# --- Part A: grouped_query_attention ---

def grouped_query_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            is_causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale [+ causal mask]) v with KV heads shared by query groups.

    Shapes: q (B, Hq, Lq, D); k, v (B, Hkv, Lk, D); all of one floating dtype.
    Query head h uses KV head h // (Hq // Hkv) (the repeat_interleave order:
    heads [0, 1 | 2, 3] share KV heads [0 | 1] when Hq=4, Hkv=2).
    is_causal: bottom-right aligned, query i may see key j iff j <= i + (Lk - Lq);
    a query that sees no key outputs exact zeros (never NaN).
    scale: None means 1 / sqrt(D).
    Returns (B, Hq, Lq, D) in q's dtype; accumulate in float32 (keep float64 inputs in float64).
    Stable form: subtract the row max before exp; a fully masked row has max -inf,
    shift it by 0 instead, so its weights are exp(-inf) = 0 and its sum 0 (divide by 1).
    Raises ValueError: not 4-D, batch/head_dim/k-v shape mismatch, Hq % Hkv != 0, Lk < 1;
    TypeError: non-floating or mixed dtypes (name the argument and the value).
    Rules: do not call torch.nn.functional.scaled_dot_product_attention; allocate no
    tensor larger than max(B*Hq*Lq*Lk, B*Hq*Lq*D, B*Hkv*Lk*D) elements, i.e. never K/V
    repeated to Hq heads. Hint: view q as (B, Hkv, G*Lq, D) so one matmul per KV head
    scores all G query heads of the group. Beware: q.view(B, Hkv, G, Lq, D) @
    k.unsqueeze(2).transpose(-1, -2) makes matmul expand *and copy* K.
    """
    raise NotImplementedError("Part A: compute grouped-query attention without repeating K/V "
                              "(view q as (B, Hkv, G*Lq, D)), with bottom-right causal masking")


# --- Part B: GroupedQueryAttention module ---

class GroupedQueryAttention(nn.Module):
    """Self-attention block with n_heads query heads and n_kv_heads K/V heads.

    head_dim = d_model // n_heads. Submodules (names and sizes are the contract):
      q_proj: nn.Linear(d_model, n_heads * head_dim, bias=bias)
      k_proj: nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
      v_proj: nn.Linear(d_model, n_kv_heads * head_dim, bias=bias)
      o_proj: nn.Linear(n_heads * head_dim, d_model, bias=bias)
    Head h is columns [h*head_dim, (h+1)*head_dim) of its projection's output:
    q_proj(x).view(B, L, n_heads, head_dim).transpose(1, 2), likewise K/V.
    Raises ValueError for head counts < 1, n_heads % n_kv_heads != 0 or
    d_model % n_heads != 0 (name the values).
    """

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, bias: bool = False):
        super().__init__()
        raise NotImplementedError("Part B: check the head counts, then create q_proj, k_proj, v_proj, o_proj")

    def forward(self, x: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        """x: (B, L, d_model) -> (B, L, d_model): project, split heads, grouped_query_attention,
        merge heads (transpose(1, 2).reshape(B, L, n_heads*head_dim)), o_proj."""
        raise NotImplementedError("Part B: project x, split heads, call grouped_query_attention, merge, o_proj")
