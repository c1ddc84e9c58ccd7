"""Lab 02 written another way, correct (issue "Graders that charge one deviation once", item V):
the optimizer state is two flat buffers of c = ceil(N/W) float32 elements (exp_avg, exp_avg_sq
for the owned range, in flat order) plus one Python int step count per parameter; the update is
written in the textbook form, m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t),
p -= lr * m_hat / (sqrt(v_hat) + eps), after the decoupled decay; the reduce-scatter and the
all-gather are the stub's helpers, the global norm one all_reduce of the shard's sum of squares
(float32). It must score the reference's marks."""
from __future__ import annotations

import torch
import torch.distributed as dist


def reduce_scatter(out, inp, group=None):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    fn(out, inp, op=dist.ReduceOp.SUM, group=group)


def all_gather(out, inp, group=None):
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp, group=group)


class ZeroAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 max_grad_norm=None, group=None):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {max_grad_norm}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.max_grad_norm, self.group = max_grad_norm, group
        W, rank = dist.get_world_size(group), dist.get_rank(group)
        self.entries = []  # (param, its group, flat offset)
        for g in self.param_groups:
            for p in g["params"]:
                if p.dtype != torch.float32:
                    raise TypeError(f"params must be float32, got {p.dtype}")
                self.entries.append((p, g, sum(q.numel() for q, _, _ in self.entries)))
        self.N = sum(p.numel() for p, _, _ in self.entries)
        self.W, self.c = W, -(-self.N // W)
        self.lo, self.hi = min(rank * self.c, self.N), min((rank + 1) * self.c, self.N)
        self.exp_avg = torch.zeros(self.c)       # flat element lo + i at index i
        self.exp_avg_sq = torch.zeros(self.c)
        self.steps = [0] * len(self.entries)     # per parameter, as torch.optim.AdamW's state["step"]
        self.grad_norm = None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        W, c = self.W, self.c
        grads = torch.zeros(W * c)
        seen = torch.zeros(max(len(self.entries), 1), dtype=torch.int32)
        for i, (p, _, off) in enumerate(self.entries):
            if p.grad is not None:
                grads[off:off + p.numel()] = p.grad.reshape(-1)
                seen[i] = 1
        shard = torch.zeros(c)
        if c:
            reduce_scatter(shard, grads, group=self.group)
        del grads
        shard /= W
        dist.all_reduce(seen, op=dist.ReduceOp.MAX, group=self.group)
        sq = shard.double().square().sum().float().reshape(1)
        dist.all_reduce(sq, group=self.group)
        self.grad_norm = sq.sqrt().reshape(())
        if self.max_grad_norm is not None:
            shard *= torch.clamp(self.max_grad_norm / (self.grad_norm + 1e-6), max=1.0)
        for i, (p, g, off) in enumerate(self.entries):
            a, b = max(self.lo, off), min(self.hi, off + p.numel())  # owned flat range of this param
            if a >= b or not seen[i]:
                continue
            self.steps[i] += 1
            t, (b1, b2) = self.steps[i], g["betas"]
            r = slice(a - self.lo, b - self.lo)
            gr, m, v = shard[r], self.exp_avg[r], self.exp_avg_sq[r]
            x = p.detach().view(-1)[a - off:b - off]
            x.mul_(1 - g["lr"] * g["weight_decay"])
            m.mul_(b1).add_(gr, alpha=1 - b1)
            v.mul_(b2).add_(gr * gr, alpha=1 - b2)
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            x.sub_(g["lr"] * m_hat / (v_hat.sqrt() + g["eps"]))
        if c:
            mine = torch.zeros(c)
            for p, _, off in self.entries:
                a, b = max(self.lo, off), min(self.hi, off + p.numel())
                if a < b:
                    mine[a - self.lo:b - self.lo] = p.detach().view(-1)[a - off:b - off]
            full = torch.empty(W * c)
            all_gather(full, mine, group=self.group)
            for p, _, off in self.entries:
                p.detach().view(-1).copy_(full[off:off + p.numel()])
        return loss


# graded as a variant (tests/variants/README.md)
MAY_FAIL = []
SELECT = "not W4"  # CI time: every test but the W=4 cases (all of them pass: `labs grade` gives the reference's marks)
