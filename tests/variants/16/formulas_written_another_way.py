"""A correct lab 16 written another way: param_count from a dictionary of modules, the FLOPs as PaLM's
2N + attention with N the matmul weights, ZeRO from which states each stage replicates, Korthikanti's table with
h / t and a / t taken first, a roofline that compares intensity with the ridge, a hand-written unit reader in
floats (no Decimal), collectives as alpha-beta steps, the tree's depth from math.ceil(math.log2(W)), the crossover
and best_allreduce from it, the DP step as a closed-form max over buckets, torch's huber_loss over a hand-written
stable LSE, L-BFGS written without a helper, eq. 4 in logs. Its messages say less than the reference's, naming
only the argument.
Proves (issue 32): the graders accept any algebraically equal order of operations, float arithmetic where the
contract compares floats, and another correct fit."""
from __future__ import annotations

MAY_FAIL = []

import csv
import itertools
import math
import re
from dataclasses import dataclass
from decimal import Decimal
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
    with open(DATA if path is None else path, newline="") as f:
        rows = list(csv.DictReader(f))
    N = torch.tensor([float(r["model_size"]) for r in rows], dtype=torch.float64)
    C = torch.tensor([float(r["training_flop"]) for r in rows], dtype=torch.float64)
    loss = torch.tensor([float(r["loss"]) for r in rows], dtype=torch.float64)
    D = C / (6 * N)
    if exclude_highest:
        keep = loss < torch.sort(loss).values[-exclude_highest]
        N, D, loss = N[keep], D[keep], loss[keep]
    return N, D, loss


# --- Part A, written another way: PaLM's "N" (the matmul weights), dictionaries of per-stage bytes ------

def _matmul_weights(cfg: GPTConfig) -> int:
    """N of 6N: the weights of every matmul one token meets (q, k, v, o, the MLP per layer; the head)."""
    d, hd, f = cfg.d_model, cfg.head_dim, cfg.d_ff
    per_layer = d * cfg.n_heads * hd + 2 * d * cfg.kv_heads * hd + cfg.n_heads * hd * d + (3 if cfg.gated_mlp else 2) * d * f
    return cfg.n_layers * per_layer + cfg.vocab_size * d


def param_count(cfg: GPTConfig) -> int:
    d, f, hd, b = cfg.d_model, cfg.d_ff, cfg.head_dim, int(cfg.bias)

    def linear(n_in, n_out):
        return n_in * n_out + b * n_out

    norm = d + b * d
    mlp = 2 * linear(d, f) + linear(f, d) if cfg.gated_mlp else linear(d, f) + linear(f, d)
    layer = 2 * norm + linear(d, cfg.n_heads * hd) + 2 * linear(d, cfg.kv_heads * hd) + linear(cfg.n_heads * hd, d) + mlp
    parts = {"tok_emb": cfg.vocab_size * d, "pos_emb": cfg.seq_len * d if cfg.learned_pos else 0,
             "blocks": cfg.n_layers * layer, "ln_f": norm, "lm_head": 0 if cfg.tied_embeddings else cfg.vocab_size * d}
    return sum(parts.values())


def _attention_core(cfg: GPTConfig) -> int:
    return 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * cfg.seq_len


def forward_flops_per_token(cfg: GPTConfig) -> int:
    return 2 * _matmul_weights(cfg) + _attention_core(cfg)          # PaLM's 6N + 12 L H Q T, forward third


def training_flops_per_token(cfg: GPTConfig, recompute: str = "none") -> int:
    if recompute not in {"none", "selective", "full"}:
        raise ValueError(f"unknown recompute policy {recompute!r}")
    F_ = forward_flops_per_token(cfg)
    again = {"none": 0, "selective": _attention_core(cfg), "full": F_ - 2 * cfg.vocab_size * cfg.d_model}
    return F_ + 2 * F_ + again[recompute]


def _utilisation(flops_per_token, tokens_per_second, peak_flops, n_gpus):
    if type(n_gpus) is not int:
        raise TypeError(f"n_gpus={n_gpus!r} is not an int")
    for name, bad in (("n_gpus", n_gpus < 1), ("tokens_per_second", tokens_per_second < 0),
                      ("peak_flops", peak_flops <= 0)):
        if bad:
            raise ValueError(f"{name} out of range")
    return flops_per_token * tokens_per_second / peak_flops / n_gpus


def mfu(cfg, tokens_per_second, peak_flops, n_gpus=1, recompute="none"):
    training_flops_per_token(cfg, recompute)                        # validates recompute, no effect
    return _utilisation(training_flops_per_token(cfg), tokens_per_second, peak_flops, n_gpus)


def hfu(cfg, tokens_per_second, peak_flops, n_gpus=1, recompute="none"):
    return _utilisation(training_flops_per_token(cfg, recompute), tokens_per_second, peak_flops, n_gpus)


_REPLICATED = {0: "pgo", 1: "pg", 2: "p", 3: ""}                    # the states every rank keeps whole


def zero_memory_bytes(n_params, world_size, stage, param_bytes=2, grad_bytes=2, optimizer_bytes=12):
    for name, v in (("n_params", n_params), ("world_size", world_size), ("stage", stage),
                    ("param_bytes", param_bytes), ("grad_bytes", grad_bytes), ("optimizer_bytes", optimizer_bytes)):
        if type(v) is not int:
            raise TypeError(f"{name} must be an int")
        if v < (1 if name == "world_size" else 0):
            raise ValueError(f"{name}={v} out of range")
    if stage not in _REPLICATED:
        raise ValueError(f"stage={stage} is not 0..3")
    size = {"p": param_bytes, "g": grad_bytes, "o": optimizer_bytes}
    shard = (n_params + world_size - 1) // world_size
    return sum(size[k] * (n_params if k in _REPLICATED[stage] else shard) for k in "pgo")


def activation_bytes_per_layer(seq_len, micro_batch, d_model, n_heads, recompute="none", tensor_parallel=1,
                               sequence_parallel=False):
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute={recompute!r}")
    for name, v in (("seq_len", seq_len), ("micro_batch", micro_batch), ("d_model", d_model), ("n_heads", n_heads),
                    ("tensor_parallel", tensor_parallel)):
        if v < 1:
            raise ValueError(f"{name} < 1")
    if d_model % n_heads:
        raise ValueError("d_model must be a multiple of n_heads")
    if n_heads % tensor_parallel:
        raise ValueError("n_heads must be a multiple of tensor_parallel")
    sb, h_t, a_t = seq_len * micro_batch, d_model // tensor_parallel, n_heads // tensor_parallel
    if recompute == "full":
        return 2 * sb * (h_t if sequence_parallel else d_model)
    kept = sb * 34 * h_t if sequence_parallel else sb * (10 * d_model + 24 * h_t)
    return kept + (5 * a_t * seq_len * sb if recompute == "none" else 0)


def matmul_cost(m, n, k, dtype_bytes=2):
    for name, v in (("m", m), ("n", n), ("k", k), ("dtype_bytes", dtype_bytes)):
        if v < 1:
            raise ValueError(f"{name}={v} < 1")
    return 2 * m * n * k, dtype_bytes * m * k + dtype_bytes * k * n + dtype_bytes * m * n


def elementwise_cost(numel, n_inputs=1, n_outputs=1, flops_per_element=1, dtype_bytes=2):
    for name, v, low in (("numel", numel, 1), ("n_inputs", n_inputs, 0), ("n_outputs", n_outputs, 1),
                         ("flops_per_element", flops_per_element, 0), ("dtype_bytes", dtype_bytes, 1)):
        if v < low:
            raise ValueError(f"{name}={v} out of range")
    return flops_per_element * numel, dtype_bytes * numel * (n_inputs + n_outputs)


def roofline(flops, n_bytes, peak_flops, mem_bandwidth):
    for name, v, ok in (("flops", flops, flops >= 0), ("n_bytes", n_bytes, n_bytes > 0),
                        ("peak_flops", peak_flops, peak_flops > 0), ("mem_bandwidth", mem_bandwidth, mem_bandwidth > 0)):
        if not ok:
            raise ValueError(f"{name}={v} out of range")
    intensity, ridge = flops / n_bytes, peak_flops / mem_bandwidth
    compute = intensity >= ridge
    return RooflinePoint(intensity, peak_flops if compute else intensity * mem_bandwidth,
                         flops / peak_flops if compute else n_bytes / mem_bandwidth, "compute" if compute else "memory")


# --- Part B, written another way: a hand-written reader, collectives as steps, closed-form schedules ---

_MULT = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
         "Ki": 1024.0, "Mi": 1024.0**2, "Gi": 1024.0**3, "Ti": 1024.0**4, "Pi": 1024.0**5}


def parse_bytes(text):
    if not isinstance(text, str):
        raise TypeError("parse_bytes takes a str")
    m = re.match(r"([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?) ?(.*)$", text.strip())
    if m is None:
        raise ValueError(f"no number in {text!r}")
    rest = m.group(2)
    for suffix in ("/s", "ps"):
        if rest.endswith(suffix):
            rest = rest[:-len(suffix)]
            break
    for unit, size in (("bits", 0.125), ("bit", 0.125), ("b", 0.125), ("B", 1.0)):
        if rest.endswith(unit) and rest[:-len(unit)] in _MULT:
            return float(m.group(1)) * _MULT[rest[:-len(unit)]] * size
    raise ValueError(f"no unit in {text!r}")


def _check(n_bytes, world_size, alpha, bandwidth):
    for name, bad in (("world_size", world_size < 1), ("n_bytes", n_bytes < 0), ("alpha", alpha < 0),
                      ("bandwidth", bandwidth <= 0)):
        if bad:
            raise ValueError(f"{name} out of range")


def _steps(steps, chunk, alpha, bandwidth):
    return steps * (alpha + chunk / bandwidth)


def ring_allreduce_time(n_bytes, world_size, alpha, bandwidth):
    _check(n_bytes, world_size, alpha, bandwidth)
    return _steps(2 * (world_size - 1), n_bytes / world_size, alpha, bandwidth)


def ring_allgather_time(n_bytes, world_size, alpha, bandwidth):
    _check(n_bytes, world_size, alpha, bandwidth)
    return _steps(world_size - 1, n_bytes / world_size, alpha, bandwidth)


def ring_reduce_scatter_time(n_bytes, world_size, alpha, bandwidth):
    return ring_allgather_time(n_bytes, world_size, alpha, bandwidth)


def tree_allreduce_time(n_bytes, world_size, alpha, bandwidth):
    _check(n_bytes, world_size, alpha, bandwidth)
    return _steps(2 * math.ceil(math.log2(world_size)), n_bytes, alpha, bandwidth)


def allreduce_crossover_bytes(world_size, alpha, bandwidth):
    _check(0, world_size, alpha, bandwidth)
    if world_size <= 3:
        return 0.0
    c = math.ceil(math.log2(world_size))
    return (world_size - 1 - c) * alpha / ((c - (world_size - 1) / world_size) / bandwidth)


def best_allreduce(n_bytes, world_size, alpha, bandwidth):
    _check(n_bytes, world_size, alpha, bandwidth)
    return "tree" if n_bytes < allreduce_crossover_bytes(world_size, alpha, bandwidth) else "ring"


def dp_step_time(t_forward, t_backward, grad_bytes, world_size, alpha, bandwidth, n_buckets=1, overlap=True):
    for name, bad in (("t_forward", t_forward < 0), ("t_backward", t_backward < 0), ("n_buckets", n_buckets < 1)):
        if bad:
            raise ValueError(f"{name} out of range")
    K = n_buckets
    comm = ring_allreduce_time(grad_bytes / K, world_size, alpha, bandwidth)
    if not overlap:
        return t_forward + t_backward + K * comm
    # the chain of one-at-a-time all-reduces ends at the latest (bucket i ready) + (K - i) all-reduces
    return max(t_forward + t_backward * (i + 1) / K + (K - i) * comm for i in range(K))


def best_bucket_count(t_forward, t_backward, grad_bytes, world_size, alpha, bandwidth, max_buckets):
    if max_buckets < 1:
        raise ValueError("max_buckets < 1")
    times = {K: dp_step_time(t_forward, t_backward, grad_bytes, world_size, alpha, bandwidth, K)
             for K in range(1, max_buckets + 1)}
    floor = min(times.values()) * (1 + 1e-9)
    return min(K for K, t in times.items() if t <= floor)


def young_daly_interval(checkpoint_time, node_mtbf, n_nodes=1):
    for name, bad in (("checkpoint_time", checkpoint_time <= 0), ("node_mtbf", node_mtbf <= 0), ("n_nodes", n_nodes < 1)):
        if bad:
            raise ValueError(f"{name} out of range")
    return math.sqrt(2 * checkpoint_time * (node_mtbf / n_nodes))


def expected_waste_fraction(interval, checkpoint_time, node_mtbf, n_nodes=1, restart_time=0.0):
    young_daly_interval(checkpoint_time, node_mtbf, n_nodes)        # validates them
    for name, bad in (("interval", interval <= 0), ("restart_time", restart_time < 0)):
        if bad:
            raise ValueError(f"{name} out of range")
    job_mtbf = node_mtbf / n_nodes
    return checkpoint_time / interval + (interval + 2 * restart_time) / (2 * job_mtbf)


# --- Part C, written another way: torch's Huber loss, a hand-written stable LSE, eq. 4 in logs ---

def chinchilla_loss(N, D, law):
    N, D = torch.as_tensor(N, dtype=torch.float64), torch.as_tensor(D, dtype=torch.float64)
    return law.E + law.A * N.pow(-law.alpha) + law.B * D.pow(-law.beta)


def _as_runs(*runs):
    out = [torch.tensor(x, dtype=torch.float64) if not isinstance(x, torch.Tensor) else x.to(torch.float64)
           for x in runs]
    for name, t in zip(("N", "D", "loss"), out):
        if t.ndim != 1 or len(t) == 0 or not torch.isfinite(t).all() or (t <= 0).any():
            raise ValueError(f"{name}: runs must be 1-D, non-empty, finite and > 0")
    if len({len(t) for t in out}) != 1:
        raise ValueError("N, D and loss differ in length (D and loss must match N)")
    return out


def _huber_objective(theta, logN, logD, logL, delta):
    a, b, e, alpha, beta = theta[0], theta[1], theta[2], theta[3], theta[4]
    terms = torch.stack([a - alpha * logN, b - beta * logD, e.expand_as(logN)])
    top = terms.detach().amax(dim=0)            # the shift is a constant: no graph (max with indices on
    # a graph-carrying float64 tensor cost 10 ms a call here, 15x the whole objective: 30 s fits in CI)
    pred = top + (terms - top).exp().sum(dim=0).log()
    return F.huber_loss(pred, logL, reduction="sum", delta=delta)


def scaling_law_objective(theta, N, D, loss, delta=1e-3):
    if not (isinstance(theta, torch.Tensor) and theta.shape == (5,)):
        raise ValueError("theta must have shape (5,)")
    if delta <= 0:
        raise ValueError(f"delta={delta} must be > 0")
    N, D, loss = _as_runs(N, D, loss)
    return _huber_objective(theta.double(), N.log(), D.log(), loss.log(), delta)


def fit_scaling_law(N, D, loss, delta=1e-3, init_grid=None):
    N, D, loss = _as_runs(N, D, loss)
    if delta <= 0:
        raise ValueError(f"delta={delta} must be > 0")
    starts = torch.tensor(DEFAULT_INIT_GRID if init_grid is None else
                          [list(map(float, s)) for s in init_grid], dtype=torch.float64) \
        if not isinstance(init_grid, torch.Tensor) else init_grid.to(torch.float64)
    if starts.ndim != 2 or starts.shape[1] != 5 or len(starts) == 0:
        raise ValueError("init_grid must be (K, 5), K >= 1")
    logs = (N.log(), D.log(), loss.log())
    fits = []
    for start in starts:
        theta = start.clone().requires_grad_(True)
        if not torch.isfinite(_huber_objective(theta.detach(), *logs, delta)):
            continue
        lbfgs = torch.optim.LBFGS([theta], max_iter=1000, tolerance_grad=1e-10, tolerance_change=1e-14,
                                  line_search_fn="strong_wolfe")

        def closure():
            lbfgs.zero_grad()
            value = _huber_objective(theta, *logs, delta)
            value.backward()
            return value
        lbfgs.step(closure)
        value = _huber_objective(theta.detach(), *logs, delta).item()
        if math.isfinite(value) and torch.isfinite(theta).all():
            fits.append((value, len(fits), theta.detach()))
    if not fits:
        raise RuntimeError("no start ended finite")
    value, _, theta = min(fits, key=lambda f: (f[0], f[1]))
    a, b, e, alpha, beta = theta.tolist()
    return ScalingFit(ScalingLaw(math.exp(e), math.exp(a), math.exp(b), alpha, beta), value, theta)


def compute_optimal(C, law):
    if C <= 0:
        raise ValueError(f"C={C} must be > 0 (a compute budget)")
    s = law.alpha + law.beta
    log_G = (math.log(law.alpha * law.A) - math.log(law.beta * law.B)) / s
    N = math.exp(log_G + law.beta / s * math.log(C / 6))
    return N, C / (6 * N)
