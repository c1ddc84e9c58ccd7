"""ZeRO stage 1: AdamW with optimizer state sharded across data-parallel ranks
(reference solution of lab 02).

Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models" (SC 2020), stage 1 (P_os): every rank keeps the full
parameters and gradients, but Adam's two moments only for the 1/W of the
elements it owns. One step:

    flat  = concat(grad of every param, in group order, None -> 0), padded to W*c
    shard = reduce_scatter(flat) / W            # this rank's c averaged grad elements
    norm  = sqrt(all_reduce(sum(shard**2)))     # global norm of the averaged gradient
    shard *= min(1, max_grad_norm / (norm + 1e-6))   (if max_grad_norm is set)
    AdamW on the owned elements (torch.optim.AdamW's formula, per-parameter step count)
    params = all_gather(owned params)           # every rank identical again

Shape legend: N = total parameter elements, W ranks in ``group``, c = ceil(N/W);
rank r owns flat elements [r*c, min((r+1)*c, N)).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
    """Sum ``inp`` (W*c elements) over the group; this rank receives its chunk in ``out`` (c).
    (torch >= 2.13 calls it reduce_scatter_single; reduce_scatter_tensor is the older name.)"""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, op=dist.ReduceOp.SUM, group=group)


def all_gather(out: torch.Tensor, inp: torch.Tensor, group=None) -> None:
    """Rank-ordered concatenation of every rank's ``inp`` (c elements) into ``out`` (W*c)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


class ZeroAdamW(torch.optim.Optimizer):
    """AdamW whose exp_avg / exp_avg_sq live only on the rank that owns each element.

    params: iterable of tensors or of param-group dicts (per-group lr, betas, eps,
    weight_decay). max_grad_norm: clip the averaged gradient to this global 2-norm
    (None: no clipping). group: the data-parallel process group (None: the world).
    After ``step()``, ``self.grad_norm`` is the global norm (0-dim float32 tensor).
    Raises ValueError for a negative lr/eps/weight_decay/max_grad_norm or betas outside [0, 1).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_grad_norm=None, group=None):
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if max_grad_norm is not None and not max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.max_grad_norm = max_grad_norm
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.grad_norm = None
        # Flat layout: (param, group index, offset in the flat sequence), in group then param order.
        self._layout = []
        offset = 0
        for gi, g in enumerate(self.param_groups):
            for p in g["params"]:
                if p.dtype != torch.float32:
                    raise TypeError(f"params must be float32, got {p.dtype}")
                self._layout.append((p, gi, offset))
                offset += p.numel()
        self.numel = offset
        self.chunk = -(-offset // self.world_size)  # c = ceil(N / W)
        self.lo = min(self.rank * self.chunk, offset)
        self.hi = min(self.lo + self.chunk, offset)

    def _owned(self, offset: int, numel: int) -> tuple[int, int]:
        """[a, b) within a param (flat, length numel at ``offset``) that this rank owns."""
        a = min(max(self.lo - offset, 0), numel)
        b = min(max(self.hi - offset, 0), numel)
        return a, max(a, b)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        W, c, N = self.world_size, self.chunk, self.numel
        device = self._layout[0][0].device if self._layout else torch.device("cpu")

        # 1. Average gradients: reduce-scatter the flat, padded gradient (None counts as 0 here).
        flat = torch.zeros(W * c, dtype=torch.float32, device=device)
        has_grad = torch.zeros(max(len(self._layout), 1), dtype=torch.int32, device=device)
        for i, (p, _, off) in enumerate(self._layout):
            if p.grad is not None:
                flat[off:off + p.numel()] = p.grad.reshape(-1)
                has_grad[i] = 1
        shard = torch.empty(c, dtype=torch.float32, device=device)
        if c > 0:
            reduce_scatter(shard, flat, group=self.group)
        del flat
        shard /= W
        # A parameter with no gradient on any rank is skipped (as torch.optim.AdamW does).
        dist.all_reduce(has_grad, op=dist.ReduceOp.MAX, group=self.group)

        # 2. Global norm of the averaged gradient, from every shard's sum of squares.
        sq = (shard.double() ** 2).sum().float().reshape(1)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)
        self.grad_norm = sq.sqrt().reshape(())
        if self.max_grad_norm is not None:
            # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1
            coef = torch.clamp(self.max_grad_norm / (self.grad_norm + 1e-6), max=1.0)
            shard *= coef

        # 3. AdamW on the owned elements of each parameter that has a gradient somewhere.
        for i, (p, gi, off) in enumerate(self._layout):
            a, b = self._owned(off, p.numel())
            if b <= a or not has_grad[i]:
                continue
            g = self.param_groups[gi]
            lr, (beta1, beta2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            grad = shard[off + a - self.lo: off + b - self.lo]
            state = self.state[p]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros(b - a, dtype=torch.float32, device=device)
                state["exp_avg_sq"] = torch.zeros(b - a, dtype=torch.float32, device=device)
            state["step"] += 1
            t = state["step"]
            m, v = state["exp_avg"], state["exp_avg_sq"]
            x = p.view(-1)[a:b]
            x.mul_(1 - lr * wd)                                  # decoupled weight decay
            m.lerp_(grad, 1 - beta1)
            v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = lr / (1 - beta1 ** t)
            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(eps)
            x.addcdiv_(m, denom, value=-step_size)

        # 4. All-gather the owned parameter elements so every rank holds the same parameters.
        if c > 0:
            mine = torch.zeros(c, dtype=torch.float32, device=device)
            for p, _, off in self._layout:
                a, b = self._owned(off, p.numel())
                if b > a:
                    mine[off + a - self.lo: off + b - self.lo] = p.view(-1)[a:b]
            full = torch.empty(W * c, dtype=torch.float32, device=device)
            all_gather(full, mine, group=self.group)
            for p, _, off in self._layout:
                p.view(-1).copy_(full[off:off + p.numel()])
        return loss
