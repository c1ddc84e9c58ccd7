"""Timing: candidate and baseline in one process, interleaved, cross-checked from outside.

:func:`timed` runs the ``timed`` probe (``harness.sandbox.probes.timing``) next to the
code, re-checks every timed output against the grader's ``check``, and compares the
claimed medians with the worker's CPU time (CPU) or the wall clock (CUDA) of the whole
request, read from outside (``harness.sandbox.outside``); where the two disagree the
candidate is graded on the outside figure.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import Iterable

import torch

from .. import bench
from .probes import timing as _probe_timing
from .calls import run_probe
from .worker import RemoteObject, SandboxError


# --- timing: candidate and baseline in one process, cross-checked from outside -------------------

OUTSIDE_MARGIN = 0.25    # unexplained outside time allowed, as a fraction of the claimed in-process time
OUTSIDE_FIXED_S = 2e-3   # ... plus this, plus twice the measured round trip and copy of the inputs
CPU_TICK_S = 0.03        # /proc CPU times count clock ticks (10 ms): both ends' rounding and a margin
BASELINE_TOLERANCE = 3.0  # a trusted baseline's worker median is graded within this factor of ours
MAX_ROUNDS = 3            # measurements of one ratio at most, while its interval straddles a band edge
# a baseline timed next to the submission is graded within this factor of its clean twin's time: on a
# GPU runner the two runs see the same quiet device; on a shared CPU the load swings in between
TWIN_TOLERANCE = {"cuda": 1.5, "cpu": BASELINE_TOLERANCE}


@dataclasses.dataclass
class Timed:
    """What :func:`timed` graded. ``ratio``: the median of the interleaved rounds' ratios
    (candidate / baseline, lower is better; ``pairs``), with its ``interval``; where the
    candidate is graded on the outside figure, ``candidate_s / baseline_s``, a point;
    ``candidate_s``, ``baseline_s``: the medians (seconds per call); ``outside``:
    True when the candidate's in-process figures disagreed with the outside total (the
    worker's CPU time from /proc on CPU, the wall clock on CUDA) and ``candidate_s`` is
    the outside figure; ``baseline_outside``: True when a trusted
    baseline's worker median was more than ``BASELINE_TOLERANCE`` times off the grader's
    own and ``baseline_s`` was clamped; ``figures``: the claims and the outside figures (for
    ``record_perf``)."""

    ratio: float
    candidate_s: float
    baseline_s: float
    outside: bool = False
    baseline_outside: bool = False
    figures: dict = dataclasses.field(default_factory=dict)
    interval: tuple = (math.nan, math.nan)  # the ratio's ~95% interval (a point where graded from outside)
    pairs: list = dataclasses.field(default_factory=list)  # per interleaved round: candidate / baseline


def _samples(fig, key, n=None) -> list:
    xs = fig.get(key) if isinstance(fig, dict) else None
    if not isinstance(xs, list) or (n is not None and len(xs) != n) or len(xs) > 100000 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in xs):
        raise SandboxError(f"the implementation's process sent malformed timing figures ({key})")
    return [float(x) for x in xs]


def _clone_args(x):
    return _probe_timing._clone_tree(x)


def _median_of(fn, n=5, clock=None) -> float:
    clock = clock or time.perf_counter
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return sorted(out)[n // 2]


def timed(candidate, baseline, inputs, *, edges=None, rounds: int = MAX_ROUNDS, **opts) -> Timed:
    """:func:`timed_once` until the ratio's interval lies inside one band: the median of the
    interleaved pairs' ratios (candidate / baseline, one pair per round of calls) and its ~95%
    interval from the pairs' order statistics (``Timed.interval``); while that interval holds one
    of ``edges`` (a perf threshold's band edges, ``PerfThreshold.edges()``) another measurement
    adds its pairs, at most ``rounds`` in all, so a regrade on the same machine lands in the
    same band. A ratio graded on the outside figure (``Timed.outside``) is a point: no interval,
    no further rounds. Same arguments as :func:`timed_once`."""
    t = timed_once(candidate, baseline, inputs, **opts)
    pairs = list(t.pairs)
    for _ in range(max(0, rounds - 1)):
        if t.outside or not edges or not any(t.interval[0] < e < t.interval[1] for e in edges):
            break
        more = timed_once(candidate, baseline, inputs, **opts)
        if more.outside:
            return more
        pairs += more.pairs
        t = _with_pairs(more, pairs)
    return t


def _with_pairs(t: Timed, pairs: list) -> Timed:
    """``t`` graded on ``pairs``: its ratio their median, its interval their order statistics."""
    ratio, interval = _pair_ratio(pairs)
    figures = {**t.figures, "ratio": ratio, "ratio_lo": interval[0], "ratio_hi": interval[1], "pairs": len(pairs)}
    return dataclasses.replace(t, ratio=ratio, interval=interval, pairs=list(pairs), figures=figures)


def _pair_ratio(pairs: list) -> tuple[float, tuple[float, float]]:
    """The median of ``pairs`` and a ~95% interval of it: the order statistics ``k`` and
    ``n - 1 - k`` of the sorted ratios with ``k = floor((n - 1.96 sqrt(n)) / 2)`` (the sign
    test's binomial interval for a median, normal approximation)."""
    xs = sorted(pairs)
    n = len(xs)
    k = max(0, int((n - 1.96 * math.sqrt(n)) // 2))
    return bench._median(xs), (xs[k], xs[n - 1 - k])


def against_twin(worker_s: float, twin_s: float, device="cpu") -> tuple[float, bool]:
    """A baseline that can only run next to the submission (a multi-rank baseline such as torch's
    DDP or ``fully_shard``, timed interleaved with the candidate on the submission's ranks) checked
    against its twin: the same baseline timed on ranks that never imported the submission
    (``run_ranks(..., clean=True)``). ``worker_s``, ``twin_s``: the two medians, seconds per call.
    Returns ``(graded_s, clamped)``: ``worker_s`` clamped to within ``TWIN_TOLERANCE`` of
    ``twin_s`` (a submission that slows the baseline beside it, or lies about its time, gains at
    most that factor), and whether it was clamped. Raises ValueError for a non-positive twin."""
    if not (twin_s > 0 and math.isfinite(twin_s)):
        raise ValueError(f"twin_s must be a positive number of seconds, got {twin_s!r}")
    tol = TWIN_TOLERANCE["cuda" if str(device).startswith("cuda") else "cpu"]
    graded = min(max(worker_s, twin_s / tol), twin_s * tol) if math.isfinite(worker_s) else twin_s * tol
    return graded, graded != worker_s


def timed_once(candidate, baseline, inputs, *, warmup_inputs, check=None, kwargs: dict | None = None,
               baseline_kwargs: dict | None = None, forbid: Iterable[str] = (), forbid_ops: Iterable[str] = (),
               reason: str = "the contract forbids it", device="cpu", repeats: int | None = None,
               backend: str | None = None, no_grad: bool = True, verify_baseline: bool = True,
               threads: int | None = None, timeout: float | None = None) -> Timed:
    """Time ``candidate(*args, **kwargs)`` against ``baseline(*args, **baseline_kwargs)``
    next to the implementation, interleaved (``harness.bench.run_interleaved``: >= 3
    warm-up calls on ``warmup_inputs``, a cache flush before every call, CUDA events
    plus a device-wide synchronize on CUDA, the median of ``repeats`` >= 10 rounds,
    default ``len(inputs)``: a fresh input per round).

    ``candidate``: an implementation callable (``impl.f``, a method or module handle);
    ``baseline``: a trusted name from ``harness.sandbox._probe_timing.BASELINES`` (e.g.
    ``"torch.nn.functional.scaled_dot_product_attention"``; ``backend`` picks an SDPA
    backend: ``math``, ``flash``, ...) or another implementation callable. ``inputs``:
    the pool, a list of positional-argument tuples (sent to the worker once, before the
    timed request); ``warmup_inputs``: >= 3 others. ``forbid``: dotted names patched to
    raise during the candidate's calls only (the baseline may call them); ``forbid_ops``:
    ATen op-name substrings the candidate must not reach (checked on one untimed call).
    ``threads``: torch's intra-op threads of both while timed; default 1 on CPU (on a
    shared, loaded machine a second OpenMP thread makes times swing tenfold), unchanged
    on CUDA.
    ``check(i, out)``: raises when the candidate's output for ``inputs[i]`` is wrong;
    every pool input's output is checked here, against the grader's own oracle.

    Cross-checks (the worker's figures are claims):

    * Outside total. ``W``, measured here for the one timed request (the inputs travel
      before it, the outputs after it): on CPU the worker's CPU seconds from /proc (the
      in-process figures are CPU time too), on CUDA (or where /proc cannot be read) the
      request's wall clock. ``W`` must be explained by the claimed calls: with
      ``claimed`` the sum of every claimed call (warm-up and timed, both sides), ``n``
      the number of calls, ``per_call`` twice the flush and loop overhead measured here
      on a no-op, and ``fixed = OUTSIDE_FIXED_S`` + twice the time to copy the pool here
      + twice the round trip of an empty request (wall clock) or ``CPU_TICK_S`` (the
      resolution of /proc CPU times), the claims are accepted when
      ``W - claimed - n * per_call - fixed <= OUTSIDE_MARGIN * claimed``. Otherwise the
      candidate is graded on the outside figure: every second not claimed by the
      baseline is charged to it, ``(W - fixed - n * per_call - B) / n_c`` per call
      (``n_c``: the candidate's calls, ``B``: the baseline's claimed total, capped for a
      named baseline at ``n_b * BASELINE_TOLERANCE`` times our own median), or its
      claimed median if that is larger; ``outside`` is then True.
    * Trusted baseline. With ``verify_baseline`` and a named baseline, the baseline is
      also timed here on copies of the pool, and the worker's median is graded clamped
      to within ``BASELINE_TOLERANCE`` of ours (a submission slowing the baseline, or
      lying about it, gains at most that factor; ``baseline_outside``). The factor is
      wide because the two timings are not interleaved (a shared CI machine's load
      swings in between). A baseline that is an implementation callable is the
      submission's own code and cannot be checked so.

    In the worker, a candidate whose plain (untimed) call takes more than a third of the
    call limit shared out over every call of the request fails at once, rather than
    timing out (a timeout counts against the submission's budget).

    Raises AssertionError when the candidate called a forbidden name or op, was too
    slow to time, or a check fails; SandboxError for malformed figures."""
    inputs = [tuple(a) for a in inputs]
    warmup_inputs = [tuple(a) for a in warmup_inputs]
    repeats = len(inputs) if repeats is None else int(repeats)
    if len(warmup_inputs) < bench.WARMUP_MIN or repeats < bench.REPEATS_MIN:
        raise ValueError(f"need >= {bench.WARMUP_MIN} warm-up inputs and >= {bench.REPEATS_MIN} repeats, "
                         f"got {len(warmup_inputs)} and {repeats}")
    kwargs, baseline_kwargs = dict(kwargs or {}), dict(baseline_kwargs or {})
    dev = torch.device(device)
    threads = (1 if dev.type == "cpu" else None) if threads is None else int(threads)
    opts = {"threads": threads, "device": str(dev), "repeats": repeats, "forbid": list(forbid),
            "forbid_ops": list(forbid_ops), "reason": reason, "backend": backend, "no_grad": no_grad}
    name = getattr(candidate, "_short", getattr(candidate, "__name__", "the candidate"))
    remote = isinstance(candidate, RemoteObject)
    if remote:  # what one call may take so that the whole timed request fits in the call limit
        limit = candidate._sandbox.cfg.call_timeout_s if timeout is None else timeout
        opts["max_call_s"] = limit / (3 * (len(warmup_inputs) + repeats + 2))

    # figures of this process: the flush and the loop's own overhead per call, the copy of the pool
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with _probe_timing._threads(threads):
        buf = bench.flush_buffer(dev)
        flush_s = _median_of(lambda: (buf.zero_(), sync()), clock=time.thread_time if dev.type == "cpu" else None)
        del buf
        noop = bench.run_interleaved({"a": lambda *a, **k: None, "b": lambda *a, **k: None}, [()], [()] * 3,
                                     device=dev, repeats=bench.REPEATS_MIN, flush=False)
        loop_s = max(max(tm.wall_s + tm.warmup_s) for tm in noop.values())
        copy_s = _median_of(lambda: (_clone_args(inputs), sync()), n=3,
                            clock=time.thread_time if dev.type == "cpu" else None)

    if remote:
        sb, server = candidate._sandbox, candidate._server

        def keep(value, what):
            return sb.send({"op": "probe", "name": "keep", "keys": ["value"]}, {"v_value": value}, what,
                           server=server, timeout=timeout)[0]
        t0 = time.perf_counter()
        keep(None, "timing a round trip")
        rtt_s = time.perf_counter() - t0
        pool, warm = keep([list(a) for a in inputs], "sending the timing inputs"), \
            keep([list(a) for a in warmup_inputs], "sending the warm-up inputs")
    else:
        rtt_s = 0.0
        pool, warm = [list(a) for a in _clone_args(inputs)], [list(a) for a in _clone_args(warmup_inputs)]
    cpu0 = time.process_time()
    value, figures, outside = run_probe("timed", target=candidate, baseline=baseline, inputs=pool,
                                        warmup_inputs=warm, kwargs=kwargs, baseline_kwargs=baseline_kwargs,
                                        opts=opts, what=f"timing {name}", timeout=timeout)
    # the outside total: the worker's CPU seconds from /proc on CPU (this process's when local),
    # the wall clock of the request on CUDA (or where /proc cannot be read)
    on_cpu = dev.type == "cpu" and (outside["cpu_s"] is not None or not remote)
    out_total = (outside["cpu_s"] if remote else time.process_time() - cpu0) if on_cpu else outside["wall_s"]
    called = figures.get("forbidden") or figures.get("ops_forbidden")
    if called:
        raise AssertionError(f"{name} called {', '.join(str(c)[:100] for c in called[:5])} during the timed "
                             f"calls: {reason}")
    if "too_slow_s" in figures:
        slow = _samples({"t": [figures["too_slow_s"]]}, "t")[0]
        raise AssertionError(f"one call of {name} took {slow:.3g} s: too slow to time within the call limit "
                             f"(at most {opts['max_call_s']:.3g} s per call here): no performance credit")
    n_warm = len(warmup_inputs)
    cand, base = figures.get("candidate"), figures.get("baseline")
    c_times, b_times = _samples(cand, "times_s", repeats), _samples(base, "times_s", repeats)
    c_warm, b_warm = _samples(cand, "warmup_s", n_warm + 1), _samples(base, "warmup_s", n_warm)
    if on_cpu:  # CPU seconds of every call
        c_claim, b_claim = sum(c_times) + sum(c_warm), sum(b_times) + sum(b_warm)
    else:       # wall seconds of every call
        c_claim = _samples({"t": [cand.get("total_s")]}, "t")[0] + c_warm[0]
        b_claim = _samples({"t": [base.get("total_s")]}, "t")[0]

    # every timed output, checked here
    if len(value) != len(inputs):
        raise SandboxError("the implementation's process sent the wrong number of timed outputs")
    for i in range(len(inputs)):
        out = value[i]
        if check is not None:
            check(i, out)

    median = bench._median
    c_s, b_s = median(c_times), median(b_times)
    b_local = None
    baseline_outside = False
    b_share = b_claim  # the baseline's share of the outside total
    if verify_baseline and isinstance(baseline, str):
        fn = _probe_timing.BASELINES[baseline]
        guards = {}
        if backend is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            chosen = getattr(SDPBackend, _probe_timing.SDPA_BACKENDS[backend])
            guards["baseline"] = lambda: sdpa_kernel(chosen)
        with torch.no_grad() if no_grad else contextlib.nullcontext(), _probe_timing._threads(threads):
            mine = bench.run_interleaved({"baseline": fn}, _clone_args(inputs), _clone_args(warmup_inputs),
                                         device=dev, repeats=repeats, kwargs={"baseline": baseline_kwargs},
                                         guards=guards)
        b_local = mine["baseline"].median_s
        clamped = min(max(b_s, b_local / BASELINE_TOLERANCE), b_local * BASELINE_TOLERANCE)
        if clamped != b_s:
            b_s, baseline_outside = clamped, True
        b_share = min(b_claim, (n_warm + repeats) * BASELINE_TOLERANCE * b_local)

    n_c, n_b = n_warm + repeats + (2 if "max_call_s" in opts else 1), n_warm + repeats
    claimed = c_claim + b_claim
    per_call = 2 * (flush_s + loop_s)
    fixed = OUTSIDE_FIXED_S + 2 * copy_s + (2 * rtt_s if not on_cpu else 0.0) + (CPU_TICK_S if on_cpu else 0.0)
    unexplained = out_total - claimed - (n_c + n_b) * per_call - fixed
    used_outside = unexplained > OUTSIDE_MARGIN * claimed
    if used_outside:
        implied = (out_total - fixed - (n_c + n_b) * per_call - b_share) / n_c
        c_s = max(c_s, implied)
    pairs = [c / b if b > 0 else math.inf for c, b in zip(c_times, b_times)]
    if used_outside:  # the outside figure is one number: the ratio is a point
        ratio = c_s / b_s if b_s > 0 else math.inf
        interval = (ratio, ratio)
    else:
        ratio, interval = _pair_ratio(pairs)
        if baseline_outside:  # the baseline's median was clamped: scale the pairs' ratio likewise
            scale = median(b_times) / b_s if b_s > 0 else 1.0
            ratio, interval = ratio * scale, (interval[0] * scale, interval[1] * scale)
    report = {"ratio": ratio, "ratio_lo": interval[0], "ratio_hi": interval[1], "pairs": len(pairs), "flush_s": flush_s, "loop_overhead_s": loop_s, "copy_s": copy_s, "rtt_s": rtt_s,
              "candidate_s": c_s, "baseline_s": b_s, "claimed_candidate_s": median(c_times),
              "claimed_baseline_s": median(b_times), "outside_total_s": out_total, "outside_clock":
              "cpu" if on_cpu else "wall", "claimed_s": claimed, "unexplained_s": unexplained,
              "outside": used_outside, "baseline_outside": baseline_outside}
    if b_local is not None:
        report["local_baseline_s"] = b_local
    return Timed(ratio=ratio, candidate_s=c_s, baseline_s=b_s, outside=used_outside,
                 baseline_outside=baseline_outside, figures=report, interval=interval, pairs=pairs)
