"""Lab 16: performance modelling and scaling laws.

How big, how fast, how many GPUs: the arithmetic behind a training plan, as pure functions,
each checked against a measurement where one exists. Part A prices a GPT-style decoder
(parameters and FLOPs as FlopCounterMode counts them on the given decoder, MFU and HFU, ZeRO
model-state bytes, Korthikanti et al.'s activation bytes, a roofline); part B prices the
communication (units, alpha-beta costs of ring and tree collectives, their crossover, a
data-parallel step with bucketed overlap) and the failures (Young's checkpoint interval);
part C fits Chinchilla's scaling law by Approach 3 (Hoffmann et al. 2022) as replicated by
Besiroglu et al. 2024, on synthetic runs and on the published ones in ``data/``.

Units are SI base units throughout: bytes, seconds, FLOP (one multiply-add = 2 FLOP), FLOP/s,
bytes/s. Only ``parse_bytes`` reads units from text. Everything is a pure function of its
arguments: no global state, no randomness.

Parts (see README.md):
  A  param_count .. roofline: the cost of a decoder               pytest labs/16 -k cost
  B  parse_bytes .. expected_waste_fraction: comm and failures   pytest labs/16 -k comm
  C  chinchilla_loss .. compute_optimal: scaling laws             pytest labs/16 -k scaling
Run everything with `pytest labs/16`; self-grade with `labs grade . --lab 16`.

Given (finished): GPTConfig, build_model (TinyGPT), RooflinePoint, ScalingLaw, ScalingFit,
DEFAULT_INIT_GRID, load_chinchilla_runs. The counting functions of part A are formulas: the
graders make ``nn.Module.__init__`` raise while they run, on configs far too big to build.
"""
from __future__ import annotations

import csv
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

RECOMPUTE = ("none", "selective", "full")  # the recomputation policies (Korthikanti et al. 2022)


# --- Given: the decoder -------------------------------------------------------------------------

@dataclass(frozen=True)
class GPTConfig:
    """A GPT-style decoder's shape. ``n_kv_heads=None`` means multi-head attention
    (``kv_heads == n_heads``); fewer is grouped-query attention. ``gated_mlp``: SwiGLU's three
    matrices instead of GELU's two. ``tied_embeddings``: the LM head's weight is the token
    embedding's. ``bias``: every Linear and LayerNorm has a bias. ``learned_pos``: a learned
    position embedding of ``seq_len`` rows."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int
    seq_len: int
    n_kv_heads: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = True
    bias: bool = False
    learned_pos: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "seq_len", "n_kv_heads"):
            value = getattr(self, name)
            if value is None and name == "n_kv_heads":
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"GPTConfig.{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {value}")
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig.d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"GPTConfig.n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


class Attention(nn.Module):
    """Causal self-attention with ``kv_heads`` K/V heads, each repeated ``n_heads // kv_heads``
    times; the full ``L x L`` scores through two explicit matmuls (no SDPA)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d, H, Hkv, hd = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.n_heads, self.kv_heads, self.head_dim = H, Hkv, hd
        self.q = nn.Linear(d, H * hd, bias=cfg.bias)
        self.k = nn.Linear(d, Hkv * hd, bias=cfg.bias)
        self.v = nn.Linear(d, Hkv * hd, bias=cfg.bias)
        self.o = nn.Linear(H * hd, d, bias=cfg.bias)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(hd), -inf above the diagonal) @ v; all (B, H, L, hd)."""
        L = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)            # (B, H, L, L)
        above = torch.ones(L, L, dtype=torch.bool, device=q.device).triu(1)
        return torch.softmax(scores.masked_fill(above, float("-inf")), dim=-1) @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, _ = x.shape
        H, Hkv, hd = self.n_heads, self.kv_heads, self.head_dim
        q = self.q(x).view(B, L, H, hd).transpose(1, 2)                        # (B, H, L, hd)
        k = self.k(x).view(B, L, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        v = self.v(x).view(B, L, Hkv, hd).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
        y = self.core(q, k, v).transpose(1, 2).reshape(B, L, H * hd)
        return self.o(y)


class MLP(nn.Module):
    """``proj(gelu(fc x))`` (exact GELU), or with ``gated_mlp`` ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d, f = cfg.d_model, cfg.d_ff
        self.gated = cfg.gated_mlp
        if self.gated:
            self.w1, self.w3 = nn.Linear(d, f, bias=cfg.bias), nn.Linear(d, f, bias=cfg.bias)
            self.w2 = nn.Linear(f, d, bias=cfg.bias)
        else:
            self.fc, self.proj = nn.Linear(d, f, bias=cfg.bias), nn.Linear(f, d, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm: ``x + o(attn(ln1 x))``, then ``x + mlp(ln2 x)``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """The lab's decoder: token (+ learned position) embedding, ``n_layers`` blocks, a final
    LayerNorm and an LM head without bias whose weight is the token embedding's when tied."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.learned_pos else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx (B, L) int64, L <= seq_len -> logits (B, L, vocab_size)."""
        B, L = idx.shape
        if L > self.cfg.seq_len:
            raise ValueError(f"sequence length {L} exceeds seq_len={self.cfg.seq_len}")
        x = self.tok_emb(idx)                                                   # (B, L, d)
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(L, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_model(cfg: GPTConfig) -> TinyGPT:
    """The decoder of ``cfg`` (float32, on CPU, default initialisation)."""
    return TinyGPT(cfg)


# --- Given: records and data --------------------------------------------------------------------

class RooflinePoint(NamedTuple):
    """Where a kernel sits on the roofline: FLOP per byte, the attainable FLOP/s, the time (s)
    and ``"compute"`` or ``"memory"``."""
    intensity: float
    attainable_flops: float
    time: float
    bound: str


@dataclass(frozen=True)
class ScalingLaw:
    """``L(N, D) = E + A / N**alpha + B / D**beta`` (Hoffmann et al. 2022, eq. 2)."""
    E: float
    A: float
    B: float
    alpha: float
    beta: float


class ScalingFit(NamedTuple):
    """A fitted law, the objective at the minimiser, and the minimiser ``theta = (log A, log B,
    log E, alpha, beta)`` as a ``(5,)`` float64 tensor."""
    law: ScalingLaw
    objective: float
    theta: torch.Tensor


# 108 starts (a, b, e, alpha, beta), a subset of Hoffmann et al.'s grid
DEFAULT_INIT_GRID = tuple((float(a), float(b), float(e), float(alpha), float(beta)) for a, b, e, alpha, beta
                          in itertools.product((0, 10, 20), (0, 10, 20), (-1, 0, 1), (0.5, 1), (0.5, 1)))

DATA = Path(__file__).resolve().parent / "data" / "chinchilla_svg_extracted.csv"


def load_chinchilla_runs(path=None, exclude_highest: int = 5):
    """``(N, D, loss)``: float64 1-D tensors of the runs Besiroglu et al. (2024) extracted from
    Hoffmann et al.'s Figure 4 (``data/chinchilla_svg_extracted.csv``: model_size,
    training_flop, loss; 245 runs), with ``D = C / (6 N)`` as they derive it. The
    ``exclude_highest`` runs with the largest loss are dropped (``loss < sorted(loss)[-5]``),
    leaving 240, as in their main fit."""
    path = DATA if path is None else Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {path}: the runs ship as data/chinchilla_svg_extracted.csv next to "
                                f"{Path(__file__).name} (labs/16/data/; data/SOURCE.md says where to get it): "
                                "pass its path")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    N = torch.tensor([float(r["model_size"]) for r in rows], dtype=torch.float64)
    C = torch.tensor([float(r["training_flop"]) for r in rows], dtype=torch.float64)
    loss = torch.tensor([float(r["loss"]) for r in rows], dtype=torch.float64)
    D = C / (6 * N)
    if exclude_highest:
        keep = loss < torch.sort(loss).values[-exclude_highest]
        N, D, loss = N[keep], D[keep], loss[keep]
    return N, D, loss


# --- Part A: the cost of a decoder --------------------------------------------------------------

def param_count(cfg: GPTConfig) -> int:
    """``sum(p.numel() for p in build_model(cfg).parameters())`` (a tied weight once), for every
    flag combination, as a formula: never build the model or any ``nn.Module`` (the graders make
    ``nn.Module.__init__`` raise and pass GPT-3-sized configs). GPT-2 small: 124,439,808."""
    raise NotImplementedError("Part A: sum the parameter counts of the embedding, "
                              "the blocks, ln_f and (untied) head, as a formula")


def forward_flops_per_token(cfg: GPTConfig) -> int:
    """Matmul FLOPs of one forward per token of a ``seq_len``-token sequence, 2 per multiply-add:
    ``2 L (d H hd + 2 d Hkv hd + H hd d + m d d_ff) + 2 V d + 4 L seq_len H hd`` (m = 3 gated,
    else 2): q, k, v, o, the MLP, the LM head (tied or not) and both attention matmuls over
    the full ``seq_len x seq_len`` scores (the decoder computes the masked half too)."""
    raise NotImplementedError("Part A: 2 FLOP per multiply-add of q, k, v, "
                              "o, the MLP, the LM head and both attention matmuls")


def training_flops_per_token(cfg: GPTConfig, recompute: str = "none") -> int:
    """Training FLOPs per token with ``F = forward_flops_per_token(cfg)``: forward + backward
    (backward = 2 x forward) is ``3F``; ``"selective"`` (Korthikanti et al.) recomputes the attention
    core, ``3F + 4 L seq_len H hd``; ``"full"`` reruns every transformer layer's forward but not
    the LM head, ``3F + (F - 2 V d)`` (Narayanan et al. 2021, eq. 3). A closed form.
    Raises ValueError (naming ``recompute``) for another policy."""
    raise NotImplementedError("Part A: 3F, plus the recomputed FLOPs for 'selective' and 'full'")


def mfu(cfg: GPTConfig, tokens_per_second: float, peak_flops: float, n_gpus: int = 1,
        recompute: str = "none") -> float:
    """Model FLOPs utilisation (PaLM, appendix B): the model's training FLOPs without any
    recomputation, ``training_flops_per_token(cfg) * tokens_per_second / (peak_flops * n_gpus)``.
    ``tokens_per_second``: the whole job's; ``peak_flops``: one GPU's dense peak. ``recompute``
    is validated and has no effect. Raises ValueError for ``tokens_per_second < 0``,
    ``peak_flops <= 0``, ``n_gpus < 1`` or another ``recompute``; TypeError for a non-int
    ``n_gpus`` (each naming the argument)."""
    raise NotImplementedError("Part A: model FLOPs (no recomputation) x tokens/s over the job's peak")


def hfu(cfg: GPTConfig, tokens_per_second: float, peak_flops: float, n_gpus: int = 1,
        recompute: str = "none") -> float:
    """Hardware FLOPs utilisation: as :func:`mfu` with the FLOPs the hardware executes,
    ``training_flops_per_token(cfg, recompute)``. Raises as :func:`mfu`."""
    raise NotImplementedError("Part A: hardware FLOPs (with the recomputation) x tokens/s over the job's peak")


def zero_memory_bytes(n_params: int, world_size: int, stage: int, param_bytes: int = 2, grad_bytes: int = 2,
                      optimizer_bytes: int = 12) -> int:
    """Model-state bytes on one rank (Rajbhandari et al. 2020, sec. 5; mixed-precision Adam's
    K = 12: fp32 master weights, m and v). With ``S = ceil(n / W)``: stage 0 ``n (p + g + o)``,
    1 ``n (p + g) + S o``, 2 ``n p + S (g + o)``, 3 ``S (p + g + o)``. An int. Raises ValueError
    for a stage outside {0, 1, 2, 3}, ``world_size < 1`` or negative counts, TypeError for a
    non-int (each naming the argument)."""
    raise NotImplementedError("Part A: replicated and sharded (ceil(n / W)) model states per ZeRO stage")


def activation_bytes_per_layer(seq_len: int, micro_batch: int, d_model: int, n_heads: int, recompute: str = "none",
                               tensor_parallel: int = 1, sequence_parallel: bool = False) -> int:
    """Bytes one transformer layer keeps for backward on one rank (Korthikanti et al. 2022,
    Table 2: 16-bit activations, 1-byte dropout masks, a 4h MLP), ``s, b, h, a, t``:
    ``"none"`` ``sbh (10 + 24/t) + 5 a s^2 b / t`` (sequence parallel: ``34 sbh / t + 5 a s^2 b / t``),
    ``"selective"`` without the ``5 a s^2 b / t`` term, ``"full"`` ``2 sbh`` (SP: ``2 sbh / t``).
    An exact int. Raises ValueError (naming the argument) when ``d_model % n_heads``,
    ``n_heads % tensor_parallel``, a size < 1 or an unknown ``recompute``."""
    raise NotImplementedError("Part A: Korthikanti et al.'s Table 2, in integers")


def matmul_cost(m: int, n: int, k: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """``(flops, bytes)`` of ``C (m, n) = A (m, k) @ B (k, n)``: ``2mnk`` FLOP and
    ``dtype_bytes (mk + kn + mn)`` bytes (each operand read once, C written once). Sizes < 1:
    ValueError naming the argument."""
    raise NotImplementedError("Part A: 2mnk FLOP, each operand read once and C written once")


def elementwise_cost(numel: int, n_inputs: int = 1, n_outputs: int = 1, flops_per_element: int = 1,
                     dtype_bytes: int = 2) -> tuple[int, int]:
    """``(numel * flops_per_element, numel * (n_inputs + n_outputs) * dtype_bytes)``. Sizes < 1
    (``n_inputs`` and ``flops_per_element`` may be 0): ValueError naming the argument."""
    raise NotImplementedError("Part A: numel * flops_per_element FLOP, numel "
                              "* (inputs + outputs) * dtype_bytes bytes")


def roofline(flops: float, n_bytes: float, peak_flops: float, mem_bandwidth: float) -> RooflinePoint:
    """Williams et al. (2009): intensity ``flops / n_bytes``, attainable ``min(peak, intensity
    * bandwidth)``, time ``max(flops / peak, n_bytes / bandwidth)``; compute-bound iff
    ``flops / peak >= n_bytes / bandwidth`` (the ridge point itself is compute-bound). Raises
    ValueError (naming it) for ``flops < 0`` or a non-positive ``n_bytes``, ``peak_flops``,
    ``mem_bandwidth``."""
    raise NotImplementedError("Part A: intensity, attainable FLOP/s, time and bound of one kernel")


# --- Part B: communication and reliability ------------------------------------------------------


def parse_bytes(text: str) -> float:
    """Bytes (or bytes/s) in ``text``: ``"<number><space?><prefix><unit></s|ps>?"``. Prefixes:
    ``k``/``K``, ``M``, ``G``, ``T``, ``P`` (1000^n) and ``Ki``, ``Mi``, ``Gi``, ``Ti``, ``Pi``
    (1024^n); units ``B`` (byte) and ``b``/``bit``/``bits`` (1/8 byte). ``"80 GiB" ->
    85899345920.0``, ``"400 Gb/s" -> 5e10``. Anything else: ValueError; not a str: TypeError."""
    raise NotImplementedError("Part B: read '<number> <prefix><unit>[/s|ps]' into bytes")


def ring_allreduce_time(n_bytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """Reduce-scatter then all-gather around a ring: ``2 (W-1)`` steps of ``n / W`` bytes,
    ``2 (W-1) alpha + 2 (W-1)/W * n / bandwidth`` (nccl-tests' bus-bandwidth factor); 0 for
    W = 1. ValueError (naming it) for ``world_size < 1``, ``n_bytes < 0``, ``alpha < 0`` or
    ``bandwidth <= 0``, here and in every alpha-beta cost."""
    raise NotImplementedError("Part B: 2(W-1) alpha + 2(W-1)/W * n / bandwidth")


def ring_allgather_time(n_bytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """``(W-1) alpha + (W-1)/W * n / bandwidth``, ``n`` the gathered output's bytes."""
    raise NotImplementedError("Part B: (W-1) alpha + (W-1)/W * n / bandwidth")


def ring_reduce_scatter_time(n_bytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """``(W-1) alpha + (W-1)/W * n / bandwidth``, ``n`` the unreduced input's bytes."""
    raise NotImplementedError("Part B: (W-1) alpha + (W-1)/W * n / bandwidth")


def tree_allreduce_time(n_bytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """Binomial-tree reduce then broadcast, the whole buffer per step, no pipelining (Thakur
    et al. 2005): ``2 ceil(log2 W) (alpha + n / bandwidth)``."""
    raise NotImplementedError("Part B: 2 ceil(log2 W) (alpha + n / bandwidth)")


def allreduce_crossover_bytes(world_size: int, alpha: float, bandwidth: float) -> float:
    """The ``n`` where the tree and ring all-reduce times are equal,
    ``(W-1-c) alpha bandwidth / (c - (W-1)/W)`` with ``c = ceil(log2 W)``; the tree is faster
    below it. ``0.0`` for ``W <= 3`` (the tree is never faster)."""
    raise NotImplementedError("Part B: solve tree time = ring time for n (0.0 for W <= 3)")


def best_allreduce(n_bytes: float, world_size: int, alpha: float, bandwidth: float) -> str:
    """``"tree"`` iff its time is strictly smaller than the ring's, else ``"ring"``."""
    raise NotImplementedError("Part B: 'tree' iff its time is strictly smaller")


def dp_step_time(t_forward: float, t_backward: float, grad_bytes: float, world_size: int, alpha: float,
                 bandwidth: float, n_buckets: int = 1, overlap: bool = True) -> float:
    """One data-parallel step: ``K = n_buckets`` equal buckets; bucket ``i`` is ready at
    ``t_forward + t_backward (i+1)/K``; one ring all-reduce of ``grad_bytes / K`` at a time, in
    bucket order; with ``overlap`` a bucket starts when it is ready and the previous one has
    finished, without it all start after the backward. Returns when the last one ends
    (``t_forward + t_backward`` at W = 1). ValueError for negative times or ``n_buckets < 1``."""
    raise NotImplementedError("Part B: schedule K bucket all-reduces, one at a time, each after its bucket is ready")


def best_bucket_count(t_forward: float, t_backward: float, grad_bytes: float, world_size: int, alpha: float,
                      bandwidth: float, max_buckets: int) -> int:
    """The ``K`` in ``1..max_buckets`` minimising the overlapped :func:`dp_step_time`; times
    within a relative 1e-9 of the minimum are ties, won by the smallest ``K``. ValueError for
    ``max_buckets < 1``."""
    raise NotImplementedError("Part B: the K in 1..max_buckets with "
                              "the smallest overlapped step time (ties: smallest K)")


def young_daly_interval(checkpoint_time: float, node_mtbf: float, n_nodes: int = 1) -> float:
    """Young's (1974) first-order optimal checkpoint interval ``sqrt(2 C M)``, with the job's
    MTBF ``M = node_mtbf / n_nodes`` (independent exponential failures; any node stops the job).
    Not Daly's higher-order interval. ValueError for ``checkpoint_time <= 0``, ``node_mtbf <= 0``
    or ``n_nodes < 1``."""
    raise NotImplementedError("Part B: sqrt(2 C M) with the job's MTBF M = node_mtbf / n_nodes")


def expected_waste_fraction(interval: float, checkpoint_time: float, node_mtbf: float, n_nodes: int = 1,
                            restart_time: float = 0.0) -> float:
    """First-order waste ``C / tau + (tau / 2 + R) / M``: checkpoint overhead, half an interval
    of lost work and a restart per failure (``M = node_mtbf / n_nodes``); minimised at Young's
    interval, where it is ``sqrt(2 C / M) + R / M``. ValueError for ``interval <= 0``,
    ``restart_time < 0`` and as :func:`young_daly_interval`."""
    raise NotImplementedError("Part B: C / tau + (tau / 2 + R) / M")


# --- Part C: scaling laws -----------------------------------------------------------------------

def chinchilla_loss(N, D, law: ScalingLaw) -> torch.Tensor:
    """``E + A / N**alpha + B / D**beta`` as a float64 tensor, broadcasting ``N`` and ``D``
    (numbers or tensors)."""
    raise NotImplementedError("Part C: E + A / N**alpha + B / D**beta in float64")


def scaling_law_objective(theta: torch.Tensor, N, D, loss, delta: float = 1e-3) -> torch.Tensor:
    """``sum_i Huber_delta(LSE(a - alpha log N_i, b - beta log D_i, e) - log L_i)`` with ``theta =
    (a, b, e, alpha, beta) = (log A, log B, log E, alpha, beta)``: the **sum** of Huber losses of
    **log-loss** residuals, 0-dim float64, differentiable in ``theta``. Stable form: the LSE
    through ``torch.logsumexp`` (subtract the max), never ``log(exp + exp + exp)``.
    ``N, D, loss``: 1-D, one length, finite and > 0. Raises ValueError (naming it) for ``theta``
    of another shape or ``delta <= 0``."""
    raise NotImplementedError("Part C: the sum of Huber losses of log-loss residuals, LSE via torch.logsumexp")


def fit_scaling_law(N, D, loss, delta: float = 1e-3, init_grid=None) -> ScalingFit:
    """Chinchilla's Approach 3: from every start of ``init_grid`` (``None``: DEFAULT_INIT_GRID),
    minimise :func:`scaling_law_objective` in float64 with L-BFGS to convergence; keep the lowest
    objective (ties: the earlier start), skipping starts that end non-finite (all of them:
    RuntimeError). torch.optim.LBFGS's default ``tolerance_change=1e-9`` is absolute: at
    objective values near 1e-4 it stops early: use ``tolerance_grad=1e-10,
    tolerance_change=1e-14, max_iter=1000, line_search_fn="strong_wolfe"``.
    ``N, D, loss``: 1-D sequences or tensors of one length >= 1, finite and > 0; ``init_grid``:
    a ``(K, 5)`` tensor or K 5-sequences ``(a, b, e, alpha, beta)``, K >= 1. Returns
    ``ScalingFit(law, objective, theta)``: ``theta`` the (5,) float64 minimiser, ``objective`` the
    objective there (a float), ``law = ScalingLaw(E=exp(e), A=exp(a), B=exp(b), alpha, beta)``.
    Raises ValueError (naming the argument) for bad runs, ``delta <= 0`` or a grid not (K, 5)."""
    raise NotImplementedError("Part C: L-BFGS from every start in float64, keep the lowest objective")


def compute_optimal(C: float, law: ScalingLaw) -> tuple[float, float]:
    """The ``(N, D)`` minimising ``L(N, D)`` on ``6 N D = C`` (Hoffmann et al. 2022, eq. 4):
    ``G = (alpha A / (beta B))^(1/(alpha+beta))``, ``N = G (C/6)^(beta/(alpha+beta))``,
    ``D = (C/6)^(alpha/(alpha+beta)) / G``; ``6 N D = C``. ValueError (naming ``C``) for ``C <= 0``."""
    raise NotImplementedError("Part C: N_opt and D_opt on 6 N D = C (Hoffmann et al., eq. 4)")
