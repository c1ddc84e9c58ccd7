"""Probe calls: every measurement a grader asks for, run where the object lives.

Each function here runs one probe (``harness.sandbox.probes``): in the worker that holds
its target (a handle) or in this process (a local object, ``--sandbox none``), so
graders are written once for both. :func:`run_probe` is the one path; it reads the
outside figures (``harness.sandbox.outside``) around the request. :class:`Measurement`
is what :func:`measure` saw. The recomputation and loss-scaling drivers of lab 12, then lab 14's
table models, decoders and seeded runs, are at the end.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import time
from pathlib import Path
from typing import Iterable

import torch

from . import probes, wire
from .wire import View
from .worker import RemoteModule, RemoteObject, SandboxError


# --- probes: one call path for both modes -------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    """What :func:`measure` saw during one call. Allocation fields as in
    ``harness.alloc.AllocationTracker`` (elements, bytes); ``ops``: ATen op names;
    ``flops``: ``torch.utils.flop_counter`` total, matrix-vector products included (None unless
    asked); ``arith_elems``: the element operations FlopCounterMode leaves out (pointwise
    outputs, reduction inputs; ``harness.alloc``); ``comm``: the communication counter's report
    (multi-rank, when asked); ``wall_s``: seconds of the call measured by the grader.
    Read from outside, for every process of the server (its cgroup, else /proc of its
    subtree: ``harness.sandbox.outside``), None in-process: ``peak_rss_bytes``: its peak memory
    during the call; ``peak_growth_bytes``: that peak minus its memory just before the request
    (so it counts the request's decoded inputs too); ``peak_over_start_bytes``: that growth plus
    the memory it held (anonymous and shmem: tmpfs included) before the request beyond what it
    held when it started, before the submission was imported (so a buffer made at import or
    kept since an earlier call counts); ``cpu_s``: its CPU seconds during the call (forked
    processes and threads included). ``triton_launches``: Triton kernel launches during the
    call (``harness.sandbox.triton_launches``; None unless asked). Allocation, ops, FLOPs, comm
    and launches are counted next to the implementation, so a submission can blind them;
    wall, memory and CPU time are read from outside, where it cannot."""

    max_numel: int = 0
    max_bytes: int = 0
    total_bytes: int = 0
    largest: str = ""
    ops: set = dataclasses.field(default_factory=set)
    flops: int | None = None
    forbidden_called: list = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    peak_rss_bytes: int | None = None
    first_nonfinite: str = ""  # with nonfinite=True: the first op that produced NaN/Inf
    comm: dict | None = None
    cpu_s: float | None = None
    peak_growth_bytes: int | None = None
    peak_over_start_bytes: int | None = None
    triton_launches: int | None = None
    arith_elems: int | None = None


def _num(extra, key):
    v = extra.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0


def measurement_from(extra: dict, outside: dict) -> Measurement:
    """A Measurement from a probe's figures (a worker's claims, checked for type) and the
    grader's own ``outside`` figures (see :func:`run_probe`)."""
    peak, before = outside.get("peak_rss_bytes"), outside.get("rss_before_bytes")
    held, start = outside.get("held_before_bytes"), outside.get("start_held_bytes")
    growth = None if peak is None or before is None else max(0, peak - before)
    flops = extra.get("flops")
    ops = extra.get("ops")
    forbidden = extra.get("forbidden")
    comm = extra.get("comm")
    return Measurement(max_numel=_num(extra, "max_numel"), max_bytes=_num(extra, "max_bytes"),
                       total_bytes=_num(extra, "total_bytes"), largest=str(extra.get("largest", ""))[:300],
                       ops={str(o)[:100] for o in ops[:10000]} if isinstance(ops, list) else set(),
                       flops=int(flops) if isinstance(flops, (int, float)) and not isinstance(flops, bool) else None,
                       forbidden_called=[str(x)[:200] for x in forbidden][:20] if isinstance(forbidden, list) else [],
                       wall_s=outside["wall_s"], peak_rss_bytes=peak,
                       peak_growth_bytes=growth,
                       peak_over_start_bytes=None if growth is None or held is None or start is None
                       else max(0, held - start) + growth,
                       first_nonfinite=str(extra.get("nonfinite") or "")[:300],
                       comm=_comm_report(comm) if comm is not None else None, cpu_s=outside.get("cpu_s"),
                       triton_launches=_num(extra, "triton_launches") if "triton_launches" in extra else None,
                       arith_elems=_num(extra, "arith_elems") if "arith_elems" in extra else None)


def _comm_report(c) -> dict:
    if not isinstance(c, dict):
        return {"forbidden": ["<malformed report>"], "collectives": {}, "sent_bytes": 1 << 62}
    out = {k: _num(c, k) for k in ("sent_msgs", "sent_bytes", "sent_elems", "recv_msgs", "recv_bytes",
                                   "collective_elems")}
    cols = c.get("collectives")
    out["collectives"] = {str(k)[:60]: _num(cols, k) for k in list(cols)[:50]} if isinstance(cols, dict) else {}
    fb = c.get("forbidden")
    out["forbidden"] = [str(x)[:60] for x in fb][:50] if isinstance(fb, list) else []
    out["events"] = _events(c.get("events"))
    return out


_EVENT_KINDS = {"launch", "c10d", "send", "recv", "wait", "ready", "forward_done", "backward_done"}


def _events(raw) -> list[dict]:
    """The counter's ordered event log, checked: known kinds only, plain fields."""
    out = []
    for e in raw if isinstance(raw, list) else []:
        if not isinstance(e, dict) or e.get("k") not in _EVENT_KINDS:
            out.append({"k": "malformed"})
            continue
        ev = {"k": e["k"]}
        for key in ("op", "dtype", "p"):
            if isinstance(e.get(key), str):
                ev[key] = e[key][:200]
        for key in ("numel", "sent", "peer"):  # peer: a send's / receive's global rank (None: unknown)
            if isinstance(e.get(key), int) and not isinstance(e.get(key), bool):
                ev[key] = e[key]
        if isinstance(e.get("async_op"), bool):
            ev["async_op"] = e["async_op"]
        if isinstance(e.get("sum"), float):
            ev["sum"] = e["sum"]
        out.append(ev)
    return out[:10_000]


def _target_of(values: dict):
    for key in ("target", "fn"):
        if isinstance(values.get(key), RemoteObject):
            return values[key]
    return next((v for v in values.values() if isinstance(v, RemoteObject)), None)


def _local_views(x):
    """In-process, a ``View`` becomes the view itself (over the caller's base)."""
    if type(x) is View:
        out = x.base.as_strided(x.shape, x.stride, x.base.storage_offset() + x.offset)
        wire.VIEW_BASES[id(out)] = (out, x.base)
        return out
    if isinstance(x, (list, tuple)):
        return type(x)(_local_views(y) for y in x)
    if isinstance(x, dict):
        return {k: _local_views(v) for k, v in x.items()}
    return x


def run_probe(name: str, *, on=None, what: str = "", timeout: float | None = None, max_bytes: int | None = None,
              **values):
    """Run probe ``name`` where its target lives (``on``, a handle, else the first handle
    among ``values``; in-process when there is none). Returns ``(value, figures,
    outside)``: ``outside`` holds the grader's own figures (``wall_s``, and for a
    worker its ``peak_rss_bytes``, ``rss_before_bytes``, ``held_before_bytes`` and
    ``start_held_bytes`` (see ``Measurement``) and ``cpu_s``; None in-process)."""
    target = on if isinstance(on, RemoteObject) else _target_of(values)
    if target is None:
        module = next((inspect.getmodule(v) for v in values.values() if inspect.getmodule(v) is not None), None)
        t0 = time.perf_counter()
        try:
            value, figures = probes.PROBES[name](module, **_local_views(values))
        finally:
            wire.VIEW_BASES.clear()
        return value, figures, {"wall_s": time.perf_counter() - t0, "peak_rss_bytes": None,
                                "rss_before_bytes": None, "held_before_bytes": None, "start_held_bytes": None,
                                "cpu_s": None}
    sb, server = target._sandbox, target._server
    fig = sb.ensure().figures[server]
    begun = fig.begin()
    t0 = time.perf_counter()
    op = {"op": "probe", "name": name, "keys": list(values)}
    value, figures = sb.send(op, {"v_" + k: v for k, v in values.items()}, what or f"{name} of {target._short}",
                             server=server, timeout=timeout, max_bytes=max_bytes)
    wall = time.perf_counter() - t0
    ended = fig.end(begun)
    return value, figures, {"wall_s": wall, "peak_rss_bytes": ended["peak"], "rss_before_bytes": begun["memory"],
                            "held_before_bytes": begun["held"], "start_held_bytes": fig.start_held,
                            "cpu_s": ended["cpu_s"]}


def measure(fn, *args, alloc: bool = True, ops: bool = True, flops: bool = False, forbid: Iterable[str] = (),
            no_grad: bool = False, nonfinite: bool = False, reason: str = "the contract forbids it",
            timeout: float | None = None, triton: bool = False, **kwargs):
    """Call ``fn(*args, **kwargs)`` next to the implementation and measure it.

    Returns ``(out, Measurement)``. ``alloc``/``ops``: an AllocationTracker around
    the call; ``flops``: a FlopCounterMode; ``forbid``: dotted names (e.g.
    ``torch.nn.functional.scaled_dot_product_attention``) patched to raise
    AssertionError during the call, in their home module and in the implementation
    module's globals (a call is also recorded in ``forbidden_called``, even if the
    implementation swallows the error); ``no_grad``: run under ``torch.no_grad()``;
    ``nonfinite``: record the first op whose floating output held NaN/Inf;
    ``triton``: count the Triton kernel launches (``Measurement.triton_launches``);
    ``timeout``: seconds before the call is stopped (default: the lab's call limit).
    ``fn`` is an implementation function, class, method or handle (``impl.f``,
    ``obj.method``, ``obj``). The measurement's own keyword arguments cannot be
    passed through to ``fn``."""
    opts = {"alloc": alloc, "ops": ops, "flops": flops, "forbid": list(forbid), "no_grad": no_grad,
            "reason": reason, "nonfinite": nonfinite, "triton": triton}
    out, figures, outside = run_probe("measure", target=fn, args=list(args), kwargs=kwargs, opts=opts,
                                      what=f"measuring {getattr(fn, '_short', getattr(fn, '__name__', 'a call'))}",
                                      timeout=timeout)
    return out, measurement_from(figures, outside)


class VJP(tuple):
    """``(out, grads)``; ``.measurement``: the backward's Measurement when asked for."""

    measurement: Measurement | None = None

    def __new__(cls, out, grads, measurement=None):
        self = super().__new__(cls, (out, grads))
        self.measurement = measurement
        return self

    @property
    def out(self):
        return self[0]

    @property
    def grads(self):
        return self[1]


def vjp(fn, args: tuple, grad_outputs=None, *, kwargs: dict | None = None, requires_grad: tuple | None = None,
        forbid: Iterable[str] = (), measure_backward: bool = False, reason: str = "the contract forbids it") -> VJP:
    """Forward ``out = fn(*args, **kwargs)`` then ``torch.autograd.backward(out, grad_outputs)``,
    next to the implementation. Returns ``VJP (out, grads)``: ``out`` detached, ``grads`` one
    entry per positional argument (its ``.grad``, or None when it does not require grad).

    ``requires_grad``: one bool per positional argument (default: each tensor's own
    ``requires_grad``). ``grad_outputs``: a tensor or a tuple matching the output's
    tensors (None: a scalar output). Gradients also accumulate into the parameters
    of a module handle (read them with :func:`param_grads`). ``forbid`` as in
    :func:`measure`, around forward and backward. ``measure_backward``: an
    AllocationTracker around the backward only (``result.measurement``). Raises
    AssertionError when no output requires grad. The caller's tensors are never
    modified (the backward runs on aliases or copies)."""
    rg = list(requires_grad) if requires_grad is not None else \
        [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    opts = {"requires_grad": rg, "forbid": list(forbid), "measure_backward": measure_backward, "reason": reason}
    value, figures, outside = run_probe(
        "vjp", target=fn, args=[a.detach() if isinstance(a, torch.Tensor) else a for a in args],
        kwargs=kwargs or {}, grad_outputs=grad_outputs, opts=opts,
        what=f"autograd through {getattr(fn, '_short', getattr(fn, '__name__', 'a call'))}")
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == len(args)):
        raise SandboxError("the implementation's process sent a malformed autograd answer")
    for g in value[1]:
        if g is not None and type(g) is not torch.Tensor:
            raise AssertionError(f"a gradient is a {type(g).__name__}, not a tensor")
    m = measurement_from(figures, outside) \
        if measure_backward else None
    return VJP(value[0], value[1], m)


def param_grads(module) -> dict:
    """``{name: grad or None}`` of ``module.named_parameters()`` (after :func:`vjp`)."""
    value, _, _ = run_probe("param_grads", target=module, what="reading parameter gradients")
    if not isinstance(value, dict):
        raise SandboxError("malformed parameter gradients")
    return value


def saved_tensors(fn, args: tuple, kwargs: dict | None = None) -> tuple:
    """``(out, [tensors saved for backward by out.grad_fn])`` of ``fn(*args)`` with the
    tensor arguments requiring grad as given (see :func:`vjp`)."""
    rg = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    value, _, _ = run_probe("saved_tensors", target=fn,
                            args=[a.detach() if isinstance(a, torch.Tensor) else a for a in args],
                            kwargs=kwargs or {}, opts={"requires_grad": rg})
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list)):
        raise SandboxError("malformed saved tensors")
    return value


def gradcheck(fn, inputs: tuple, kwargs: dict | None = None, *, eps: float = 1e-6, atol: float = 1e-5,
              rtol: float = 1e-3, probes: int = 3, seed: int = 0) -> bool:
    """Check ``fn``'s backward against finite differences, in the grader's process.

    For ``probes`` random input directions ``u`` and output cotangents ``w`` (float64,
    from ``seed``): the backward's ``sum_i <grad_i, u_i>`` (:func:`vjp` with ``w``) must
    match the central difference ``<w, (f(x + eps u) - f(x - eps u)) / (2 eps)>``
    within ``atol + rtol * |difference|``. Every number is computed here from
    returned values, so a submission that patches torch inside the worker (e.g.
    ``torch.allclose``, which ``torch.autograd.gradcheck`` uses) cannot pass it.
    ``inputs``: float64 tensors."""
    kwargs = kwargs or {}
    g = torch.Generator().manual_seed(seed)
    xs = [a.detach().to(torch.float64) for a in inputs]
    base = fn(*xs, **kwargs)
    if type(base) is not torch.Tensor:
        return False
    for _ in range(probes):
        us = [torch.randn(x.shape, generator=g, dtype=torch.float64) for x in xs]
        w = torch.randn(base.shape, generator=g, dtype=torch.float64)
        _, grads = vjp(fn, tuple(x.clone().requires_grad_(True) for x in xs), w, kwargs=kwargs)
        if any(gr is None or type(gr) is not torch.Tensor or gr.shape != x.shape for gr, x in zip(grads, xs)):
            return False
        analytic = sum(float((gr.to(torch.float64) * u).sum()) for gr, u in zip(grads, us))
        plus = fn(*[x + eps * u for x, u in zip(xs, us)], **kwargs)
        minus = fn(*[x - eps * u for x, u in zip(xs, us)], **kwargs)
        if type(plus) is not torch.Tensor or type(minus) is not torch.Tensor or plus.shape != base.shape:
            return False
        numeric = float((w * (plus.to(torch.float64) - minus.to(torch.float64))).sum()) / (2 * eps)
        if not math.isfinite(analytic) or abs(analytic - numeric) > atol + rtol * abs(numeric):
            return False
    return True


def is_instance(obj, cls: type) -> bool:
    """``isinstance(obj, cls)`` for a local object or a handle (by the class's dotted name,
    as reported by the worker)."""
    if isinstance(obj, RemoteObject):
        want = {f"{c.__module__}.{c.__qualname__}" for c in (cls if isinstance(cls, tuple) else (cls,))}
        return bool(want & set(obj._mro))
    return isinstance(obj, cls)


def source(impl) -> str:
    """Source text of the implementation module (read by the grader from the submitted file)."""
    if isinstance(impl, RemoteModule):
        return Path(impl.__file__).read_text()
    return inspect.getsource(impl)


def held_storages(obj, *, deep: bool = False) -> dict:
    """``{data_ptr: nbytes}`` of the distinct storages behind the tensors ``obj``'s
    attributes hold (also in lists, tuples, dicts); ``deep``: behind every tensor reachable
    from ``obj`` (helper objects, containers, module buffers, at any depth). Pointers are the
    worker's."""
    return run_probe("storages", target=obj, deep=deep)[0]


def held_bytes(obj, *, deep: bool = False) -> list:
    """Copies (uint8) of every byte of every storage behind ``obj``'s tensors (``deep``: as
    in :func:`held_storages`)."""
    return run_probe("raw_bytes", target=obj, deep=deep)[0]


def fill_held(obj, value: float, *, deep: bool = False) -> int:
    """Fill every floating tensor ``obj``'s attributes hold (``deep``: as in
    :func:`held_storages`) with ``value`` (a float; NaN to catch reads of unwritten
    slots, 0.0 for a deterministic start), in place; returns how many were filled."""
    return run_probe("fill", target=obj, value=float(value), deep=deep)[0]


def call_views(owner, fn, *args, deep: bool = False, **kwargs) -> tuple:
    """``(fn(*args, **kwargs), flags)``: one bool per output tensor, True when it is a
    view of a storage ``owner`` holds (checked next to the implementation; ``deep``: as in
    :func:`held_storages`)."""
    return run_probe("call_views", target=owner, fn=fn, args=list(args), kwargs=kwargs, deep=deep)[0]


def reachable_bytes(obj, exclude=()) -> dict:
    """``{"total", "largest"}``: bytes of every tensor storage reachable from ``obj``,
    except those of the tensors in ``exclude`` and their gradients."""
    return run_probe("reachable_bytes", target=obj, exclude=list(exclude))[0]


def restart(impl) -> None:
    """Start the process that holds ``impl`` (the implementation module's handle) afresh, so
    nothing the submission kept (a memo of earlier inputs, a cache, module state) survives
    into the next call: determinism and caching checks call this between their two calls.
    ``impl`` keeps working (it names the module); every other handle of the old process is
    invalid afterwards. In-process (``--sandbox none``) the module is re-executed in place.
    Raises TypeError for a handle that is not a module."""
    if isinstance(impl, RemoteModule):
        impl._sandbox.kill()
        impl._sandbox.ensure()
    elif inspect.ismodule(impl):
        impl.__spec__.loader.exec_module(impl)
    else:
        raise TypeError(f"restart(impl): impl must be the implementation module, got {type(impl).__name__}")


def resident_bytes(obj) -> int | None:
    """Live memory of the server that holds ``obj`` (a handle: a module, object or function
    of the implementation), in bytes: what it made (anonymous and shmem pages: tmpfs files and
    shared memory included) after a garbage collection and ``malloc_trim`` there, for every
    process it started (its cgroup, else /proc of its processes; ``harness.sandbox.outside``),
    read by the trusted side. State a submission hides from introspection (a module-level
    dict, a closure, a forked child, a file in /dev/shm) still counts. None in-process
    (``--sandbox none``) or where it cannot be read. Graders compare two readings (before and
    after the state is built) on shapes where the state is far above the allocator's noise
    (tens of MiB)."""
    if not isinstance(obj, RemoteObject):
        return None
    run_probe("settle", target=obj, what=f"settling {obj._short}")
    return obj._sandbox.ensure().figures[obj._server].held()


@contextlib.contextmanager
def watch_storages(impl, cls_name: str, method: str, *, deep: bool = False):
    """While active, every ``impl.<cls_name>`` created (by the grader or inside the
    implementation) is checked after each ``method`` call: the storages it holds (``deep``:
    as in :func:`held_storages`) must be those it allocated in ``__init__``. Yields a dict
    filled on exit: ``created`` (instances made), ``bare`` (those holding no storage after
    ``__init__``: nothing to check), ``violations`` (calls after which storage changed)."""
    report: dict = {}
    if isinstance(impl, RemoteObject):
        run_probe("watch_begin", target=impl, cls_name=cls_name, method=method, deep=deep)
    else:
        probes.PROBES["watch_begin"](impl, impl, cls_name, method, deep)
    try:
        yield report
    finally:
        got = run_probe("watch_end", target=impl, cls_name=cls_name)[0] if isinstance(impl, RemoteObject) \
            else probes.PROBES["watch_end"](impl, impl, cls_name)[0]
        report.update(got if isinstance(got, dict) else {})


# --- recomputation and loss scaling (activation checkpointing, mixed precision) -----------------

def build_recompute(on, specs: list, states: list):
    """A list of trusted ``RecomputeNet`` modules (``harness.sandbox.probes.recompute``), one per spec,
    loaded from ``states``: made in the worker holding ``on`` (the implementation module's
    handle; the value is then a handle to the list) or here (``on`` a local module or None)."""
    if isinstance(on, RemoteObject):
        return run_probe("build_recompute", on=on, specs=list(specs), states=list(states),
                         what="building the trusted modules")[0]
    return probes.PROBES["build_recompute"](on, list(specs), list(states))[0]


def _checked_dict(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise SandboxError(f"the implementation's process sent a malformed answer ({what})")
    return value


def recompute(target, args: tuple, *, watch, grad_output=None, kwargs: dict | None = None,
              requires_grad: tuple | None = None, seed: int = 0, draws: int = 4, autocast_forward=None,
              autocast_backward=None, forbid: Iterable[str] = (), reason: str = "the contract forbids it") -> dict:
    """``out = target(*args, **kwargs)`` then ``torch.autograd.backward(out, grad_output)``, watched
    next to the implementation (``probes.recompute.probe_recompute``): under ``torch.manual_seed(seed)``,
    ``draws`` numbers drawn from the global RNG between forward and backward, the forward's
    saved storages counted through ``saved_tensors_hooks`` (``watch``'s parameters left out),
    the custom autograd nodes' kept tensors, each watched module's calls by phase, 8 numbers
    drawn after backward. ``autocast_forward`` / ``autocast_backward``: None (as is), ``"off"``,
    ``"float16"``, ``"bfloat16"`` (CPU autocast). ``target`` is an implementation callable for
    the submission, or a local callable (the grader's direct call: its oracle, run here with the
    same code). ``requires_grad``: one bool per positional argument (default: the tensors' own).
    Returns the probe's dict (see ``probes.recompute.probe_recompute``)."""
    rg = list(requires_grad) if requires_grad is not None else \
        [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    opts = {"requires_grad": rg, "seed": int(seed), "draws": int(draws), "autocast_forward": autocast_forward,
            "autocast_backward": autocast_backward, "forbid": list(forbid), "reason": reason}
    sent = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    value, _, _ = run_probe("recompute", target=target, args=sent, kwargs=kwargs or {}, watch=watch,
                            grad_output=grad_output, opts=opts,
                            what=f"forward and backward through {getattr(target, '_short', getattr(target, '__name__', 'a call'))}")
    return _checked_dict(value, "recomputation")


def drive_scaler(target, *, kwargs: dict, params: list, script: list, optimizer: dict) -> dict:
    """Drive the loss scaler ``target(**kwargs)`` (the submission's class, or the trusted
    ``probes.recompute.GradScalerAdapter`` run here as the oracle) through ``script``, one scripted
    gradient per parameter and step (``probes.recompute.probe_scaler_run``). Returns its dict."""
    value, _, _ = run_probe("scaler_run", target=target, kwargs=dict(kwargs), params=list(params),
                            script=list(script), opts={"optimizer": dict(optimizer)},
                            what=f"driving {getattr(target, '_short', getattr(target, '__name__', 'a scaler'))}")
    return _checked_dict(value, "loss scaler run")


def train_steps(target, *, spec: dict, state: dict, batches: list, scaler=None, opts: dict) -> list:
    """Training steps of a trusted ``RecomputeNet`` through ``target`` (the submission's
    ``train_step``, or a local reference step: the oracle), one per batch
    (``probes.recompute.probe_train_steps``; ``scaler``: a scaler class, ``"torch.amp.GradScaler"`` (the
    trusted ``probes.recompute.GradScalerAdapter``, made where the step runs) or None). Returns one dict
    per step."""
    value, _, _ = run_probe("train_steps", target=target, spec=dict(spec), state=dict(state), batches=list(batches),
                            scaler=scaler, opts=dict(opts),
                            what=f"training through {getattr(target, '_short', getattr(target, '__name__', 'a step'))}")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SandboxError("the implementation's process sent malformed training steps")
    return value


# --- speculative decoding (lab 14): the graders' table models and decoders, their logs, seeded runs ---

def build_spec_models(on, tables: list) -> list:
    """The graders' trusted ``TableModel`` s (``harness.sandbox.probes.speculative``), one per
    ``{"name", "W", "P", "S", "max_seq_len", "dtype"}``: made in the worker holding ``on`` (the
    implementation module's handle; the value is then a list of handles) or here (``on`` a local
    module). Their call logs stay in the probe module, never on the objects (read them with
    :func:`model_log`)."""
    specs = [{k: (str(v).removeprefix("torch.") if k == "dtype" else v) for k, v in t.items()} for t in tables]
    if isinstance(on, RemoteObject):
        value = run_probe("build_spec_models", on=on, tables=specs, what="building the graders' table models")[0]
    else:
        value = probes.PROBES["build_spec_models"](on, specs)[0]
    if not isinstance(value, list) or len(value) != len(tables):
        raise SandboxError("the implementation's process sent malformed table models")
    return value


def build_spec_decoders(on, spec: dict) -> list:
    """``[target, draft, baseline]`` of the perf tests (``probes.speculative.decoder_pair`` and
    ``TargetOnly``, the target's KV-cached greedy decoding): made in the worker holding ``on`` (the
    implementation module's handle; the value is then handles) or here (``on`` None or a local module:
    the trusted side's own copy, the same weights from the same ``spec["seed"]``)."""
    spec = {k: (str(v).removeprefix("torch.") if k in ("dtype", "device") else v) for k, v in spec.items()}
    if isinstance(on, RemoteObject):
        value = run_probe("build_spec_decoders", on=on, spec=spec, what="building the graders' decoders")[0]
    else:
        value = probes.PROBES["build_spec_decoders"](on, spec)[0]
    if not isinstance(value, list) or len(value) != 3:
        raise SandboxError("the implementation's process sent malformed decoders")
    return value


def _int_list(x, what: str) -> list:
    if not isinstance(x, list) or not all(type(v) is int for v in x):
        raise SandboxError(f"the implementation's process sent a malformed {what}")
    return x


def model_log(model) -> list:
    """``[(seq_len before, [tokens fed]), ...]``: every call of a model :func:`build_spec_models` made,
    in order (a claim from the submission's process: graders replay it against the output tokens).
    Raises AssertionError when the log was changed by anything but the model."""
    value = run_probe("model_log", target=model, what="reading a table model's calls")[0]
    if not isinstance(value, list) or not all(isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                                              for e in value):
        raise SandboxError("the implementation's process sent a malformed call log")
    return [(e[0], _int_list(e[1], "call log")) for e in value]


def spec_runs(fn, target, draft, prompt, gamma: int, new: int, kwargs: dict, seeds: list) -> tuple:
    """``fn(target, draft, prompt, gamma, new, generator=Generator(seed), **kwargs)`` once per seed, next to
    the implementation (``probes.speculative.probe_spec_runs``; ``target``/``draft`` from
    :func:`build_spec_models`). Returns ``(outs (len(seeds), new) int64, runs)``, ``runs[i] = [target's
    feeds, draft's feeds, accepted]`` (the feeds are claims, as in :func:`model_log`)."""
    value, _, _ = run_probe("spec_runs", fn=fn, target=target, draft=draft, prompt=prompt, gamma=int(gamma),
                            new=int(new), kwargs=dict(kwargs), seeds=[int(s) for s in seeds],
                            what=f"{len(seeds)} seeded runs of {getattr(fn, '_short', getattr(fn, '__name__', 'a call'))}")
    if not (isinstance(value, tuple) and len(value) == 2 and type(value[0]) is torch.Tensor
            and value[0].dtype == torch.int64 and tuple(value[0].shape) == (len(seeds), new)
            and isinstance(value[1], list) and len(value[1]) == len(seeds)):
        raise SandboxError("the implementation's process sent malformed runs")
    runs = []
    for r in value[1]:
        if not (isinstance(r, list) and len(r) == 3 and isinstance(r[0], list) and isinstance(r[1], list)
                and type(r[2]) is int):
            raise SandboxError("the implementation's process sent a malformed run")
        runs.append([[_int_list(f, "feed") for f in r[0]], [_int_list(f, "feed") for f in r[1]], r[2]])
    return value[0], runs


# --- sharded training (lab 15): the contract's full-parameter tagging probe -------------------------

def _int(x, what: str) -> int:
    if type(x) is not int or x < 0:
        raise SandboxError(f"the implementation's process sent a malformed {what}")
    return x


def _tensors(x, what: str) -> list:
    if not isinstance(x, list) or not all(t is None or type(t) is torch.Tensor for t in x):
        raise SandboxError(f"the implementation's process sent malformed {what}")
    return x


def _alive(x, key="bytes") -> dict:
    if not isinstance(x, dict):
        raise SandboxError("the implementation's process sent a malformed memory figure")
    return {"bytes": _int(x.get(key), "memory figure"), "largest": str(x.get("largest", ""))[:300]}


def _held(x) -> list:
    if not isinstance(x, list):
        raise SandboxError("the implementation's process sent a malformed peak")
    return [[str(e[0])[:100], _int(e[1], "figure")] for e in x[:8] if isinstance(e, list) and len(e) == 2]


def sharded_run(cls, model, units: list, batches: list, *, prefetch: bool = False, optim: tuple | None = None,
                no_grad=None, forbid: Iterable[str] = ()) -> dict:
    """One run of a sharding wrapper (lab 15) watched by the contract's tagging probe
    (``probes.sharding.probe_sharded_run``): ``cls(model, [model.layers[n] for n in units],
    prefetch=prefetch)`` (``cls`` the submission's class on a rank, ``model`` a trusted ``TrainNet``
    handle there), then per ``(x, grad_output)`` of ``batches`` forward, backward, ``optim``
    (``("torch.optim.AdamW" or "torch.optim.SGD", kwargs)``; default SGD lr 0.1) stepping the
    wrapper's parameters and ``zero_grad(set_to_none=True)``; with ``no_grad`` (an input) a forward
    under ``torch.no_grad()``. Returns the probe's dict, checked for type: ``shards0``, ``steps``
    (per backward ``grads``, ``params``, ``forward`` / ``backward``: ``[peak bytes of full
    parameters held, the op after which it was reached, [[what tagged a storage held then (an
    all-gather op, or the copying op), bytes], ...]]``, ``after_backward`` (bytes held when
    backward returned), ``alive`` (``{"bytes", "largest"}``: storages allocated during the run still
    alive after the step and zero_grad, the optimizer's state left out, the original parameters
    added while they live), ``reach`` (``{"bytes", "largest"}``: storages reachable from the wrapper
    then, made by an op or not), ``rs`` (``[elements, float64 sum]`` of each reduce-scatter input in
    backward)), ``construct_alive``, ``construct_reach``, ``no_grad`` (``{"y", "peak", "op", "held", "after"}``), and
    ``outside``: the worker's figures read by the trusted side (``peak_growth_bytes``, ``cpu_s``;
    None in-process). Every figure but ``outside`` is a claim of the submission's process."""
    name, kwargs = optim if optim is not None else ("torch.optim.SGD", {"lr": 0.1})
    opts = {"prefetch": bool(prefetch), "optim": name, "optim_kwargs": dict(kwargs), "no_grad": no_grad,
            "forbid": list(forbid)}
    value, figures, outside = run_probe("sharded_run", target=cls, model=model, units=list(units),
                                        batches=[list(b) for b in batches], opts=opts,
                                        what=f"a watched sharded run of {getattr(cls, '_short', cls)}")
    if not (isinstance(value, dict) and isinstance(value.get("steps"), list) and len(value["steps"]) == len(batches)):
        raise SandboxError("the implementation's process sent a malformed sharded run")
    out = {"shards0": _tensors(value.get("shards0"), "shards"), "construct_alive": _alive(value.get("construct_alive")),
           "construct_reach": _alive(value.get("construct_reach"), "total"), "steps": []}
    for st in value["steps"]:
        if not isinstance(st, dict):
            raise SandboxError("the implementation's process sent a malformed step")
        peaks = {}
        for phase in ("forward", "backward"):
            p = st.get(phase)
            if not (isinstance(p, list) and len(p) == 3):
                raise SandboxError("the implementation's process sent a malformed peak")
            peaks[phase] = [_int(p[0], "peak"), str(p[1])[:100], _held(p[2])]
        rs = st.get("rs")
        if not (isinstance(rs, list) and all(isinstance(e, list) and len(e) == 2 and type(e[1]) is float for e in rs)):
            raise SandboxError("the implementation's process sent malformed reduce-scatter inputs")
        out["steps"].append({"grads": _tensors(st.get("grads"), "gradients"), "params": _tensors(st.get("params"),
                             "parameters"), **peaks, "after_backward": _int(st.get("after_backward"), "figure"),
                             "alive": _alive(st.get("alive")), "reach": _alive(st.get("reach"), "total"), "rs": [[_int(n, "count"), s] for n, s in rs[:1000]]})
    ng = value.get("no_grad")
    if no_grad is not None:
        if not (isinstance(ng, dict) and type(ng.get("y")) is torch.Tensor):
            raise SandboxError("the implementation's process sent a malformed no-grad forward")
        out["no_grad"] = {"y": ng["y"], "peak": _int(ng.get("peak"), "peak"), "op": str(ng.get("op"))[:100],
                          "held": _held(ng.get("held")), "after": _int(ng.get("after"), "figure")}
    out["outside"] = {"peak_growth_bytes": measurement_from({}, outside).peak_growth_bytes,
                      "cpu_s": outside.get("cpu_s")}
    return out
