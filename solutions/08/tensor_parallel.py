"""Lab 08 reference: tensor parallelism (Megatron-LM's intra-layer model parallelism).

Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism", 2019, sec. 3: a column-parallel linear splits the output features,
a row-parallel linear the input features; the conjugate functions ``f`` (identity
forward, all-reduce backward) and ``g`` (all-reduce forward, identity backward) make an
MLP or an attention block cost one all-reduce forward and one backward.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def _shard_size(total: int, W: int, what: str) -> int:
    if total % W:
        raise ValueError(f"{what}={total} is not divisible by the group's size W={W}")
    return total // W


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _gather_last(x: torch.Tensor, group) -> torch.Tensor:
    """The ranks' ``x`` concatenated along the last dim, in rank order."""
    parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


class _GatherFromTP(torch.autograd.Function):
    """Forward: the ranks' blocks along the last dim, in rank order; backward: this rank's block."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last(x, group)

    @staticmethod
    def backward(ctx, grad):
        W, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        n = grad.shape[-1] // W
        return grad[..., r * n:(r + 1) * n].contiguous(), None


class _ScatterToTP(torch.autograd.Function):
    """Forward: this rank's block of the last dim; backward: all-gather the blocks."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        W, r = dist.get_world_size(group), dist.get_rank(group)
        n = x.shape[-1] // W
        return x[..., r * n:(r + 1) * n].contiguous()

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad, ctx.group), None


def copy_to_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``f``: identity forward; all-reduce (sum) of the gradient in backward."""
    if dist.get_world_size(group) == 1:
        return x
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's ``g``: all-reduce (sum) forward into a new tensor; identity backward."""
    if dist.get_world_size(group) == 1:
        return x
    return _ReduceFromTP.apply(x, group)


class ColumnParallelLinear(nn.Module):
    """``weight (out/W, in)``: rows ``[r*out/W, (r+1)*out/W)`` of the linear's; bias the same rows."""

    def __init__(self, weight, bias, group, gather_output):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.gather_output = group, gather_output

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = False) -> "ColumnParallelLinear":
        W, r = dist.get_world_size(group), dist.get_rank(group)
        n = _shard_size(linear.out_features, W, "out_features")
        rows = slice(r * n, (r + 1) * n)
        bias = None if linear.bias is None else linear.bias.detach()[rows].clone()
        return cls(linear.weight.detach()[rows].clone(), bias, group, gather_output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        if self.gather_output and dist.get_world_size(self.group) > 1:
            y = _GatherFromTP.apply(y, self.group)
        return y


class RowParallelLinear(nn.Module):
    """``weight (out, in/W)``: input columns ``[r*in/W, (r+1)*in/W)``; the full bias, added once."""

    def __init__(self, weight, bias, group, input_is_parallel):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.input_is_parallel = group, input_is_parallel

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = True) -> "RowParallelLinear":
        W, r = dist.get_world_size(group), dist.get_rank(group)
        n = _shard_size(linear.in_features, W, "in_features")
        bias = None if linear.bias is None else linear.bias.detach().clone()
        return cls(linear.weight.detach()[:, r * n:(r + 1) * n].clone(), bias, group, input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel and dist.get_world_size(self.group) > 1:
            x = _ScatterToTP.apply(x, self.group)
        y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class ParallelMLP(nn.Module):
    """``fc2(activation(fc1(x)))`` with a column-parallel fc1 and a row-parallel fc2."""

    def __init__(self, fc1, fc2, activation):
        super().__init__()
        self.fc1, self.fc2, self.activation = fc1, fc2, activation

    @classmethod
    def from_mlp(cls, fc1: nn.Linear, fc2: nn.Linear, group=None, activation=F.gelu) -> "ParallelMLP":
        if fc2.in_features != fc1.out_features:
            raise ValueError(f"fc2.in_features={fc2.in_features} must equal fc1.out_features={fc1.out_features}")
        _shard_size(fc1.out_features, dist.get_world_size(group), "fc1.out_features")
        return cls(ColumnParallelLinear.from_linear(fc1, group), RowParallelLinear.from_linear(fc2, group), activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation(self.fc1(x)))


class ParallelAttention(nn.Module):
    """Multi-head attention with this rank's heads ``[r*H/W, (r+1)*H/W)`` and a row-parallel proj."""

    def __init__(self, qkv_weight, qkv_bias, proj, n_heads_local, group, is_causal):
        super().__init__()
        self.qkv_weight = nn.Parameter(qkv_weight)
        self.qkv_bias = nn.Parameter(qkv_bias) if qkv_bias is not None else None
        self.proj, self.n_heads_local, self.group, self.is_causal = proj, n_heads_local, group, is_causal

    @classmethod
    def from_attention(cls, qkv: nn.Linear, proj: nn.Linear, n_heads: int, group=None,
                       is_causal: bool = True) -> "ParallelAttention":
        d = qkv.in_features
        if qkv.out_features != 3 * d:
            raise ValueError(f"qkv.out_features={qkv.out_features} must be 3 * d = {3 * d}")
        if proj.in_features != d:
            raise ValueError(f"proj.in_features={proj.in_features} must equal d={d}")
        if n_heads < 1 or d % n_heads:
            raise ValueError(f"d={d} is not divisible by n_heads={n_heads}")
        W, r = dist.get_world_size(group), dist.get_rank(group)
        h = _shard_size(n_heads, W, "n_heads")
        n = d // W
        rows = torch.cat([torch.arange(j * d + r * n, j * d + (r + 1) * n) for j in range(3)])
        bias = None if qkv.bias is None else qkv.bias.detach()[rows].clone()
        return cls(qkv.weight.detach()[rows].clone(), bias, RowParallelLinear.from_linear(proj, group), h, group,
                   is_causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        qkv = F.linear(copy_to_tp(x, self.group), self.qkv_weight, self.qkv_bias)
        q, k, v = (t.view(B, L, self.n_heads_local, -1).transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=self.is_causal)
        return self.proj(o.transpose(1, 2).reshape(B, L, -1))
