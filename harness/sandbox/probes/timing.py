"""Timing (perf graders): candidate and baseline in one process, interleaved."""
from __future__ import annotations

import contextlib

import torch

from harness.alloc import AllocationTracker

from .common import FAMILY_OPS, _perf_counter, _process_time, detach_tree, forbid
from .guards import guarded


# --- timing (perf graders): candidate and baseline in one process, interleaved -------------------

from harness import bench as _bench  # noqa: E402  (its clocks are bound now, before any submission)

# Trusted baselines a grader may name (the submission cannot name others). Bound at import, before
# the submission is imported: a submission that rebinds these names later does not change what runs.
import torch.distributed as _dist  # noqa: E402  (bound here, before any stand-in or submission)

BASELINES = {"torch.nn.functional.scaled_dot_product_attention": torch.nn.functional.scaled_dot_product_attention,
             "torch.distributed.all_reduce": _dist.all_reduce}
SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION"}
_run_interleaved = _bench.run_interleaved


def _clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone_tree(y) for y in x)
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    return x


@contextlib.contextmanager
def _threads(n):
    """``torch.set_num_threads(n)`` while active (None: unchanged)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def probe_timed(module, target, baseline, inputs, warmup_inputs, kwargs, baseline_kwargs, opts):
    """Time ``target`` (the candidate) against ``baseline`` with ``harness.bench.run_interleaved``.

    ``baseline``: a name in ``BASELINES`` (trusted code, e.g. SDPA; ``opts["backend"]`` picks an
    SDPA backend for it) or an implementation callable. ``inputs``: the pool (a list of argument
    lists; the baseline gets its own copies, so a candidate that mutates its inputs cannot change
    the baseline's work); ``warmup_inputs``: >= 3 other argument lists. ``opts``: ``device``,
    ``repeats``, ``forbid`` (dotted names patched to raise during the candidate's calls only),
    ``reason``, ``no_grad`` (default True), ``threads`` (intra-op threads of both while timed,
    None: unchanged), ``forbid_ops`` (substrings of ATen op names that the candidate must not
    reach, besides those of the ``forbid`` names' families; checked on one extra untimed call before the warm-up), ``max_call_s`` (a second
    untimed call slower than this, in CPU seconds on CPU and wall seconds on CUDA, ends the probe at once
    with the figure ``too_slow_s``).

    Value: the candidate's output for each pool input (its last timed call on it), kept in
    this process (``{"keep": True}``: the caller reads them one by one). Figures (claims, see
    the module docstring): per candidate ``median_s``, ``times_s``, ``wall_s``, ``warmup_s``
    (the candidate's starts with the untimed calls, together), ``total_s`` (wall, every call);
    ``loop_s`` (this probe's own total), ``forbidden`` and ``ops_forbidden``."""
    if isinstance(baseline, str):
        if baseline not in BASELINES:
            raise ValueError(f"baseline {baseline!r} is not a trusted baseline ({', '.join(BASELINES)})")
        base_fn = BASELINES[baseline]
    elif callable(baseline):
        base_fn = baseline
    else:
        raise TypeError(f"baseline must be a trusted name or a callable, got {type(baseline).__name__}")
    t_start = _perf_counter()
    device = torch.device(opts.get("device", "cpu"))
    seen: list = []
    names, reason = list(opts.get("forbid", [])), opts.get("reason", "the contract forbids it")
    @contextlib.contextmanager
    def candidate_guard():
        with forbid(names, module, reason, seen), guarded():
            yield

    guards = {"candidate": candidate_guard}
    backend = opts.get("backend")
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if backend not in SDPA_BACKENDS:
            raise ValueError(f"unknown SDPA backend {backend!r}")
        chosen = getattr(SDPBackend, SDPA_BACKENDS[backend])
        guards["baseline"] = lambda: sdpa_kernel(chosen)
    outs: list = [None] * len(inputs)

    def keep(name, i, out):
        if name == "candidate":
            outs[i] = detach_tree(out)

    ops_hit: list = []
    threads = opts.get("threads")
    with torch.no_grad() if opts.get("no_grad", True) else contextlib.nullcontext(), _threads(threads):
        first = _clone_tree(warmup_inputs[0])
        clock = _perf_counter if device.type == "cuda" else _bench._thread_time
        probe_s = clock()
        op_subs = list(opts.get("forbid_ops", [])) + [x for n in names for x in FAMILY_OPS.get(n, ())]
        if op_subs:
            with AllocationTracker() as tracker, guards["candidate"]():  # the guard inside: the tracker's own exit pops
                target(*first, **kwargs)
            ops_hit = sorted(op for op in tracker.ops if any(s in op for s in op_subs))
        else:
            with guards["candidate"]():
                target(*first, **kwargs)
        probe_s = clock() - probe_s
        max_call_s = opts.get("max_call_s")
        if max_call_s is not None:  # one plain call: a candidate too slow to time stops here, not at a timeout
            again = _clone_tree(warmup_inputs[0])
            w0, c0, p0 = _perf_counter(), clock(), _process_time()
            with guards["candidate"]():
                target(*again, **kwargs)
            # on CPU the process's CPU seconds (every thread's), which the machine's load cannot inflate
            wall = _perf_counter() - w0 if device.type == "cuda" else _process_time() - p0
            probe_s += clock() - c0
            if wall > max_call_s:
                return [], {"too_slow_s": wall, "forbidden": sorted(set(seen)), "ops_forbidden": ops_hit}
        pools = {"candidate": inputs, "baseline": [_clone_tree(a) for a in inputs]}
        t = _run_interleaved({"candidate": target, "baseline": base_fn}, pools, warmup_inputs, device=device,
                             repeats=int(opts.get("repeats", _bench.REPEATS_MIN)),
                             kwargs={"candidate": kwargs, "baseline": baseline_kwargs}, guards=guards,
                             on_output=keep)
    figures = {name: {"median_s": tm.median_s, "times_s": tm.times_s, "wall_s": tm.wall_s,
                      "warmup_s": tm.warmup_s, "total_s": tm.total_s} for name, tm in t.items()}
    figures["candidate"]["warmup_s"] = [probe_s] + figures["candidate"]["warmup_s"]
    figures.update(loop_s=_perf_counter() - t_start, forbidden=sorted(set(seen)), ops_forbidden=ops_hit,
                   keep=True)
    return outs, figures
