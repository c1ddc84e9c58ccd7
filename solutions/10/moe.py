"""Lab 10 reference: a Mixture-of-Experts layer and expert parallelism.

Shazeer et al., "Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts
Layer", 2017 (top-k gating); Fedus et al., "Switch Transformers", 2021 (the load-balancing
loss, eq. 4, and expert capacity); Jiang et al., "Mixtral of Experts", 2024 (top-2 routing
over SwiGLU experts, gates renormalised over the k chosen). Lepikhin et al., "GShard", 2020,
sec. 2.2 and 3.2: experts spread over devices, tokens dispatched and combined with two
all-to-alls.

Shape legend: T tokens (callers flatten batch and sequence), d = d_model, F = d_ff, E experts,
k experts per token, W ranks of ``group``, r this rank, n = E / W experts per rank, T_r the
tokens of rank r.
"""
from __future__ import annotations

import copy
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


# --- Part A: routing, the load-balancing loss, capacity ---

def route(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing: ``(expert_idx (T, k) int64, gates (T, k) float32)``, in descending gate order.

    ``probs = softmax(logits.float())``; the k largest per token, ties to the lower expert index
    (a stable descending sort; ``torch.topk`` gives no such guarantee); ``gates`` are those
    probabilities renormalised to sum to 1 over the k. ValueError unless ``logits`` is 2-D and
    ``1 <= k <= E``.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (T, E), got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if not 1 <= k <= E:
        raise ValueError(f"k={k} must be between 1 and the number of experts E={E}")
    probs = torch.softmax(logits.float(), dim=-1)
    top, idx = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, idx = top[:, :k], idx[:, :k]
    return idx, top / top.sum(dim=-1, keepdim=True)


def load_balancing_loss(probs: torch.Tensor, expert_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_e f_e * P_e`` (eq. 4), 1.0 when balanced.

    ``probs (T, E)``: router probabilities; ``expert_idx (T, k)`` int64: the routed experts;
    ``f_e``: the fraction of the T*k assignments sent to expert e (not differentiable); ``P_e``:
    the mean probability of e over the tokens (the gradient reaches ``probs`` through it).
    Returns a 0-dim tensor of ``probs.dtype``. ValueError if ``num_experts != probs.shape[1]``.
    """
    if probs.dim() != 2 or probs.shape[1] != num_experts:
        raise ValueError(f"num_experts={num_experts} does not match probs of shape {tuple(probs.shape)}")
    flat = expert_idx.reshape(-1)
    counts = torch.zeros(num_experts, dtype=probs.dtype, device=probs.device)
    counts = counts.index_add(0, flat, torch.ones(flat.numel(), dtype=probs.dtype, device=probs.device))
    f = counts / max(flat.numel(), 1)
    return num_experts * (f * probs.mean(dim=0)).sum()


def capacity(T: int, E: int, k: int, capacity_factor: float) -> int:
    """Tokens an expert keeps: ``ceil(capacity_factor * T * k / E)`` in Python floats, left to right.
    ValueError unless ``capacity_factor > 0``."""
    if capacity_factor is None or not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
    return math.ceil(capacity_factor * T * k / E)


def _assignments(expert_idx: torch.Tensor, E: int) -> torch.Tensor:
    """``(T, E)`` float32, 1 where token t is routed to expert e (a token picks k distinct experts)."""
    hot = torch.zeros(expert_idx.shape[0], E, dtype=torch.float32, device=expert_idx.device)
    return hot.scatter(1, expert_idx, 1.0)


def _positions(hot: torch.Tensor) -> torch.Tensor:
    """``(T, E)``: how many earlier tokens went to the same expert (token order; the slot is irrelevant)."""
    return hot.cumsum(dim=0) - hot


# --- Part B: the MoE layer ---

class Expert(nn.Module):
    """A SwiGLU MLP: ``w2(silu(w1(x)) * w3(x))``, no biases (Shazeer, "GLU Variants", 2020)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _run_experts(experts, x: torch.Tensor, table: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``(R, d)`` float32: ``sum_j table[:, j] * experts[j](x)`` over the kept entries only.

    ``x (R, d)``, ``table (R, n)`` float32 gates, ``keep (R, n)`` bool. Each expert runs once,
    on the rows kept for it (gather, expert, weighted scatter-add); an expert with no rows still
    runs on an empty batch, so every rank's autograd graph has the same shape.
    """
    y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for j, expert in enumerate(experts):
        rows = keep[:, j].nonzero().squeeze(1)
        out = expert(x[rows]).float() * table[rows, j].unsqueeze(1)
        y = y.index_add(0, rows, out)
    return y


class MoE(nn.Module):
    """A top-k Mixture-of-Experts layer over ``x (T, d_model)``: ``forward(x) -> (y, aux_loss)``.

    ``router: Linear(d_model, E, bias=False)``, ``experts``: E SwiGLU :class:`Expert` MLPs.
    ``y (T, d_model)`` in x's dtype (accumulated in float32, cast once) = ``sum_j gate_tj *
    experts[e_tj](x_t)`` over the kept assignments; ``aux_loss`` (0-dim float32) =
    :func:`load_balancing_loss` of the routed assignments before capacity drops. With
    ``capacity_factor`` an expert keeps its first :func:`capacity` assignments in token order.
    ValueError unless ``x`` is ``(T, d_model)``.
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, k: int = 2, capacity_factor: float | None = None):
        super().__init__()
        if not 1 <= k <= num_experts:
            raise ValueError(f"k={k} must be between 1 and num_experts={num_experts}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None, got {capacity_factor}")
        self.num_experts, self.k, self.capacity_factor = num_experts, k, capacity_factor
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.router.in_features
        if x.dim() != 2 or x.shape[1] != d:
            raise ValueError(f"x must be (T, d_model={d}), got shape {tuple(x.shape)}")
        T, E = x.shape[0], self.num_experts
        logits = self.router(x)                                         # (T, E)
        idx, gates = route(logits, self.k)                              # (T, k) each
        aux = load_balancing_loss(torch.softmax(logits.float(), dim=-1), idx, E)
        hot = _assignments(idx, E)                                      # (T, E)
        keep = hot.bool()
        if self.capacity_factor is not None:
            keep = keep & (_positions(hot) < capacity(T, E, self.k, self.capacity_factor))
        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T, E) kept gates
        return _run_experts(self.experts, x, table, keep).to(x.dtype), aux


# --- Part C: expert parallelism ---

def _all_to_all(x: torch.Tensor, send: list, recv: list, group) -> torch.Tensor:
    """Rows of ``x`` in blocks: ``send[s]`` rows to rank s; ``recv[s]`` rows come from rank s."""
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """:func:`_all_to_all` with autograd: the backward is the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        return _all_to_all(x, send, recv, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.recv, ctx.send, ctx.group), None, None, None


class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with its experts spread over the W ranks of ``group``: rank r holds the router
    and global experts ``[r*n, (r+1)*n)`` (n = E/W; ``experts[j]`` is global expert r*n + j).

    ``forward(x_r (T_r, d)) -> (y_r, aux_loss)`` equals MoE on the ranks' tokens concatenated in
    rank order: its rows of y, and the union's aux loss on every rank. A token travels to a rank
    at most once, however many of that rank's experts it is routed to, with its gates for them;
    the rank runs each of its experts once and sends the gated sum back (two all-to-alls of
    token rows, inside :class:`_AllToAll`). Gradients: this rank's share of the router's, the
    full one of this rank's experts.
    """

    def __init__(self, router: nn.Linear, experts: nn.ModuleList, num_experts: int, k: int,
                 capacity_factor: float | None, group):
        super().__init__()
        self.router, self.experts = router, experts
        self.num_experts, self.k, self.capacity_factor, self.group = num_experts, k, capacity_factor, group

    @classmethod
    def from_moe(cls, moe: MoE, group=None) -> "ExpertParallelMoE":
        W, r = dist.get_world_size(group), dist.get_rank(group)
        E = len(moe.experts)
        if E % W:
            raise ValueError(f"num_experts={E} is not divisible by the group's size W={W}")
        n = E // W
        experts = nn.ModuleList(copy.deepcopy(moe.experts[j]) for j in range(r * n, (r + 1) * n))
        return cls(copy.deepcopy(moe.router), experts, E, moe.k, moe.capacity_factor, group)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        group, E, k = self.group, self.num_experts, self.k
        W, r = dist.get_world_size(group), dist.get_rank(group)
        T_r, n = x.shape[0], E // W
        logits = self.router(x)                                         # (T_r, E)
        probs = torch.softmax(logits.float(), dim=-1)
        idx, gates = route(logits, k)
        hot = _assignments(idx, E)                                      # (T_r, E)

        # The union's statistics in one all-gather: [T_r, assignments per expert, probability sums]
        mine = torch.cat([hot.new_tensor([T_r]), hot.sum(0), probs.detach().sum(0)])  # (1 + 2E,)
        every = torch.stack(_all_gather(mine, group)) if W > 1 else mine[None]        # (W, 1 + 2E)
        T_all = int(every[:, 0].sum().item())
        f = every[:, 1:1 + E].sum(0) / (T_all * k)
        others = torch.cat([every[:r], every[r + 1:]])[:, 1 + E:].sum(0)
        aux = E * (f * (probs.sum(0) + others) / T_all).sum()           # this rank's tokens carry the gradient

        keep = hot.bool()
        if self.capacity_factor is not None:  # the union's token order: earlier ranks' tokens first
            before = every[:r, 1:1 + E].sum(0)
            keep = keep & (before + _positions(hot) < capacity(T_all, E, k, self.capacity_factor))
        table = torch.zeros_like(hot).scatter(1, idx, gates) * keep     # (T_r, E) kept gates

        to_rank = keep.view(T_r, W, n).any(dim=-1)                      # (T_r, W): token t goes to rank s
        dest, tok = to_rank.t().nonzero(as_tuple=True)                  # by destination rank, then token
        rows_gates = table.view(T_r, W, n)[tok, dest]                   # (rows, n)
        if W == 1:
            out = _run_experts(self.experts, x[tok], rows_gates, rows_gates > 0)
        else:
            send = torch.bincount(dest, minlength=W).tolist()
            recv = _exchange_counts(send, group, x.device)
            x_in = _AllToAll.apply(x[tok], send, recv, group)               # (R, d)
            g_in = _AllToAll.apply(rows_gates, send, recv, group)           # (R, n)
            # a kept gate is > 0 (a probability that underflowed to 0 contributes nothing either way)
            out = _AllToAll.apply(_run_experts(self.experts, x_in, g_in, g_in > 0), recv, send, group)
        y = torch.zeros(T_r, x.shape[1], dtype=torch.float32, device=x.device).index_add(0, tok, out)
        return y.to(x.dtype), aux


def _all_gather(t: torch.Tensor, group) -> list:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return parts


def _exchange_counts(send: list, group, device) -> list:
    """Rows this rank will receive from each rank, given the rows it sends to each."""
    recv = torch.empty(len(send), dtype=torch.int64, device=device)
    dist.all_to_all_single(recv, torch.tensor(send, dtype=torch.int64, device=device), group=group)
    return recv.tolist()
