"""Lab 08: tensor parallelism, Megatron-LM's intra-layer model parallelism.

You split the weight matrices of a transformer's MLP and attention across the W ranks of
a process group, so that each rank stores and multiplies only 1/W of them (Shoeybi et
al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", 2019, sec. 3). A column-parallel linear splits the output features, a
row-parallel linear the input features; two conjugate functions, ``f`` (identity
forward, all-reduce backward) and ``g`` (all-reduce forward, identity backward), glue
them so that an MLP or an attention block costs exactly one all-reduce in forward and
one in backward. It runs inside an initialised process group (gloo on CPU, nccl on GPU).

Parts (see README.md)
  A  f and g; column- and row-parallel linears    pytest labs/08 -k part_a
  B  parallel MLP and attention                   pytest labs/08 -k part_b
  C  communication and memory                     pytest labs/08 -k part_c

Shape legend: W = ranks in ``group`` (``dist.get_world_size(group)``), r = this rank
(``dist.get_rank(group)``); a Linear's weight is ``(out, in)``; ``...`` any leading dims;
B = batch, L = sequence length, d = model width, H = n_heads, D = d // H (head dim).
Rank r owns block r of every split dimension: ``[r*n/W, (r+1)*n/W)`` of a size n.

Gradient convention (Megatron's): every rank computes the same loss. A replicated tensor
(a layer's input, an all-reduced or all-gathered output) receives the FULL gradient on
every rank; a partitioned tensor (a column-parallel output without ``gather_output``)
receives this rank's slice of the full gradient. A parameter shard's gradient is the
matching slice of the unsharded layer's gradient.

Every function and constructor takes ``group=None`` (the world) and issues every
collective on ``group``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _shard_size(total: int, W: int, what: str) -> int:
    """``total // W``; ValueError naming ``what`` and both values if W does not divide ``total``."""
    raise NotImplementedError("Part A: return total // W, or raise ValueError naming what, total and W")


# --- Part A: Megatron's f and g (you may replace these skeletons with your own) ---

class _CopyToTP(torch.autograd.Function):
    """``f``. Forward: x unchanged. Backward: the all-reduce (sum) over ``group`` of the incoming
    gradient (which may be non-contiguous)."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError("Part A: keep the group on ctx, return x (e.g. x.view_as(x))")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Part A: all-reduce a contiguous copy of grad; return it and None (for group)")


class _ReduceFromTP(torch.autograd.Function):
    """``g``. Forward: the all-reduce (sum) of x into a NEW tensor (x is left unchanged; it may be
    non-contiguous). Backward: the gradient unchanged."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError("Part A: all-reduce a contiguous copy of x and return the copy")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Part A: return grad and None")


class _GatherFromTP(torch.autograd.Function):
    """For ``gather_output``. Forward: the ranks' blocks ``(..., n)`` concatenated in rank order
    along the last dim, ``(..., W*n)``. Backward: this rank's block of the gradient (no sum)."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError("Part A: all-gather the blocks, torch.cat them along dim -1")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Part A: return grad[..., r*n:(r+1)*n] (contiguous) and None")


class _ScatterToTP(torch.autograd.Function):
    """For ``input_is_parallel=False``. Forward: this rank's block ``(..., n)`` of the last dim of
    x ``(..., W*n)``. Backward: the blocks' gradients all-gathered in rank order, ``(..., W*n)``."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError("Part A: return x[..., r*n:(r+1)*n] (contiguous)")

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError("Part A: all-gather the gradient blocks, concatenate them along dim -1")


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``f``: identity forward; all-reduce (sum) of the gradient in backward.

    x: any shape, possibly non-contiguous. Returns a tensor equal to x whose gradient, in
    backward, is the sum over the ranks of ``group`` of the gradients reaching it: each rank
    holds only its partial gradient of x, and the replicated x needs the full one. A
    ``torch.autograd.Function``; at W = 1 it may return x unchanged.
    """
    raise NotImplementedError("Part A: return _CopyToTP.apply(x, group) (x itself at W = 1)")


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``g``: all-reduce (sum) forward into a new tensor; identity backward.

    x: any shape, possibly non-contiguous; it is left unchanged. Returns the sum over the
    ranks of ``group`` of their x (same shape); in backward the gradient passes through
    unchanged (the output is replicated, so its gradient already is the full one). A
    ``torch.autograd.Function``; at W = 1 it may return x unchanged.
    """
    raise NotImplementedError("Part A: return _ReduceFromTP.apply(x, group) (x itself at W = 1)")


class ColumnParallelLinear(nn.Module):
    """This rank's output features of a linear: ``weight (out/W, in)`` = rows
    ``[r*out/W, (r+1)*out/W)`` of the linear's weight, ``bias (out/W,)`` the same rows (None
    for a linear without bias); both ``nn.Parameter``s with storages of their own."""

    def __init__(self, weight, bias, group, gather_output):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.gather_output = group, gather_output

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False) -> "ColumnParallelLinear":
        """This rank's shard of ``linear`` (``nn.Linear(in, out)``), as copies (``.clone()``, not
        views of the linear's tensors; keep no reference to ``linear``).

        Raises ValueError naming ``out_features`` and its value when W does not divide it.
        """
        raise NotImplementedError("Part A: check out_features % W, copy rows [r*out/W, (r+1)*out/W) of "
                                  "the weight and bias, return cls(weight, bias, group, gather_output)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``(..., in)``, replicated on every rank -> ``(..., out/W)``: ``F.linear`` of
        ``copy_to_tp(x)`` with the shard. With ``gather_output``: ``(..., out)``, the ranks'
        blocks in rank order along the last dim (its backward keeps this rank's block)."""
        raise NotImplementedError("Part A: F.linear(copy_to_tp(x, group), weight, bias); "
                                  "gather the blocks if gather_output")


class RowParallelLinear(nn.Module):
    """This rank's input features of a linear: ``weight (out, in/W)`` = columns
    ``[r*in/W, (r+1)*in/W)`` of the linear's weight, and the FULL ``bias (out,)``, added once
    (after the all-reduce); both ``nn.Parameter``s with storages of their own."""

    def __init__(self, weight, bias, group, input_is_parallel):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.input_is_parallel = group, input_is_parallel

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True) -> "RowParallelLinear":
        """This rank's shard of ``linear`` (``nn.Linear(in, out)``), as copies (keep no reference
        to ``linear``).

        Raises ValueError naming ``in_features`` and its value when W does not divide it.
        """
        raise NotImplementedError("Part A: check in_features % W, copy columns [r*in/W, (r+1)*in/W) of "
                                  "the weight and the whole bias, return cls(weight, bias, group, input_is_parallel)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x_part ``(..., in/W)`` (this rank's block of the input, e.g. a column-parallel output)
        -> ``(..., out)``, the same on every rank: ``reduce_from_tp`` of the partial product
        ``F.linear(x_part, weight)``, then ``+ bias`` once. With ``input_is_parallel=False``, x is
        the full ``(..., in)``: use its columns ``[r*in/W, (r+1)*in/W)`` (its backward
        all-gathers the gradient). The bias's gradient is the full one on every rank."""
        raise NotImplementedError("Part A: (scatter x if not input_is_parallel), "
                                  "reduce_from_tp(F.linear(x, weight)) + bias")


class ParallelMLP(nn.Module):
    """``fc2(activation(fc1(x)))`` with a column-parallel ``fc1`` and a row-parallel ``fc2``:
    ``x (..., d) -> (..., d)``, one all-reduce forward (in fc2) and one backward (in fc1's f)."""

    def __init__(self, fc1, fc2, activation):
        super().__init__()
        self.fc1, self.fc2, self.activation = fc1, fc2, activation

    @classmethod
    def from_mlp(cls, fc1: nn.Linear, fc2: nn.Linear, group=None, activation=F.gelu) -> "ParallelMLP":
        """``fc1: Linear(d, h)``, ``fc2: Linear(h, d)``; ``activation`` is elementwise (exact erf
        GELU by default). The submodules are ``self.fc1`` (``ColumnParallelLinear``) and
        ``self.fc2`` (``RowParallelLinear``).

        Raises ValueError, naming the argument and value, when ``fc2.in_features !=
        fc1.out_features`` or when W does not divide ``fc1.out_features``.
        """
        raise NotImplementedError("Part B: check the shapes, shard fc1 by columns and fc2 by rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``(..., d)`` replicated -> ``(..., d)`` replicated."""
        raise NotImplementedError("Part B: fc2(activation(fc1(x)))")


class ParallelAttention(nn.Module):
    """Multi-head attention with this rank's heads ``[r*H/W, (r+1)*H/W)``.

    ``qkv_weight (3d/W, d)`` = the qkv rows ``j*d + [r*d/W, (r+1)*d/W)`` for j = 0, 1, 2 (this
    rank's q, k and v rows; NOT one contiguous block of 3d/W rows), ``qkv_bias (3d/W,)`` the same
    rows, ``proj`` a ``RowParallelLinear`` (columns ``[r*d/W, (r+1)*d/W)``, the full bias).
    """

    def __init__(self, qkv_weight, qkv_bias, proj, n_heads_local, group, is_causal):
        super().__init__()
        self.qkv_weight = nn.Parameter(qkv_weight)
        self.qkv_bias = nn.Parameter(qkv_bias) if qkv_bias is not None else None
        self.proj, self.n_heads_local, self.group, self.is_causal = proj, n_heads_local, group, is_causal

    @classmethod
    def from_attention(cls, qkv: nn.Linear, proj: nn.Linear, n_heads: int, group=None,
                       is_causal: bool = True) -> "ParallelAttention":
        """``qkv: Linear(d, 3d)``, ``proj: Linear(d, d)``. The unsharded module is
        ``q, k, v = qkv(x).split(d, dim=-1)``, each ``.view(B, L, H, D).transpose(1, 2)``,
        ``o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)``,
        ``proj(o.transpose(1, 2).reshape(B, L, d))``.

        Raises ValueError, naming the argument and value, when ``qkv.out_features != 3d``,
        ``proj.in_features != d``, ``d % n_heads != 0`` or W does not divide ``n_heads``.
        """
        raise NotImplementedError("Part B: check the shapes, copy this rank's q, k and v rows of qkv, "
                                  "shard proj by rows")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``(B, L, d)`` replicated -> ``(B, L, d)`` replicated: this rank's H/W heads attend,
        ``proj`` sums the ranks' partial outputs (one all-reduce)."""
        raise NotImplementedError("Part B: F.linear(copy_to_tp(x), qkv_weight, qkv_bias), split into this "
                                  "rank's q, k, v heads, attention, then proj")
