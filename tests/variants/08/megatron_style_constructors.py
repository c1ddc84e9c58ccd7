"""Correct, written independently (issue "Graders that charge one deviation once", lab 08): the
layers have their own Megatron-style constructors, not the stub's given ones:
``ColumnParallelLinear(in_features, out_features, bias=True, group=None, gather_output=False)``
allocates this rank's shard and checks the split itself, ``ParallelAttention(qkv, proj, n_heads,
group=None, is_causal=True)`` takes its fused qkv shard as a ``ColumnParallelLinear`` (this
rank's q, k and v rows), and ``from_linear`` / ``from_mlp`` / ``from_attention`` are exactly the
contract's and copy the shards in. f and g are single autograd Functions on ``torch.distributed``;
the blocks are split with ``tensor_split``. The contract fixes the ``from_*`` classmethods, not
``__init__``: it must lose no point. Before the API check bound only the graders' own calls
(issue 26.1) it scored 0/100 there, its constructors differing from the stub's given ones:
this variant keeps that fixed."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

MAY_FAIL = []


def _split(n: int, group, what: str) -> tuple[int, int, int]:
    """``(W, r, n // W)``; ValueError naming ``what`` and ``n`` when W does not divide it."""
    W, r = dist.get_world_size(group), dist.get_rank(group)
    if n % W:
        raise ValueError(f"{what}={n} cannot be split over W={W} ranks")
    return W, r, n // W


class _F(torch.autograd.Function):
    """Megatron's f: identity; the gradient summed over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        g = g.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(g, op=dist.ReduceOp.SUM, group=ctx.group)
        return g, None


class _G(torch.autograd.Function):
    """Megatron's g: the sum over the group; the gradient passes."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(y, op=dist.ReduceOp.SUM, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


class _Gather(torch.autograd.Function):
    """The ranks' last-dim blocks side by side; backward: this rank's block."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, -1)

    @staticmethod
    def backward(ctx, g):
        W, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return g.tensor_split(W, -1)[r].contiguous(), None


class _Scatter(torch.autograd.Function):
    """This rank's last-dim block; backward: the blocks' gradients gathered."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        W, r = dist.get_world_size(group), dist.get_rank(group)
        return x.tensor_split(W, -1)[r].contiguous()

    @staticmethod
    def backward(ctx, g):
        return _Gather.forward(ctx, g, ctx.group), None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return _F.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    return _G.apply(x, group)


class ColumnParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 gather_output: bool = False):
        super().__init__()
        _, _, n = _split(out_features, group, "out_features")
        self.group, self.gather_output = group, gather_output
        self.weight = nn.Parameter(torch.empty(n, in_features))
        self.bias = nn.Parameter(torch.empty(n)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False) -> "ColumnParallelLinear":
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, group, gather_output)
        W, r = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            m.weight.copy_(linear.weight.tensor_split(W, 0)[r])
            if m.bias is not None:
                m.bias.copy_(linear.bias.tensor_split(W, 0)[r])
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return _Gather.apply(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 input_is_parallel: bool = True):
        super().__init__()
        _, _, n = _split(in_features, group, "in_features")
        self.group, self.input_is_parallel = group, input_is_parallel
        self.weight = nn.Parameter(torch.empty(out_features, n))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True) -> "RowParallelLinear":
        m = cls(linear.in_features, linear.out_features, linear.bias is not None, group, input_is_parallel)
        W, r = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            m.weight.copy_(linear.weight.tensor_split(W, 1)[r])
            if m.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = _Scatter.apply(x, self.group)
        y = reduce_from_tp(x @ self.weight.t(), self.group)
        return y if self.bias is None else y + self.bias


class ParallelMLP(nn.Module):
    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear, activation=F.gelu):
        super().__init__()
        self.fc1, self.fc2, self.activation = fc1, fc2, activation

    @classmethod
    def from_mlp(cls, fc1: nn.Linear, fc2: nn.Linear, group=None, activation=F.gelu) -> "ParallelMLP":
        if fc2.in_features != fc1.out_features:
            raise ValueError(f"fc2.in_features={fc2.in_features} differs from fc1.out_features={fc1.out_features}")
        _split(fc1.out_features, group, "fc1.out_features")
        return cls(ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group), activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class ParallelAttention(nn.Module):
    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, n_heads: int, group=None,
                 is_causal: bool = True):
        super().__init__()
        self.heads = _split(n_heads, group, "n_heads")[2]   # this rank's heads
        self.qkv, self.proj, self.is_causal = qkv, proj, is_causal

    @classmethod
    def from_attention(cls, qkv: nn.Linear, proj: nn.Linear, n_heads: int, group=None,
                       is_causal: bool = True) -> "ParallelAttention":
        d = qkv.in_features
        if qkv.out_features != 3 * d:
            raise ValueError(f"qkv.out_features={qkv.out_features}, expected 3 * d = {3 * d}")
        if proj.in_features != d:
            raise ValueError(f"proj.in_features={proj.in_features}, expected d = {d}")
        if n_heads <= 0 or d % n_heads:
            raise ValueError(f"n_heads={n_heads} does not divide d={d}")
        W, r, _ = _split(n_heads, group, "n_heads")
        shard = ColumnParallelLinear(d, 3 * d, qkv.bias is not None, group)
        with torch.no_grad():   # this rank's block of each of q, k and v
            shard.weight.copy_(torch.cat([t.tensor_split(W, 0)[r] for t in qkv.weight.split(d, 0)]))
            if qkv.bias is not None:
                shard.bias.copy_(torch.cat([t.tensor_split(W, 0)[r] for t in qkv.bias.split(d, 0)]))
        return cls(shard, RowParallelLinear.from_linear(proj, group), n_heads, group, is_causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
        return self.proj(o.transpose(1, 2).flatten(2))
