"""Lab 10: a Mixture-of-Experts layer and expert parallelism.

You build top-k routing with renormalised gates (Shazeer et al., "Outrageously Large Neural
Networks: The Sparsely-Gated Mixture-of-Experts Layer", 2017; Mixtral), the Switch
Transformer's load-balancing loss and expert capacity (Fedus et al., "Switch Transformers",
2021, eq. 4), a MoE layer that runs each expert once on the tokens routed to it, and expert
parallelism: the experts spread over the W ranks of a process group, tokens dispatched to
them and combined back with two all-to-alls (Lepikhin et al., "GShard", 2020).

Parts (see README.md)
  A  route, load_balancing_loss, capacity         pytest labs/10 -k part_a
  B  the MoE layer and its cost                   pytest labs/10 -k part_b
  C  ExpertParallelMoE over all-to-all            pytest labs/10 -k part_c

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

    ``logits (T, E)`` of any floating dtype and layout. ``probs = softmax(logits.float())``; the k
    largest per token, ties (equal float32 probabilities) to the lower expert index
    (``torch.topk`` does not guarantee it: on CPU ``topk(zeros(8), 2)`` is ``[6, 5]``; a
    ``torch.sort(probs, descending=True, stable=True)`` does); ``gates`` are those k
    probabilities renormalised to sum to 1 (differentiable in the logits). Raises ValueError
    unless ``1 <= k <= E``.
    """
    raise NotImplementedError("Part A: softmax in float32, stable descending sort, keep k, renormalise")


def load_balancing_loss(probs: torch.Tensor, expert_idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss ``E * sum_e f_e * P_e`` (eq. 4), 1.0 when balanced.

    ``probs (T, E)``: router probabilities; ``expert_idx (T, k)`` int64: the routed experts.
    ``f_e`` is the fraction of the T*k assignments sent to expert e (a count: no gradient),
    ``P_e`` the mean of ``probs[:, e]`` over the tokens (the gradient reaches ``probs`` through
    it). Returns a 0-dim tensor of ``probs.dtype``. Raises ValueError if ``num_experts !=
    probs.shape[1]``.
    """
    raise NotImplementedError("Part A: count the assignments per expert, then E * sum(f * probs.mean(0))")


def capacity(T: int, E: int, k: int, capacity_factor: float) -> int:
    """Assignments an expert keeps: ``math.ceil(capacity_factor * T * k / E)``, in Python floats,
    left to right. Raises ValueError unless ``capacity_factor > 0``."""
    raise NotImplementedError("Part A: the contract's formula, evaluated exactly as written")


def _assignments(expert_idx: torch.Tensor, E: int) -> torch.Tensor:
    """``(T, E)`` float32, 1 where token t is routed to expert e (a token picks k distinct experts)."""
    hot = torch.zeros(expert_idx.shape[0], E, dtype=torch.float32, device=expert_idx.device)
    return hot.scatter(1, expert_idx, 1.0)


def _positions(hot: torch.Tensor) -> torch.Tensor:
    """``(T, E)``: how many earlier tokens went to the same expert (token order; the slot is irrelevant)."""
    raise NotImplementedError("Part A: the place of each assignment in its expert's queue, in token order")


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
    on the rows kept for it (gather, expert, weighted scatter-add). In Part C an expert with no
    rows must still run (on an empty batch), so that every rank's autograd graph, and so its
    backward all-to-alls, have the same shape.
    """
    raise NotImplementedError("Part B: per expert: gather its rows, run it, scale by the gate, index_add")


class MoE(nn.Module):
    """A top-k Mixture-of-Experts layer over ``x (T, d_model)``: ``forward(x) -> (y, aux_loss)``.

    ``router: Linear(d_model, E, bias=False)``, ``experts``: an ``nn.ModuleList`` of E
    :class:`Expert` MLPs. ``y (T, d_model)`` in x's dtype (accumulated in float32, cast once) =
    ``sum_j gate_tj * experts[e_tj](x_t)`` over the kept assignments; ``aux_loss`` (0-dim float32)
    = ``load_balancing_loss(softmax(router(x).float()), expert_idx, E)`` over the routed
    assignments, before capacity drops. With ``capacity_factor`` an expert keeps its first
    ``capacity(T, E, k, capacity_factor)`` assignments in token order; a dropped assignment
    contributes 0 and the token's other gates are not renormalised. Each expert runs once, on
    the tokens routed to it: the forward's FLOPs grow with k, not with E. ``forward`` raises
    ValueError naming ``x`` (or ``d_model``) and its shape unless ``x`` is ``(T, d_model)``.
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
        raise NotImplementedError("Part B: check x's shape, route, aux loss, capacity mask, run the experts, "
                                  "cast once")


# --- Part C: expert parallelism ---

class ExpertParallelMoE(nn.Module):
    """:class:`MoE` with its experts spread over the W ranks of ``group``: rank r holds the router
    and global experts ``[r*n, (r+1)*n)`` only (n = E/W; ``experts[j]`` is global expert r*n + j).

    ``forward(x_r (T_r, d)) -> (y_r, aux_loss)`` equals MoE on ``torch.cat([x_0, ..., x_{W-1}])``
    (rank order): this rank's rows of y, and the union's aux loss on every rank; with
    ``capacity_factor``, capacity over the union (``capacity(sum_r T_r, E, k, cf)``) and drops in
    the union's token order. Tokens are dispatched to the experts' ranks and the results combined
    back with ``dist.all_to_all_single`` inside a ``torch.autograd.Function`` whose backward is the
    reverse all-to-all; every rank runs the backward. Only assignments to other ranks' experts
    travel (a token may travel once for several experts of one rank), plus small metadata
    (counts); at W = 1 nothing is sent. Gradients: ``router.weight.grad`` is this rank's share
    (through its own tokens: summed over the ranks it equals MoE's), the experts' are MoE's.
    """

    def __init__(self, router: nn.Linear, experts: nn.ModuleList, num_experts: int, k: int,
                 capacity_factor: float | None, group):
        super().__init__()
        self.router, self.experts = router, experts
        self.num_experts, self.k, self.capacity_factor, self.group = num_experts, k, capacity_factor, group

    @classmethod
    def from_moe(cls, moe: MoE, group=None) -> "ExpertParallelMoE":
        """Rank r's part of ``moe`` (W = ``dist.get_world_size(group)``, r = ``dist.get_rank(group)``):
        the router and experts ``[r*E/W, (r+1)*E/W)``. Raises ValueError if ``E % W != 0``."""
        raise NotImplementedError("Part C: check E % W, keep the router and this rank's experts (copies)")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError("Part C: route locally, all-gather the statistics, dispatch, run, combine")
