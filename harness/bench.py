"""Timing for performance graders (design.md, "Performance grading").

On CUDA, each timed call is bracketed by CUDA events and followed by a
device-wide synchronize, with a wall-clock cross-check (a call whose event time
is far below its wall time means the events missed work on another stream).
Before each call the cache is flushed by writing a buffer (twice the L2 size on
CUDA, ``CPU_FLUSH_BYTES`` on CPU), and the inputs come from a pool of fresh
tensors, so no call is served from a warm cache. Candidates are interleaved call
by call (A, B, A, B, ...; who goes first rotates every round), after >= 3 warm-up
calls on inputs outside the pool, and every timed output is checked again. Per
shape we keep the median of >= 10 repeats; across shapes we combine ratios by
geometric mean.

On CPU the loop measures the calling thread's CPU time per call (``time.thread_time``;
the wall time is kept too): on a shared, loaded CI machine the wall clock also counts
the time spent waiting for a core, which swings tenfold between runs, while CPU time
stays within tens of percent. The thread's clock, not the process's: a process with
``RLIMIT_CPU`` (the sandbox's worker) reads its process clock at scheduler-tick
granularity (4 ms). Timed CPU code runs with one intra-op thread
(``harness.sandbox.timing.timed``'s default), so all of torch's work happens in this
thread; work a submission moves to threads of its own is missed here but not in the
worker's CPU time read from /proc, which the trusted side cross-checks. CPU
thresholds are set with the remaining noise in mind (``labs.yaml``, ``*_cpu``).

:func:`run_interleaved` is the one timing loop. It runs wherever the timed code
lives: in the sandboxed worker for a submission (``harness.sandbox.probes.timing``'s
``timed`` probe, which imports this module before any submission is imported, so
the clocks below are bound before student code runs), or in-process.
:func:`time_interleaved` is the same loop for callables and checks living in the
caller's process (multi-rank bodies, the trusted side's own baselines). Graders
time student code through ``harness.sandbox.timing.timed``.
"""
from __future__ import annotations

import contextlib
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping, Sequence

import torch

WARMUP_MIN = 3
REPEATS_MIN = 10
CPU_FLUSH_BYTES = 4 << 20  # twice a CI machine's per-core L2 or more

# Bound at import, before any submission is imported (see the module docstring).
_perf_counter = time.perf_counter
_thread_time = time.thread_time
_cuda_synchronize = torch.cuda.synchronize
_cuda_event = torch.cuda.Event
_median = statistics.median


@dataclass
class Timing:
    """Seconds per call of one candidate on one shape: ``times_s`` per timed call (CUDA
    events on CUDA; on CPU the calling thread's CPU time, which does not count the time
    it waits for a core on a loaded machine), ``wall_s`` per timed call (wall clock),
    ``warmup_s`` per warm-up call (the wall clock on CUDA, CPU time on CPU)."""

    name: str
    times_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    warmup_s: list[float] = field(default_factory=list)
    warmup_wall_s: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return _median(self.times_s)

    @property
    def total_s(self) -> float:
        """Wall seconds of every call (warm-up and timed) of this candidate."""
        return math.fsum(self.wall_s) + math.fsum(self.warmup_wall_s)


def geomean(xs: Sequence[float]) -> float:
    """Geometric mean of positive numbers; ValueError on an empty or non-positive input."""
    xs = list(xs)
    if not xs or any(x <= 0 for x in xs):
        raise ValueError(f"geomean needs positive numbers, got {xs}")
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def flush_buffer(device: torch.device | str) -> torch.Tensor:
    """The buffer whose ``zero_()`` flushes the cache before a timed call: twice the
    L2 size on CUDA, ``CPU_FLUSH_BYTES`` on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 64 * 2**20
        return torch.empty(2 * l2, dtype=torch.uint8, device=device)
    return torch.empty(CPU_FLUSH_BYTES, dtype=torch.uint8, device=device)


def run_interleaved(
    candidates: Mapping[str, Callable[..., Any]],
    inputs: Sequence[Sequence] | Mapping[str, Sequence[Sequence]],
    warmup_inputs: Sequence[Sequence],
    *,
    device: torch.device | str = "cuda",
    repeats: int = REPEATS_MIN,
    kwargs: Mapping[str, Mapping] | None = None,
    guards: Mapping[str, Callable[[], ContextManager]] | None = None,
    on_output: Callable[[str, int, Any], None] | None = None,
    flush: bool = True,
) -> dict[str, Timing]:
    """The timing loop: every candidate on the same inputs, interleaved.

    Each candidate is called once per warm-up input (``len(warmup_inputs) >= 3``,
    inputs outside the pool), then ``repeats`` (>= 10) rounds: round ``r`` calls
    every candidate on ``inputs[r % len(inputs)]``, the first candidate of the
    round rotating. ``inputs`` may also map each name to its own pool (copies of
    the same values, so that one candidate's in-place writes never reach another).
    ``kwargs[name]``: keyword arguments of that candidate;
    ``guards[name]()``: a context entered around each of its calls (warm-up too),
    outside the clock (e.g. forbidden calls); ``on_output(name, i, out)`` runs
    after each timed call, outside the clock (checks, keeping outputs). Raises
    ValueError for too few warm-ups or repeats; on CUDA, RuntimeError when a
    candidate's event time is far below its wall time (work on another stream)."""
    pools = dict(inputs) if isinstance(inputs, Mapping) else {name: inputs for name in candidates}
    sizes = {len(pools.get(name, ())) for name in candidates}
    if len(warmup_inputs) < WARMUP_MIN or repeats < REPEATS_MIN or len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"need >= {WARMUP_MIN} warm-up inputs, repeats >= {REPEATS_MIN} and one non-empty pool "
                         f"size for every candidate, got {len(warmup_inputs)}, {repeats}, {sorted(sizes)}")
    size = sizes.pop()
    device = torch.device(device)
    cuda = device.type == "cuda"
    kwargs = kwargs or {}
    guards = guards or {}
    nothing = contextlib.nullcontext
    buf = flush_buffer(device) if flush else None
    timings = {name: Timing(name) for name in candidates}
    names = list(candidates)

    def call(name, args, timed):
        fn, kw = candidates[name], kwargs.get(name, {})
        with guards.get(name, nothing)():
            if buf is not None:
                buf.zero_()
            if cuda:
                _cuda_synchronize(device)
                start, end = _cuda_event(enable_timing=True), _cuda_event(enable_timing=True)
                w0 = _perf_counter()
                start.record()
                out = fn(*args, **kw)
                end.record()
                _cuda_synchronize(device)
                wall = _perf_counter() - w0
                t = start.elapsed_time(end) / 1e3
            else:
                w0, c0 = _perf_counter(), _thread_time()
                out = fn(*args, **kw)
                t, wall = _thread_time() - c0, _perf_counter() - w0
        if timed:
            timings[name].times_s.append(t)
            timings[name].wall_s.append(wall)
        else:
            timings[name].warmup_s.append(wall if cuda else t)
            timings[name].warmup_wall_s.append(wall)
        return out

    for w, args in enumerate(warmup_inputs):
        for name in names[w % len(names):] + names[: w % len(names)]:
            call(name, args, False)
    for r in range(repeats):
        i = r % size
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate who goes first
            out = call(name, pools[name][i], True)
            if on_output is not None:
                on_output(name, i, out)
    if cuda:
        for tm in timings.values():
            if _median(tm.wall_s) > 20 * tm.median_s + 1e-3:
                raise RuntimeError(f"{tm.name}: CUDA events measured {tm.median_s:.3g}s but wall clock "
                                   f"{_median(tm.wall_s):.3g}s; is work running on another stream?")
    return timings


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
    """Time callables of this process with :func:`run_interleaved`.

    ``make_inputs(i)`` returns the positional arguments for pool slot ``i``
    (slots ``>= pool`` are used for warm-up only); ``check(name, out, args)``
    raises if a timed output is wrong. Returns a ``Timing`` per candidate.
    Raises ValueError for ``warmup < 3`` or ``repeats < 10``. For student code use
    ``harness.sandbox.timing.timed`` (it runs this loop next to the code)."""
    if warmup < WARMUP_MIN or repeats < REPEATS_MIN:
        raise ValueError(f"need warmup >= {WARMUP_MIN} and repeats >= {REPEATS_MIN}, got {warmup}, {repeats}")
    inputs = [make_inputs(i) for i in range(pool)]
    warm = [make_inputs(pool + w) for w in range(warmup)]
    return run_interleaved(candidates, inputs, warm, device=device, repeats=repeats,
                           on_output=lambda name, i, out: check(name, out, inputs[i]))


def attention_flops(B: int, H: int, Lq: int, Lk: int, D: int, causal: bool) -> float:
    """Forward FLOPs of attention: two matmuls of 2*B*H*Lq*Lk*D each
    (QK^T and PV), halved for a square causal mask (FlashAttention-2 paper, sec. 4)."""
    flops = 4.0 * B * H * Lq * Lk * D
    return flops / 2 if causal and Lq == Lk else flops
