"""Flash Attention: tiled attention with the online softmax, in PyTorch and Triton.

Reference solution of lab 04. It follows FlashAttention (Dao et al., 2022,
arXiv:2205.14135) and FlashAttention-2 (Dao, 2023, arXiv:2307.08691):

  Part A  flash_attention_torch   tiled pure PyTorch, online softmax, O(block) memory
  Part B  flash_attention_triton  one Triton forward kernel (pointer arithmetic)
  Part C  FlashAttentionFunction  autograd.Function; backward recomputes P from lse

Shape legend: B batch, H heads, Lq queries, Lk keys, D head_dim.
q: (B, H, Lq, D); k, v: (B, H, Lk, D); out: (B, H, Lq, D) in q's dtype;
lse: (B, H, Lq) float32, natural log of sum_j exp(scale * q_i . k_j).
Causal masking is bottom-right aligned: query i sees key j iff j <= i + (Lk - Lq).
A query that sees no key outputs zeros and lse = -inf (never NaN).
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
    Returns (out (B, H, Lq, D) in q's dtype, lse (B, H, Lq) float32, natural log).
    Never holds more than one (B, H, block_q, block_k) tile of scores: for each query
    block it keeps a running row max m, a running sum l and an unnormalised
    accumulator acc, and rescales l and acc by exp(m_old - m_new) when m grows.
    Raises TypeError/ValueError for bad arguments (see _check_inputs), ValueError
    for block sizes < 1.
    """
    scale = _check_inputs(q, k, v, scale)
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"{name} must be a positive int, got {b!r}")
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    for i0 in range(0, Lq, block_q):
        i1 = min(i0 + block_q, Lq)
        qi = q[:, :, i0:i1].float() * scale                                # (B, H, bq, D)
        rows = torch.arange(i0, i1, device=q.device)[:, None]              # (bq, 1)
        m = torch.full((B, H, i1 - i0), float("-inf"), device=q.device)    # running max
        l = torch.zeros((B, H, i1 - i0), device=q.device)                  # running sum
        acc = torch.zeros((B, H, i1 - i0, D), device=q.device)             # unnormalised out
        # causal: the last query of this block sees keys up to (i1 - 1) + (Lk - Lq)
        k_end = min(Lk, i1 + Lk - Lq) if is_causal else Lk
        for j0 in range(0, max(k_end, 0), block_k):
            j1 = min(j0 + block_k, Lk)
            s = qi @ k[:, :, j0:j1].float().transpose(-1, -2)              # (B, H, bq, bk)
            if is_causal:
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows + (Lk - Lq), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            # a row with no key seen yet has m_new = -inf: shift by 0 so exp(-inf) = 0, not NaN
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            p = torch.exp(s - m_safe[..., None])                            # (B, H, bq, bk)
            alpha = torch.exp(m - m_safe)                                   # rescale old stats
            l = l * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ v[:, :, j0:j1].float()
            m = m_new
        empty = l == 0                                                      # fully masked rows
        out[:, :, i0:i1] = (acc / torch.where(empty, 1.0, l)[..., None]).to(q.dtype)
        lse[:, :, i0:i1] = torch.where(empty, float("-inf"), m + torch.log(l))
    return out, lse


# --- Part B: Triton forward kernel ---

@triton.jit
def _flash_fwd_kernel(
    # pointers
    Q, K, V, Out, Lse,
    # strides (in elements)
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    # sizes
    H, Lq, Lk, sm_scale,
    # meta-parameters
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head), looping over key blocks."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)        # query rows of this program
    offs_n = tl.arange(0, BLOCK_N)                          # key columns within a block
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Lq

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)    # (BLOCK_M, HEAD_DIM)
    # K is read transposed, (HEAD_DIM, BLOCK_N), so that scores = q @ kT
    kT_ptrs = K + b * stride_kb + h * stride_kh + offs_d[:, None] * stride_kd + offs_n[None, :] * stride_kn
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)   # running max (natural units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                 # running sum of exp
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)      # unnormalised output
    LOG2E: tl.constexpr = 1.4426950408889634

    # causal: the last row of this block sees keys < (pid_m + 1) * BLOCK_M + Lk - Lq
    hi = Lk
    if IS_CAUSAL:
        hi = tl.minimum(Lk, (pid_m + 1) * BLOCK_M + Lk - Lq)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < Lk
        kT = tl.load(kT_ptrs + start_n * stride_kn, mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, kT) * sm_scale                          # (BLOCK_M, BLOCK_N) float32
        keep = col_ok[None, :]                                # padded keys are not keys
        if IS_CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + (Lk - Lq))
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows that have seen no key keep m = -inf: shift by 0 so exp gives 0, not NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        # subtract the max before scaling by log2(e): exact even for logits near -1e6
        p = tl.math.exp2((s - m_safe[:, None]) * LOG2E)
        alpha = tl.math.exp2((m_i - m_safe) * LOG2E)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    empty = l_i == 0.0                                       # fully masked rows
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log(l_safe))
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])
    tl.store(Lse + b * stride_lb + h * stride_lh + offs_m * stride_lm, lse, mask=row_ok)


def _launch_config(q) -> dict:
    """Tile sizes and launch options. On CPU (the interpreter, which runs one program
    at a time with numpy) small tiles keep it quick and exercise several blocks."""
    if q.device.type != "cuda":
        return dict(BLOCK_M=32, BLOCK_N=32)
    D = q.shape[-1]
    if q.dtype == torch.float32:      # 4-byte tiles: keep shared memory modest
        return dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8 if D >= 64 else 4, num_stages=2 if D >= 128 else 3)


def flash_attention_triton(q, k, v, is_causal=False, scale=None):
    """FlashAttention-2 forward in one Triton kernel.

    q: (B, H, Lq, D); k, v: (B, H, Lk, D); float32/float16/bfloat16, any strides
    (passed to the kernel, never copied). Returns (out (B, H, Lq, D) in q's dtype,
    lse (B, H, Lq) float32, natural log). Grid: (cdiv(Lq, BLOCK_M), B * H).
    Runs on CUDA, and on CPU under TRITON_INTERPRET=1 (set before importing).
    Raises TypeError/ValueError for bad arguments, RuntimeError for CPU tensors
    without the interpreter.
    """
    scale = _check_inputs(q, k, v, scale)
    if q.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("flash_attention_triton on CPU tensors needs TRITON_INTERPRET=1 set before "
                           "this module is imported (pytest sets it when there is no CUDA)")
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    cfg = _launch_config(q)
    grid = (triton.cdiv(Lq, cfg["BLOCK_M"]), B * H)
    _flash_fwd_kernel[grid](
        q, k, v, out, lse,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
        H, Lq, Lk, scale,
        IS_CAUSAL=bool(is_causal), HEAD_DIM=D, **cfg,
    )
    return out, lse


# --- Part C: backward pass by recomputation ---

def _flash_backward(q, k, v, out, dout, lse, is_causal, scale, block_q=64, block_k=64):
    """FlashAttention-2 backward (Alg. 2), tiled in PyTorch: recompute P = exp(S - lse)
    tile by tile, never holding an (Lq, Lk) matrix. Returns (dq, dk, dv) float32.

    With Delta_i = rowsum(dO_i * O_i) (= rowsum(P_i * dP_i)):
      dV_j += P^T dO,  dP = dO V_j^T,  dS = P * (dP - Delta),
      dQ_i += scale * dS K_j,  dK_j += scale * dS^T Q_i.
    """
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    delta = (dout.float() * out.float()).sum(dim=-1)                        # (B, H, Lq)
    lse_safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)    # empty rows: P = 0
    dq = torch.zeros((B, H, Lq, D), device=q.device)
    dk = torch.zeros((B, H, Lk, D), device=q.device)
    dv = torch.zeros((B, H, Lk, D), device=q.device)
    for j0 in range(0, Lk, block_k):
        j1 = min(j0 + block_k, Lk)
        kj, vj = k[:, :, j0:j1].float(), v[:, :, j0:j1].float()           # (B, H, bk, D)
        cols = torch.arange(j0, j1, device=q.device)[None, :]
        # causal: queries before j0 - (Lk - Lq) see none of these keys
        i_start = max(0, j0 - (Lk - Lq)) if is_causal else 0
        i_start -= i_start % block_q
        for i0 in range(i_start, Lq, block_q):
            i1 = min(i0 + block_q, Lq)
            qi, doi = q[:, :, i0:i1].float(), dout[:, :, i0:i1].float()    # (B, H, bq, D)
            s = (qi @ kj.transpose(-1, -2)) * scale                         # (B, H, bq, bk)
            if is_causal:
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                s = s.masked_fill(cols > rows + (Lk - Lq), float("-inf"))
            p = torch.exp(s - lse_safe[:, :, i0:i1, None])
            dv[:, :, j0:j1] += p.transpose(-1, -2) @ doi
            dp = doi @ vj.transpose(-1, -2)
            ds = p * (dp - delta[:, :, i0:i1, None])
            dq[:, :, i0:i1] += (ds @ kj) * scale
            dk[:, :, j0:j1] += (ds.transpose(-1, -2) @ qi) * scale
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Attention with a memory-efficient backward (FlashAttention-2).

    ``FlashAttentionFunction.apply(q, k, v, is_causal=False) -> out`` with scale
    1/sqrt(D). Forward: the Triton kernel on CUDA, the tiled PyTorch version on
    CPU (the interpreter is slow); it saves q, k, v, out and lse (natural log),
    never the (Lq, Lk) probabilities. Backward: recomputes them tile by tile.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        scale = _check_inputs(q, k, v)
        if q.device.type == "cuda":
            out, lse = flash_attention_triton(q, k, v, is_causal=is_causal, scale=scale)
        else:
            out, lse = flash_attention_torch(q, k, v, is_causal=is_causal, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = bool(is_causal)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(q, k, v, out, dout, lse, ctx.is_causal, ctx.scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None
