"""Lab 02 written another way, correct (issue "Graders that charge one deviation once", item V):
the DeepSpeed-style construction. Each rank hands the elements it owns to an inner
``torch.optim.AdamW`` (a public library's own update: torch's formula, its per-parameter step
count, its skipping of a parameter whose grad is None), as detached views of the parameters'
storage, one inner param group per outer group. Gradients are averaged with one all_reduce of
the whole flat gradient (not a reduce-scatter), the global norm is read from that full average,
and the owned elements come back with the list form of ``dist.all_gather``. The inner grads are
dropped after each step, so nothing full-size is kept. It must score the reference's marks."""
from __future__ import annotations

import torch
import torch.distributed as dist


class ZeroAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_grad_norm=None, group=None):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"bad hyper-parameters: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.max_grad_norm, self.group = max_grad_norm, group
        self.W, rank = dist.get_world_size(group), dist.get_rank(group)
        self.params = [p for g in self.param_groups for p in g["params"]]
        if any(p.dtype != torch.float32 for p in self.params):
            raise TypeError("params must be float32")
        self.N = sum(p.numel() for p in self.params)
        self.c = -(-self.N // self.W)
        lo, hi = min(rank * self.c, self.N), min((rank + 1) * self.c, self.N)
        self.lo = lo
        # (index of the param, flat offset of the owned slice, the owned slice as a detached view)
        self.shards, inner_groups, off, i = [], [], 0, 0
        for g in self.param_groups:
            mine = []
            for p in g["params"]:
                a, b = max(lo, off), min(hi, off + p.numel())
                if a < b:
                    view = p.detach().view(-1)[a - off:b - off]
                    self.shards.append((i, a, view))
                    mine.append(view)
                off, i = off + p.numel(), i + 1
            inner_groups.append({"params": mine, **{k: g[k] for k in ("lr", "betas", "eps", "weight_decay")}})
        self.used = [gi for gi, g in enumerate(inner_groups) if g["params"]]  # outer groups with owned elements
        self.inner = torch.optim.AdamW([inner_groups[gi] for gi in self.used]) if self.used else None
        self.grad_norm = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                          for p in self.params]) if self.params else torch.zeros(0)
        present = torch.tensor([p.grad is not None for p in self.params] or [False], dtype=torch.int32)
        dist.all_reduce(flat, group=self.group)                   # the sum over the group
        dist.all_reduce(present, op=dist.ReduceOp.MAX, group=self.group)
        flat /= self.W
        self.grad_norm = torch.linalg.vector_norm(flat.double()).float().reshape(())
        if self.max_grad_norm is not None:
            flat *= torch.clamp(self.max_grad_norm / (self.grad_norm + 1e-6), max=1.0)
        if self.inner is not None:
            for gi, inner in zip(self.used, self.inner.param_groups):  # a scheduler changes the outer groups
                inner.update({k: self.param_groups[gi][k] for k in ("lr", "betas", "eps", "weight_decay")})
            for i, a, view in self.shards:
                view.grad = flat[a:a + view.numel()] if present[i] else None
            self.inner.step()
            for _, _, view in self.shards:
                view.grad = None                                   # no reference to the full gradient kept
        if self.c:
            mine = torch.zeros(self.c)
            for _, a, view in self.shards:
                mine[a - self.lo:a - self.lo + view.numel()] = view
            parts = [torch.empty(self.c) for _ in range(self.W)]
            dist.all_gather(parts, mine, group=self.group)
            full = torch.cat(parts)
            off = 0
            for p in self.params:
                p.detach().view(-1).copy_(full[off:off + p.numel()])
                off += p.numel()
        return loss


# graded as a variant (tests/variants/README.md)
MAY_FAIL = []
SELECT = "not W4"  # CI time: every test but the W=4 cases (all of them pass: `labs grade` gives the reference's marks)
