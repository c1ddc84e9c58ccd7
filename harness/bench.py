"""Timing for performance graders (design.md, "Performance grading").

On CUDA, each timed call is bracketed by CUDA events and followed by a
device-wide synchronize, with a wall-clock cross-check (a call whose event time
is far below its wall time means the events missed work on another stream).
Before each call the L2 cache is flushed by writing a buffer of twice its size,
and the inputs come from a pool of fresh tensors, so no call is served from a
warm cache. Candidates are interleaved call by call (A, B, A, B, ...), after
>= 3 warm-up calls on inputs outside the pool, and every timed output is
checked again. Per shape we keep the median of >= 10 repeats; across shapes
we combine ratios by geometric mean.

On CPU the same loop runs with ``time.perf_counter``; figures are
informational (CI machines are shared and noisy) and never graded.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

WARMUP_MIN = 3
REPEATS_MIN = 10


@dataclass
class Timing:
    """Seconds per call of one candidate on one shape."""

    name: str
    times_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of positive numbers; ValueError on an empty or non-positive input."""
    xs = list(xs)
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geomean needs positive numbers, got {xs}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _l2_flush_buffer(device: torch.device) -> torch.Tensor | None:
    if device.type != "cuda":
        return None
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
    return torch.empty(2 * l2, dtype=torch.uint8, device=device)


def time_interleaved(
    candidates: Mapping[str, Callable[..., Any]],
    make_inputs: Callable[[int], tuple],
    check: Callable[[str, Any, tuple], None],
    *,
    device: torch.device | str = "cuda",
    pool: int = 4,
    warmup: int = WARMUP_MIN,
    repeats: int = REPEATS_MIN,
) -> dict[str, Timing]:
    """Time each candidate on the same inputs, interleaved.

    ``make_inputs(i)`` returns the positional arguments for pool slot ``i``
    (slots ``>= pool`` are used for warm-up only); ``check(name, out, args)``
    raises if a timed output is wrong. Returns a ``Timing`` per candidate.
    Raises ValueError for ``warmup < 3`` or ``repeats < 10``.
    """
    if warmup < WARMUP_MIN or repeats < REPEATS_MIN:
        raise ValueError(f"need warmup >= {WARMUP_MIN} and repeats >= {REPEATS_MIN}, got {warmup}, {repeats}")
    device = torch.device(device)
    cuda = device.type == "cuda"
    inputs = [make_inputs(i) for i in range(pool)]
    for w in range(warmup):
        args = make_inputs(pool + w)
        for fn in candidates.values():
            fn(*args)
    flush = _l2_flush_buffer(device)
    timings = {name: Timing(name) for name in candidates}
    names = list(candidates)
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for name in order:
            args = inputs[r % pool]
            if cuda:
                flush.zero_()
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                w0 = time.perf_counter()
                start.record()
                out = candidates[name](*args)
                end.record()
                torch.cuda.synchronize(device)
                wall = time.perf_counter() - w0
                t = start.elapsed_time(end) / 1e3
            else:
                w0 = time.perf_counter()
                out = candidates[name](*args)
                t = wall = time.perf_counter() - w0
            check(name, out, args)
            timings[name].times_s.append(t)
            timings[name].wall_s.append(wall)
    if cuda:
        for tm in timings.values():
            if statistics.median(tm.wall_s) > 20 * tm.median_s + 1e-3:
                raise RuntimeError(f"{tm.name}: CUDA events measured {tm.median_s:.3g}s but wall clock "
                                   f"{statistics.median(tm.wall_s):.3g}s; is work running on another stream?")
    return timings


def attention_flops(B: int, H: int, Lq: int, Lk: int, D: int, causal: bool) -> float:
    """Forward FLOPs of attention: two matmuls of 2*B*H*Lq*Lk*D each
    (QK^T and PV), halved for a square causal mask (FlashAttention-2 paper, sec. 4)."""
    flops = 4.0 * B * H * Lq * Lk * D
    return flops / 2 if causal and Lq == Lk else flops
