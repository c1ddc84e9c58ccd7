"""Lab 04 -- Flash Attention: tiled attention with the online softmax.

You build exact attention that never materialises the (Lq, Lk) score matrix,
following FlashAttention (Dao et al., 2022, arXiv:2205.14135) and
FlashAttention-2 (Dao, 2023, arXiv:2307.08691). Read labs/04/README.md first.

  Part A  flash_attention_torch   tiled pure PyTorch, online softmax   pytest labs/04 -k part_a
  Part B  flash_attention_triton  one Triton forward kernel            pytest labs/04 -k part_b
  Part C  FlashAttentionFunction  autograd.Function, backward from lse pytest labs/04 -k part_c

Shape legend: B batch, H heads, Lq queries, Lk keys, D head_dim (16, 32, 64 or 128).
q: (B, H, Lq, D); k, v: (B, H, Lk, D); out: (B, H, Lq, D) in q's dtype;
lse: (B, H, Lq) float32, natural log of sum_j exp(scale * q_i . k_j).
Causal masking is bottom-right aligned: query i sees key j iff j <= i + (Lk - Lq).
A query that sees no key outputs zeros and lse = -inf (never NaN).
Without a GPU, pytest sets TRITON_INTERPRET=1 so Triton kernels run on CPU.
"""
from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _check_inputs(q, k, v, scale=None) -> float:
    """Validate q, k, v (and scale); return the softmax scale. Raises TypeError for
    non-tensors and dtypes, ValueError for shapes, head dim and devices."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have shape (B, H, L, D), got {tuple(t.shape)}")
    if q.dtype not in DTYPES:
        raise TypeError(f"q.dtype must be float32, float16 or bfloat16, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}.dtype {t.dtype} differs from q.dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    B, H, Lq, D = q.shape
    if k.shape[0] != B or k.shape[1] != H or k.shape[3] != D:
        raise ValueError(f"k has shape {tuple(k.shape)}, expected (B={B}, H={H}, Lk, D={D}) to match q {tuple(q.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v has shape {tuple(v.shape)}, expected k's shape {tuple(k.shape)}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head dim D={D} of q is not supported (D must be one of {HEAD_DIMS})")
    if Lq < 1 or k.shape[2] < 1:
        raise ValueError(f"sequence lengths must be >= 1, got Lq={Lq} (q) and Lk={k.shape[2]} (k)")
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


# --- Part A: tiled attention in PyTorch with the online softmax ---

def flash_attention_torch(q, k, v, is_causal=False, scale=None, block_q=64, block_k=64):
    """Attention computed tile by tile with the online softmax (FlashAttention-2, Alg. 1).

    q: (B, H, Lq, D); k, v: (B, H, Lk, D); float32/float16/bfloat16, any strides.
    scale: None means 1/sqrt(D). Returns (out (B, H, Lq, D) in q's dtype,
    lse (B, H, Lq) float32, natural log). Bottom-right causal mask when is_causal.

    Memory: no tensor allocated during the call may hold more than
    max(B*H*block_q*block_k, numel of q, k, v or out) elements -- one tile of
    scores, never the (Lq, Lk) matrix.
    Stable form: per query block keep a running row max m (start at -inf), sum l
    and unnormalised accumulator acc in float32; for each key block
        m_new = max(m, rowmax(S)); p = exp(S - m_new); alpha = exp(m - m_new)
        l = alpha * l + rowsum(p); acc = alpha * acc + p @ V; m = m_new
    then out = acc / l and lse = m + log(l). Shift by 0 where m_new is -inf (a
    row with no key yet), and give rows with l == 0 zeros and lse = -inf.
    Raises TypeError/ValueError naming the argument (call _check_inputs), and
    ValueError for block sizes < 1.
    """
    raise NotImplementedError("Part A: tile over query and key blocks with the online softmax "
                              "(running max, running sum, rescaled accumulator); return (out, lse)")


# --- Part B: Triton forward kernel ---

# Write your kernel here: a @triton.jit function taking pointers, strides, sizes and
# tl.constexpr tile sizes (BLOCK_M, BLOCK_N, HEAD_DIM). Address tiles with pointer
# arithmetic: base + offs_m[:, None] * stride_m + offs_d[None, :] * stride_d, and
# load/store with masks for rows and columns past Lq / Lk. Do not use
# tl.make_block_ptr or tl.advance (removed in Triton 3.9).


def flash_attention_triton(q, k, v, is_causal=False, scale=None):
    """FlashAttention-2 forward in one Triton kernel.

    q: (B, H, Lq, D); k, v: (B, H, Lk, D); float32/float16/bfloat16, any strides:
    pass q.stride() etc. to the kernel, do not copy. Returns (out (B, H, Lq, D) in
    q's dtype, lse (B, H, Lq) float32, natural log). One program per
    (query block, batch * head); it loops over key blocks with the online softmax
    (same stable form as Part A), masking keys >= Lk and, when causal, keys
    j > i + (Lk - Lq) with -inf. If you use exp2 for speed, subtract the running
    max before multiplying by log2(e), and store lse in natural log.
    Runs on CUDA, and on CPU under TRITON_INTERPRET=1 (set before import).
    Raises TypeError/ValueError naming the argument (call _check_inputs).
    """
    raise NotImplementedError("Part B: write a Triton kernel (pointer arithmetic, masks) and launch it "
                              "on a grid (cdiv(Lq, BLOCK_M), B * H); return (out, lse)")


# --- Part C: backward pass by recomputation ---

class FlashAttentionFunction(torch.autograd.Function):
    """Attention with a memory-efficient backward (FlashAttention-2, Alg. 2).

    ``FlashAttentionFunction.apply(q, k, v, is_causal=False) -> out`` with scale
    1/sqrt(D); shapes and dtypes as in Part A.
    forward: compute (out, lse) with your Part A or Part B function and save
    q, k, v, out and lse (ctx.save_for_backward) -- never the probabilities.
    backward(dout): return (dq, dk, dv, None) in the inputs' dtypes, recomputing
    P = exp(scale * Q K^T - lse) tile by tile; with Delta_i = rowsum(dO_i * O_i):
        dV_j += P^T dO_i;  dP = dO_i V_j^T;  dS = P * (dP - Delta_i)
        dQ_i += scale * dS K_j;  dK_j += scale * dS^T Q_i
    Nothing of size (Lq, Lk) may be allocated in backward either.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        raise NotImplementedError("Part C: compute (out, lse), save q, k, v, out, lse for backward, return out")

    @staticmethod
    def backward(ctx, dout):
        raise NotImplementedError("Part C: recompute P tile by tile from the saved lse and return dq, dk, dv, None")
