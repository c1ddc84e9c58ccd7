"""Probes: every measurement of student code, written once, run where the object lives.

A probe is a function ``probe(module, **values) -> (value, figures)``: ``module``
is the implementation module (whose globals ``forbid`` also patches), ``values``
are live objects (decoded tensors, handles resolved to the objects they name),
``value`` goes back by value (or as handles), ``figures`` is plain JSON.

Under ``--sandbox worker`` (``labs grade``) the worker's request loop
(``harness.sandbox.server``) runs them next to the submission, in the sandbox;
in a local run (``--sandbox none``) ``harness.sandbox.client`` calls the same
functions in-process. Graders never call this module: they use the client's
functions (``measure``, ``vjp``, ``timed``, ...), which dispatch here.

What a probe reports about a submission's own objects comes from the process the
submission runs in, so the trusted side treats figures as claims: it recomputes
values itself, and cross-checks figures from outside (wall clock, peak RSS, CPU
time, loopback bytes) where the contract grades them.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import gc
import importlib
import os
import time

import torch

from harness.alloc import AllocationTracker

from . import triton_launches
from .wire import VIEW_BASES

# Bound before any submission is imported (a submission that rebinds the module's
# attributes later does not change what the probes call).
_perf_counter = time.perf_counter
_monotonic = time.monotonic
_gc_collect = gc.collect
try:
    _malloc_trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def preload() -> None:
    """Import what the probes use (torch's compiler stack, the FLOP counter), so that
    neither their import time nor their memory lands in a submission's first measured
    call. Imports only: an op here could start torch's thread pools before the launcher
    forks its servers, and a forked child then hangs in its first parallel op."""
    import torch._dynamo  # noqa: F401  (the tracker's first use imports it: seconds of CPU)
    import torch.utils.flop_counter  # noqa: F401



def note(msg: str) -> None:
    """Where a rank is (shown when a multi-rank run times out); the server replaces it."""


# --- plumbing shared by the probes --------------------------------------------------------------

def flat(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from flat(y)
    else:
        yield x


def detach_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(detach_tree(y) for y in x)
    if isinstance(x, dict):
        return {k: detach_tree(v) for k, v in x.items()}
    return x


SDPA = "torch.nn.functional.scaled_dot_product_attention"
# A forbidden name forbids its family: the other Python ways to the same kernels (patched like
# the name), and the ATen ops (substrings of op names) the in-process op list must not show: that
# catches a ``torch.ops.aten`` overload saved at import, which no patch can reach (torch itself
# looks those packets up, so they are never replaced).
DDP = "torch.nn.parallel.DistributedDataParallel"
REDUCER = "torch.distributed.Reducer"
FAMILIES = {SDPA: ["torch._C._nn.scaled_dot_product_attention"],
            DDP: ["torch.nn.parallel.distributed.DistributedDataParallel"],
            REDUCER: ["torch._C._distributed_c10d.Reducer"]}
FAMILY_OPS = {SDPA: ("scaled_dot_product",)}


def family(names) -> list[str]:
    """``names`` with every member of their families (see ``FAMILIES``), in order, once."""
    out: list[str] = []
    for n in names:
        for m in [n] + FAMILIES.get(n, []):
            if m not in out:
                out.append(m)
    return out


def forbidden_ops(names, ops) -> list[str]:
    """The ATen op names in ``ops`` that the families of ``names`` forbid."""
    subs = [x for n in names for x in FAMILY_OPS.get(n, ())]
    return sorted(f"aten.{op}" for op in ops if any(x in op for x in subs))


def _home(target: str):
    """(owner, attribute) of a dotted name: the longest importable module prefix, then
    attributes (``torch.ops.aten.X`` is an attribute of the ``torch.ops`` object)."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:-1]:
            owner = getattr(owner, p)
        return owner, parts[-1]
    raise ValueError(f"cannot resolve {target!r}")


@contextlib.contextmanager
def forbid(names, module, reason: str, seen: list):
    """Patch each dotted name in ``names`` and its family (``FAMILIES``) to raise
    AssertionError while active: in its home module and in ``module``'s globals where
    bound by name. Every call is recorded in ``seen`` even if the caller swallows the
    error."""
    patches = []
    for target in family(names):
        home, attr = _home(target)
        original = getattr(home, attr, None)
        if original is None:  # not in this torch build
            continue

        def forbidden(*a, _t=target, **k):
            seen.append(_t)
            raise AssertionError(f"called {_t}: {reason}")
        patches.append((home, attr, original, forbidden))
        if module is not None:
            for name, value in list(vars(module).items()):
                if value is original:
                    patches.append((module, name, original, forbidden))
    try:
        for obj, attr, _, new in patches:
            setattr(obj, attr, new)
        yield
    finally:
        for obj, attr, old, new in reversed(patches):
            if getattr(obj, attr, None) is not new:  # put back during the call: as good as calling it
                seen.append(f"{getattr(obj, '__name__', type(obj).__name__)}.{attr} (put back during the call)")
            setattr(obj, attr, old)


# --- communication counter (multi-rank labs) ----------------------------------------------------

P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "_reduce_scatter_base", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "_all_gather_base", "all_gather_coalesced", "all_gather_object",
               "broadcast", "broadcast_object_list",
               "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier")
DATA_COLLECTIVES = tuple(c for c in COLLECTIVES if c not in ("barrier", "monitored_barrier"))


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _numel_list(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(_numel_list(y) for y in x)
    return 0


# ProcessGroup / Backend methods (called on the group object, bypassing the functions above)
# and the collective name each one counts as.
_PG_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce_coalesced", "allgather": "all_gather",
               "allgather_coalesced": "all_gather_coalesced", "allgather_into_tensor_coalesced": "all_gather",
               "_allgather_base": "_all_gather_base", "all_gather_single": "all_gather_single",
               "all_gather_single_coalesced": "all_gather", "reduce_scatter": "reduce_scatter",
               "_reduce_scatter_base": "_reduce_scatter_base", "reduce_scatter_single": "reduce_scatter_single",
               "reduce_scatter_single_coalesced": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
               "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
               "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "all_to_all_single": "all_to_all_single",
               "barrier": "barrier", "monitored_barrier": "monitored_barrier",
               "send": "send", "recv": "recv", "recv_anysource": "recv"}
# c10d dispatcher ops (what the functions and methods above end in; callable directly as
# ``torch.ops.c10d.<op>``) and the collective each one is
C10D_OPS = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce_coalesced", "allgather_": "all_gather",
            "_allgather_base_": "_all_gather_base", "allgather_coalesced_": "all_gather_coalesced",
            "allgather_into_tensor_coalesced_": "all_gather", "reduce_scatter_": "reduce_scatter",
            "_reduce_scatter_base_": "_reduce_scatter_base", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
            "broadcast_": "broadcast", "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter",
            "alltoall_": "all_to_all", "alltoall_base_": "all_to_all_single", "barrier": "barrier",
            "monitored_barrier_": "monitored_barrier"}
_ACTIVE: list = []        # the CommCounter in force (at most one)
_INSTALLED: list = []     # (owner, attribute, original, stand-in) replaced by install_comm_hooks


def _first_tensor_bytes(x) -> tuple[int, int]:
    """(bytes, elements) of the first tensor in ``x`` (a tensor or nested lists of them)."""
    for y in flat(x):
        if isinstance(y, torch.Tensor):
            return _nbytes(y), y.numel()
    return 0, 0


def _hook(name: str, original, method: bool):
    """A permanent stand-in for a torch.distributed function or ProcessGroup method: it
    reports to the active CommCounter (if any), forbids what it forbids, and calls through."""
    kind = name if name in P2P or name == "recv_anysource" else "collective"

    def hooked(*a, **k):
        c = _ACTIVE[-1] if _ACTIVE else None
        if c is None or c._depth > 0:  # not counting, or called from inside another counted call
            return original(*a, **k)
        args = a[1:] if method else a
        if kind in ("send", "isend", "recv", "irecv", "recv_anysource"):
            sending = kind in ("send", "isend")
            nbytes, numel = _first_tensor_bytes(args[0] if args else k.get("tensor"))
            if sending:
                c.sent_msgs += 1
                c.sent_bytes += nbytes
                c.sent_elems += numel
            else:
                c.recv_msgs += 1
                c.recv_bytes += nbytes
            c.event("send" if sending else "recv", numel=numel)
            side = "dst" if sending else "src"
            peer = k.get(side, k.get("group_" + side, args[1] if len(args) > 1 else "?"))
            note(f"in {name}({side}={peer}, {nbytes} bytes) since t={time.time():.1f}")
        elif kind == "collective" and name != "batch_isend_irecv":
            label = _PG_METHODS.get(name, name) if method else name
            c.collectives[label] = c.collectives.get(label, 0) + 1
            tensor = next((y for y in flat(list(args) + list(k.values())) if isinstance(y, torch.Tensor)), None)
            c.event("launch", op=label, numel=max([_numel_list(x) for x in list(args) + list(k.values())] or [0]),
                    dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else None,
                    async_op=bool(k.get("async_op", False)) or method)
            c.collective_elems += max([_numel_list(x) for x in list(args) + list(k.values())] or [0])
            if label in c.forbid:
                c.forbidden.append(label)
                raise AssertionError(f"called torch.distributed.{label}: the contract forbids collectives "
                                     f"here (point-to-point send/recv only)")
            note(f"in {label} since t={time.time():.1f}")
        else:  # batch_isend_irecv: its isend/irecv calls are the ones counted
            note(f"in {name} since t={time.time():.1f}")
            return original(*a, **k)
        c._depth += 1
        try:
            out = original(*a, **k)
        finally:
            c._depth -= 1
        note(f"returned from {name}")
        return out
    hooked.__name__ = getattr(original, "__name__", name)
    return hooked


def _waiting(original):
    """A stand-in for ``Work.wait`` / ``Future.wait``: records a ``wait`` event, then waits."""
    def wait(self, *a, **k):
        if _ACTIVE:
            _ACTIVE[-1].event("wait")
        return original(self, *a, **k)
    wait.__name__ = "wait"
    return wait


def install_comm_hooks() -> None:
    """Replace torch.distributed's point-to-point and collective functions, and the
    collective methods of ``ProcessGroup`` and its backends, by counting stand-ins.
    The server calls this once, before the submission is imported, so a reference
    the submission saves (``from torch.distributed import all_reduce``, a dict, a
    bound method of the group) is already the stand-in."""
    if _INSTALLED:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch._C import _distributed_c10d as C
    for name in P2P + COLLECTIVES:
        original = getattr(c10d, name, None) or getattr(dist, name, None)
        if original is None:
            continue
        new = _hook(name, original, method=False)
        for m in (dist, c10d):
            for attr, value in list(vars(m).items()):
                if value is original:
                    _INSTALLED.append((m, attr, original, new))
                    setattr(m, attr, new)
    for cls in {C.Work, getattr(c10d, "Work", C.Work), torch.futures.Future}:
        original = vars(cls).get("wait")
        if original is not None:
            new = _waiting(original)
            _INSTALLED.append((cls, "wait", original, new))
            setattr(cls, "wait", new)
    classes = [getattr(C, n) for n in ("ProcessGroup", "Backend", "ProcessGroupGloo", "ProcessGroupNCCL")
               if hasattr(C, n)]
    classes += [getattr(c10d, n) for n in ("ProcessGroupGloo", "ProcessGroupNCCL") if hasattr(c10d, n)]
    for cls in classes:
        for attr in _PG_METHODS:
            original = vars(cls).get(attr)
            if original is None:
                continue
            new = _hook(attr, original, method=True)
            _INSTALLED.append((cls, attr, original, new))
            setattr(cls, attr, new)


class CommCounter:
    """Count point-to-point messages/bytes and collective calls in this rank while active.

    ``forbid``: collective names (from ``COLLECTIVES``) that raise ``AssertionError``
    when called, through the ``torch.distributed`` functions or the group object's
    methods (recorded even if swallowed). Bytes are ``numel * element_size`` of the
    tensors passed; ``collective_elems`` adds, per collective call, the elements of its
    largest tensor argument. Counting is done by the stand-ins of
    :func:`install_comm_hooks` (installed here if the server has not already)."""

    def __init__(self, forbid=(), modules=()):
        self.forbid = set(forbid)
        unknown = self.forbid - set(COLLECTIVES) - set(P2P)
        if unknown:
            raise ValueError(f"forbid: unknown names {sorted(unknown)}")
        self.sent_msgs = self.sent_bytes = self.sent_elems = self.recv_msgs = self.recv_bytes = 0
        self.collectives: dict[str, int] = {}
        self.collective_elems = 0
        self.forbidden: list[str] = []
        self.events: list[dict] = []  # in order: launch / send / recv / wait, and the probes' own marks
        self._depth = 0  # > 0 inside a counted call: its internal calls are not counted again

    def event(self, kind: str, **fields) -> None:
        """Append ``{"k": kind, **fields}`` to the ordered event log (at most 10,000 kept)."""
        if len(self.events) < 10_000:
            self.events.append({"k": kind, **fields})

    def report(self) -> dict:
        return {"sent_msgs": self.sent_msgs, "sent_bytes": self.sent_bytes, "sent_elems": self.sent_elems,
                "recv_msgs": self.recv_msgs, "recv_bytes": self.recv_bytes,
                "collectives": dict(self.collectives), "collective_elems": self.collective_elems,
                "forbidden": list(self.forbidden), "events": list(self.events)}

    def __enter__(self):
        install_comm_hooks()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        if _ACTIVE and _ACTIVE[-1] is self:
            _ACTIVE.pop()
        return False


# --- guards: a measurement cannot be switched off or replaced unseen -------------------------
#
# The in-process figures (allocation tracker, FLOP counter, op list, forbidden calls) come from
# TorchDispatchModes and patched names in the submission's own process. To hide work from a mode
# a submission must take it off the dispatch stack or exclude the Python dispatch key; to fake a
# figure it must replace a method of the tracker or counter. Both go through the torch._C bindings
# and classes below, which install_guards() replaces by recording stand-ins before the submission
# is imported (so a reference it saves is already the stand-in). A measured call during which one
# was called, or after which one is no longer in place, fails: no honest lab solution needs them.
# (What the trusted side grades on still comes from outside where it can: resident memory, CPU time.)

_BLINDING = ("_pop_torch_dispatch_stack", "_unset_dispatch_mode", "_DisableTorchDispatch", "_ExcludeDispatchKeyGuard",
             "ExcludeDispatchKeyGuard", "_SetExcludeDispatchKeyGuard", "_dispatch_tls_set_dispatch_key_excluded")
_GUARD = {"depth": 0, "calls": [], "pushed": 0}  # depth > 0: a measured call runs; pushed: modes it pushed
_IN_PLACE: list = []  # (owner, attribute, object): what must still be there when a measured call ends


def _recording(name: str, original):
    # a mode may push itself again and pop (FlopCounterMode decomposes ops inside ``with self``):
    # a pop that balances a push made during the call is not recorded, any other pop is
    pop = name.endswith("_pop_torch_dispatch_stack")

    def standin(*a, **k):
        if _GUARD["depth"]:
            if pop and _GUARD["pushed"] > 0:
                _GUARD["pushed"] -= 1
            elif len(_GUARD["calls"]) < 10:
                _GUARD["calls"].append(name)
        return original(*a, **k)
    standin.__name__ = getattr(original, "__name__", name)
    return standin


def _pushing(original):
    def standin(*a, **k):
        if _GUARD["depth"]:
            _GUARD["pushed"] += 1
        return original(*a, **k)
    standin.__name__ = getattr(original, "__name__", "push")
    return standin


def install_guards() -> None:
    """Replace the dispatch-stack bindings of ``_BLINDING`` (in ``torch._C`` and wherever a
    loaded torch module bound them by name) and the ways to start a thread or a process
    (whose work no mode of this thread sees) by recording stand-ins, and note the methods
    of the tracker, the FLOP counter and the comm stand-ins that must stay in place. The server
    calls this before the submission is imported; idempotent."""
    if _IN_PLACE:
        return
    import sys

    from torch.utils.flop_counter import FlopCounterMode
    from torch.utils._python_dispatch import TorchDispatchMode

    torch_modules = [m for n, m in list(sys.modules.items()) if n == "torch" or n.startswith("torch.")]
    for name in _BLINDING + ("_push_on_torch_dispatch_stack",):
        original = getattr(torch._C, name, None)
        if original is None:
            continue
        standin = _pushing(original) if name == "_push_on_torch_dispatch_stack" else \
            _recording(f"torch._C.{name}", original)
        for mod in [torch._C] + torch_modules:
            for attr, value in list(getattr(mod, "__dict__", {}).items()):
                if value is original:
                    setattr(mod, attr, standin)
                    _IN_PLACE.append((mod, attr, standin))
    import _thread
    import threading
    # the dispatch mode stack is per thread: a thread or a forked copy started by the call runs unmeasured
    # (a subprocess is not guarded: Triton runs its compiler as one on the first launch of a kernel)
    for owner, attr in ((_thread, "start_new_thread"), (threading, "_start_new_thread"),
                        (_thread, "start_joinable_thread"), (threading, "_start_joinable_thread"),
                        (os, "fork"), (os, "forkpty")):
        original = getattr(owner, attr, None)
        if original is not None:
            standin = _recording(f"{owner.__name__}.{attr}", original)
            setattr(owner, attr, standin)
            _IN_PLACE.append((owner, attr, standin))
    for cls in (AllocationTracker, FlopCounterMode, TorchDispatchMode):
        for attr, value in list(vars(cls).items()):
            if callable(value) or isinstance(value, (classmethod, staticmethod)):
                _IN_PLACE.append((cls, attr, value))
    _IN_PLACE.extend((owner, attr, new) for owner, attr, _, new in _INSTALLED)


def _tampered() -> list[str]:
    return [f"{getattr(o, '__name__', o)}.{a}" for o, a, v in _IN_PLACE
            if (vars(o).get(a) if isinstance(o, type) else getattr(o, a, None)) is not v][:5]


@contextlib.contextmanager
def guarded():
    """Around a submission's measured call: raise AssertionError afterwards if the call
    switched a measurement off (called a ``_BLINDING`` binding) or replaced part of one."""
    install_guards()
    _GUARD["depth"] += 1
    if _GUARD["depth"] == 1:
        _GUARD["calls"], _GUARD["pushed"] = [], 0
    try:
        yield
    finally:
        _GUARD["depth"] -= 1
    problems = sorted(set(_GUARD["calls"])) + _tampered()
    if problems and _GUARD["depth"] == 0:
        raise AssertionError(f"the measurement was switched off or replaced during the call ({', '.join(problems)}); "
                             "the lab's code must run under the grader's measurements (no torch dispatch-stack "
                             "manipulation, no patching of the harness)")


# --- measure: allocations, ops, FLOPs, forbidden calls, communication ------------------------

def _figures(tracker, counter, seen, comm) -> dict:
    extra = {"forbidden": sorted(set(seen))}
    if tracker is not None:
        extra.update(max_numel=tracker.max_numel, max_bytes=tracker.max_bytes, total_bytes=tracker.total_bytes,
                     largest=tracker.largest, ops=sorted(tracker.ops), nonfinite=tracker.first_nonfinite,
                     c10d=[list(c) for c in tracker.c10d_calls])
    if counter is not None:
        extra["flops"] = int(counter.get_total_flops())
    if comm is not None:
        extra["comm"] = comm.report()
    return extra


@contextlib.contextmanager
def _watched(module, opts: dict):
    """The measurement context of ``opts`` (see client.measure); yields a dict filled with figures."""
    seen: list = []
    box: dict = {}
    tracker = counter = comm = launches = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(forbid(opts.get("forbid", []), module, opts.get("reason", "the contract forbids it"),
                                   seen))
        if opts.get("comm"):
            comm = stack.enter_context(CommCounter(forbid=opts.get("comm_forbid", ())))
        if opts.get("no_grad"):
            stack.enter_context(torch.no_grad())
        if opts.get("triton") and triton_launches.install():  # in-process: installed on first use
            launches = stack.enter_context(triton_launches.counting())
        if opts.get("flops"):
            from torch.utils.flop_counter import FlopCounterMode
            counter = stack.enter_context(FlopCounterMode(display=False))
        if opts.get("alloc", True) or opts.get("ops", True) or opts.get("nonfinite"):
            tracker = AllocationTracker(watch_nonfinite=bool(opts.get("nonfinite")))
            if comm is not None:  # every collective dispatcher op, in the counter's ordered log too
                tracker.on_c10d = lambda op, numel, sent=None: comm.event(
                    "c10d", op=op, numel=numel, **({} if sent is None else {"sent": sent}))
            stack.enter_context(tracker)
        t0 = _perf_counter()
        with guarded():
            yield box
        box["wall_in"] = _perf_counter() - t0
    if tracker is not None:
        seen.extend(forbidden_ops(opts.get("forbid", []), tracker.ops))
        if comm is not None:  # reached as c10d ops (``torch.ops.c10d.allreduce_``, ``.send``), past every stand-in
            comm.forbidden.extend(sorted({C10D_OPS[op] for op in tracker.ops if C10D_OPS.get(op) in comm.forbid}
                                         - set(comm.forbidden)))
            comm.sent_bytes = max(comm.sent_bytes, tracker.c10d_sent_bytes)
    box.update(_figures(tracker, counter, seen, comm))
    if opts.get("triton"):
        box["triton_launches"] = launches.launches if launches is not None else 0


def _base_of(x):
    hit = VIEW_BASES.get(id(x))
    return hit[1] if hit is not None and hit[0] is x else x


def probe_measure(module, target, args, kwargs, opts):
    """``target(*args, **kwargs)`` under the context ``opts`` asks for. With
    ``opts["return_args"]`` the value is ``{"out", "args", "same"}``: the arguments
    after the call (a ``View`` argument as its base) and, per argument, whether the
    output is that very object (in-place contracts)."""
    with _watched(module, opts) as box:
        out = target(*args, **kwargs)
    if opts.get("return_args"):
        out = {"out": out, "args": [_base_of(a) for a in args], "same": [out is a for a in args]}
    return out, box


def _leaves(args, requires_grad) -> list:
    """The arguments of a differentiated call: each tensor detached (a fresh leaf), and requiring
    grad where ``requires_grad[i]`` is true (a list shorter than ``args`` means False)."""
    return [a.detach().requires_grad_(bool(i < len(requires_grad) and requires_grad[i]))
            if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]


def probe_vjp(module, target, args, kwargs, grad_outputs, opts):
    """Forward then ``torch.autograd.backward`` with ``grad_outputs``; value ``(out, grads)``."""
    leaves = _leaves(args, opts.get("requires_grad", []))
    seen: list = []
    figures: dict = {}
    with forbid(opts.get("forbid", []), module, opts.get("reason", "the contract forbids it"), seen):
        with guarded():
            out = target(*leaves, **kwargs)
        outs = [t for t in flat(out) if isinstance(t, torch.Tensor)]
        g = [x for x in flat(grad_outputs) if isinstance(x, torch.Tensor)] if grad_outputs is not None else None
        pairs = [(o, gg) for o, gg in zip(outs, g or [None] * len(outs)) if o.requires_grad]
        if not pairs:
            raise AssertionError("the output does not require grad: no autograd graph reaches the inputs "
                                 "(detached, computed under no_grad, or not built from them)")
        tracker = AllocationTracker() if opts.get("measure_backward") else None
        with tracker if tracker is not None else contextlib.nullcontext(), guarded():
            torch.autograd.backward([o for o, _ in pairs], [x for _, x in pairs] if g is not None else None)
        if tracker is not None:
            seen.extend(forbidden_ops(opts.get("forbid", []), tracker.ops))
            figures = _figures(tracker, None, seen, None)
    grads = tuple(a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in leaves)
    figures["forbidden"] = sorted(set(seen))
    return (detach_tree(out), grads), figures


def probe_saved_tensors(module, target, args, kwargs, opts):
    """``(out, [tensors saved for backward by out.grad_fn])``."""
    leaves = _leaves(args, opts.get("requires_grad", []))
    out = target(*leaves, **kwargs)
    saved = list(getattr(getattr(out, "grad_fn", None), "saved_tensors", ()) or ())
    return (out.detach() if isinstance(out, torch.Tensor) else out, [t.detach() for t in saved]), {}


def probe_settle(module, target=None):
    """Collect garbage and give freed heap memory back to the system (glibc ``malloc_trim``),
    so that the resident memory the trusted side reads next from /proc is live memory."""
    _gc_collect()
    if _malloc_trim is not None:
        _malloc_trim(0)
    return None, {}


def probe_param_grads(module, target):
    return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in target.named_parameters()}, {}


# --- object introspection ------------------------------------------------------------------------

def held_tensors(obj, deep=False):
    """Tensors held by ``obj``'s attributes (also inside lists, tuples and dicts, 3 levels);
    ``deep``: every tensor reachable from ``obj`` (:func:`reachable_tensors`)."""
    if deep:
        return reachable_tensors(obj)
    found = []

    def visit(x, d):
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif d < 3 and isinstance(x, (list, tuple)):
            for y in x:
                visit(y, d + 1)
        elif d < 3 and isinstance(x, dict):
            for y in x.values():
                visit(y, d + 1)

    for value in vars(obj).values():
        visit(value, 0)
    return found


_NOT_ENTERED = (type, type(contextlib), type(len), type(flat), str, bytes, int, float, complex)


def reachable_tensors(obj, limit=100_000):
    """Every tensor reachable from ``obj``, each once, depth first in definition order: through
    attributes (``__dict__``, ``__slots__``; an ``nn.Module``'s parameters and buffers are in its
    ``__dict__``), list, tuple and set items, dict keys and values, at any depth. Each object is
    entered once (a cycle ends); classes, modules and functions are not entered, at most ``limit``
    objects are."""
    found, seen, stack = [], set(), [obj]
    while stack and len(seen) < limit:
        x = stack.pop()
        if id(x) in seen or isinstance(x, _NOT_ENTERED):
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            found.append(x)
            continue
        if isinstance(x, dict):
            inner = [y for kv in x.items() for y in kv]
        elif isinstance(x, (list, tuple, set, frozenset)):
            inner = list(x)
        else:
            d = getattr(x, "__dict__", None)
            inner = list(d.values()) if isinstance(d, dict) else []
            for cls in type(x).__mro__:
                slots = getattr(cls, "__slots__", ())
                for name in [slots] if isinstance(slots, str) else slots:
                    if isinstance(name, str) and name not in ("__dict__", "__weakref__") and hasattr(x, name):
                        inner.append(getattr(x, name))
        stack += reversed(inner)
    return found


def _storages(obj, deep=False):
    return {int(t.untyped_storage().data_ptr()): int(t.untyped_storage().nbytes())
            for t in held_tensors(obj, deep)}


def probe_storages(module, target, deep=False):
    return _storages(target, deep), {}


def probe_raw_bytes(module, target, deep=False):
    return [torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone()
            for t in held_tensors(target, deep)], {}


def probe_fill(module, target, value, deep=False):
    """Fill every floating tensor ``target`` holds with ``value``; the value: how many were filled."""
    floats = [t for t in held_tensors(target, deep) if t.is_floating_point()]
    for t in floats:
        t.fill_(float(value))
    return len(floats), {}


def probe_call_views(module, target, fn, args, kwargs, deep=False):
    """``(out, [output tensor i is a view of a storage target holds])``."""
    ptrs = set(_storages(target, deep))
    out = fn(*args, **kwargs)
    flags = [int(t.untyped_storage().data_ptr()) in ptrs for t in flat(out) if isinstance(t, torch.Tensor)]
    return (out, flags), {}


_WATCH: dict = {}


def probe_watch_begin(module, target, cls_name, method, deep=False):
    """Replace ``module.<cls_name>`` by a subclass that records, for every instance, the
    storages held after ``__init__`` (``deep``: every storage reachable from it) and flags a
    ``method`` call after which they changed; ``bare`` counts instances holding none."""
    module = target
    base = getattr(module, cls_name)
    report = {"created": 0, "bare": 0, "violations": []}

    class Watched(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._labs_ptrs = set(_storages(self, deep)) - {None}
            report["created"] += 1
            report["bare"] += not self._labs_ptrs

        def _labs_check(self, where):
            now = set(_storages(self, deep)) - {None}
            if now != self._labs_ptrs and len(report["violations"]) < 5:
                report["violations"].append(where)

    def wrapped(self, *a, _m=getattr(base, method), **k):
        out = _m(self, *a, **k)
        Watched._labs_check(self, f"{method}({', '.join(repr(x) for x in a if isinstance(x, (int, str)))})"
                                  f" at seq_len {getattr(self, 'seq_len', '?')}")
        return out

    setattr(Watched, method, wrapped)
    Watched.__name__ = Watched.__qualname__ = base.__name__
    _WATCH[id(module), cls_name] = (base, report)
    setattr(module, cls_name, Watched)
    return None, {}


def probe_watch_end(module, target, cls_name):
    module = target
    base, report = _WATCH.pop((id(module), cls_name))
    setattr(module, cls_name, base)
    return dict(report), {}


def probe_reachable_bytes(module, target, exclude):
    """Bytes of every tensor storage reachable from ``target`` (attributes, slots, dicts,
    lists, ...), except storages shared with the tensors in ``exclude`` or their grads.
    Value ``{"total": bytes, "largest": description}``."""
    skip_ptrs = set()
    for p in exclude:
        skip_ptrs.add(p.untyped_storage().data_ptr())
        if p.grad is not None:
            skip_ptrs.add(p.grad.untyped_storage().data_ptr())
    seen_obj, seen_storage = set(), set()
    total, largest = 0, (0, "")
    stack = [(target, "opt")]
    skip_types = (type, type(contextlib), type(len), type(held_tensors))
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen_obj or isinstance(obj, skip_types) or isinstance(obj, (str, bytes, int, float, bool)):
            continue
        seen_obj.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            key = st.data_ptr()
            if key in skip_ptrs or key in seen_storage or st.nbytes() == 0:
                continue
            seen_storage.add(key)
            total += st.nbytes()
            if st.nbytes() > largest[0]:
                largest = (st.nbytes(), f"{path}: {tuple(obj.shape)} {obj.dtype}, storage {st.nbytes()} bytes")
            continue
        if isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((k, f"{path}[key]"))
                stack.append((v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[..]"))
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(obj):
                stack.append((v, f"{path}[{i}]"))
        else:
            d = getattr(obj, "__dict__", None)
            if isinstance(d, dict):
                for k, v in d.items():
                    stack.append((v, f"{path}.{k}"))
            for k in getattr(type(obj), "__slots__", ()):
                if isinstance(k, str) and hasattr(obj, k):
                    stack.append((getattr(obj, k), f"{path}.{k}"))
    return {"total": total, "largest": largest[1]}, {}


# --- process groups (multi-rank labs; the ranks run these, never a grader's code) ---------------

def probe_init_pg(module, rank, world_size, backend, store_path, timeout_s):
    """Join a fresh process group through a ``FileStore`` in the sandbox's private /tmp."""
    import torch.distributed as dist
    store = dist.FileStore(store_path, world_size)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    dist.barrier(device_ids=[rank]) if backend == "nccl" else dist.barrier()
    note("process group ready")
    return None, {}


def probe_destroy_pg(module):
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    return None, {}


def probe_new_groups(module, members):
    """``dist.new_group(m)`` for each member list, in order (every rank calls it);
    value: the groups this rank belongs to (None where it does not)."""
    import torch.distributed as dist
    rank = dist.get_rank()
    out = []
    for m in members:
        g = dist.new_group(list(m))
        out.append(g if rank in m else None)
    return out, {}


def probe_keep(module, value):
    """Keep ``value`` (e.g. a tensor that must stay in the worker between calls) and
    answer with a handle to it."""
    return value, {"keep": True}


# --- training steps (data-parallel labs): a trusted model on the rank, one backward watched ----------

class TrainNet(torch.nn.Module):
    """The model a data-parallel grader trains on each rank (trusted code, built here by
    :func:`probe_build_model` so that gradient-ready events are seen first).

    ``spec["layers"]``: a list of ``{"name", "in", "out", "bias", "dtype", "frozen"}``
    linear layers applied in order, ``tanh`` between them; ``forward(x, skip=())`` leaves
    out the layers named in ``skip`` (each of them square: unused parameters). The input
    is cast to each layer's dtype; the output is float32 times the buffer ``scale``
    (``(out,)``, broadcast at construction like every buffer). Every trainable parameter
    records a ``ready`` event (its name) in the active communication counter when its
    gradient is accumulated (``register_post_accumulate_grad_hook``, registered before
    any wrapper's hooks)."""

    def __init__(self, spec: dict):
        super().__init__()
        self.watch = bool(spec.get("watch"))
        self.layers = torch.nn.ModuleDict()
        for L in spec["layers"]:
            lin = torch.nn.Linear(int(L["in"]), int(L["out"]), bias=bool(L.get("bias", True)),
                                  dtype=getattr(torch, L.get("dtype", "float32")))
            if L.get("frozen"):
                lin.requires_grad_(False)
            self.layers[L["name"]] = lin
        if spec["layers"]:
            self.register_buffer("scale", torch.ones(int(spec["layers"][-1]["out"])))
        for name, p in self.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(_ready_event(name))

    def forward(self, x, skip=()):
        if not self.watch:
            return self._forward(x, skip)
        stats = _STAGE_STATS.setdefault(id(self), _stage_stats())
        call = len(stats["rows"])
        stats["rows"].append(int(x.shape[0]) if x.dim() else 0)
        stats["actions"].append(["F", call])
        with torch.autograd.graph.saved_tensors_hooks(lambda t: _Saved(t, stats, call), _Saved.unpack):
            y = self._forward(x, skip)
        if y.requires_grad:
            y.register_hook(_backward_mark(stats, call))
        return y

    def _forward(self, x, skip):
        if not self.layers:  # a stage without parameters
            return torch.tanh(x)
        names = [n for n in self.layers if n not in skip]
        for i, n in enumerate(names):
            lin = self.layers[n]
            x = lin(x.to(lin.weight.dtype))
            if i < len(names) - 1:
                x = torch.tanh(x)
        return x.to(torch.float32) * self.scale


# Pipeline stages (``spec["watch"]``): per TrainNet, its calls (rows of each input), the order of
# forward calls and backward starts (the hook on each call's output), and how many calls hold
# saved tensors (from the first tensor autograd saves in the call until autograd frees the last).
_STAGE_STATS: dict = {}


def _stage_stats() -> dict:
    return {"rows": [], "actions": [], "live": {}, "held": 0, "peak_held": 0}


def _backward_mark(stats, call):
    def mark(grad):
        stats["actions"].append(["B", call])
    return mark


class _Saved:
    """A tensor autograd saved during one watched call; counts the call as held while alive."""

    __slots__ = ("t", "stats", "call", "__weakref__")

    def __init__(self, t, stats, call):
        self.t, self.stats, self.call = t, stats, call
        live = stats["live"]
        live[call] = live.get(call, 0) + 1
        if live[call] == 1:
            stats["held"] += 1
            stats["peak_held"] = max(stats["peak_held"], stats["held"])

    @staticmethod
    def unpack(saved):
        return saved.t

    def __del__(self):
        live = self.stats["live"]
        live[self.call] -= 1
        if not live[self.call]:
            self.stats["held"] -= 1


def probe_stage_stats(module, target, reset=False):
    """What the watched TrainNet ``target`` saw (see ``_STAGE_STATS``): ``rows``, ``actions``
    (``["F", call]``, ``["B", call]`` in order), ``peak_held``, ``held`` (now, after a collection);
    ``reset``: start afresh (before a call)."""
    if reset:
        _STAGE_STATS[id(target)] = _stage_stats()
        return None, {}
    _gc_collect()
    st = _STAGE_STATS.get(id(target), _stage_stats())
    return {k: v for k, v in st.items() if k != "live"}, {}


TORCH_FUNCTIONS = {"torch.nn.functional.mse_loss": torch.nn.functional.mse_loss,
                   "torch.nn.functional.cross_entropy": torch.nn.functional.cross_entropy,
                   "torch.nn.functional.relu": torch.nn.functional.relu,
                   "torch.nn.functional.silu": torch.nn.functional.silu}


def probe_torch_function(module, dotted):
    """A handle to one of ``TORCH_FUNCTIONS`` (bound before the submission is imported), e.g.
    a loss function or an activation a grader passes to the submission."""
    if dotted not in TORCH_FUNCTIONS:
        raise ValueError(f"{dotted!r} is not one of {sorted(TORCH_FUNCTIONS)}")
    return TORCH_FUNCTIONS[dotted], {"keep": True}


def _ready_event(name: str):
    def ready(_param) -> None:
        if _ACTIVE:
            _ACTIVE[-1].event("ready", p=name)
    return ready


_MODEL_OBJECTS: dict = {}  # id(TrainNet) -> its Parameter and buffer objects as built (see probe_wraps)


def probe_build_model(module, spec, state, device="cpu"):
    """A :class:`TrainNet` from ``spec`` with ``state`` (a state dict, strict) kept on this rank,
    on ``device`` (e.g. ``"cuda:1"``)."""
    net = TrainNet(spec)
    net.load_state_dict(state, strict=True)
    net.to(torch.device(device))
    _MODEL_OBJECTS[id(net)] = {"params": dict(net.named_parameters()), "buffers": dict(net.named_buffers())}
    return net, {"keep": True}


def probe_build_linear(module, weight, bias):
    """A ``torch.nn.Linear`` holding copies of ``weight (out, in)`` and ``bias (out,)`` (or
    None), kept on this rank (a layer the submission shards)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, dtype=weight.dtype)
    with torch.no_grad():
        lin.weight.copy_(weight)
        if bias is not None:
            lin.bias.copy_(bias)
    return lin, {"keep": True}


def probe_wraps(module, target, model):
    """Whether the wrapper ``target`` holds ``model`` itself: ``module`` (``target.module is
    model``, a registered submodule), ``same_params`` / ``same_buffers`` (the model's own
    Parameter and buffer objects are still the model's, in place)."""
    held = getattr(target, "_modules", {}).get("module") if isinstance(target, torch.nn.Module) else None
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    return {"module": held is model,
            "same_params": all(p is params.get(n) for n, p in _MODEL_OBJECTS.get(id(model), {}).get("params", {}).items()),
            "same_buffers": all(b is buffers.get(n) for n, b in _MODEL_OBJECTS.get(id(model), {}).get("buffers", {}).items())}, {}


def probe_torch_ddp(module, target, bucket_cap_mb):
    """``torch.nn.parallel.DistributedDataParallel(target, bucket_cap_mb=...)`` on this rank
    (the trusted baseline of a data-parallel step; the class bound before the submission was
    imported), kept here."""
    return _TORCH_DDP(target, bucket_cap_mb=float(bucket_cap_mb)), {"keep": True}


def probe_step_fn(module, target):
    """A training step of ``target`` (a module or a wrapper of one) as one callable, kept here
    for :func:`probe_timed`: ``step(x, grad_output)`` runs ``out = target(x)``,
    ``out.backward(grad_output)``, sets every parameter's ``.grad`` of ``target`` to None (no
    update: each call does the same work) and returns ``[out, grads]``: ``out`` detached and
    the gradients it set, in ``target.parameters()`` order (None where none), so that a
    timed step is graded on what it computed."""
    def step(x, grad_output):
        out = target(x)
        torch.autograd.backward(out, grad_output)
        grads = []
        for p in target.parameters():
            grads.append(p.grad)
            p.grad = None
        return [out.detach(), grads]
    return step, {"keep": True}


def probe_state(module, target):
    """``target.state_dict()`` (parameters and buffers), detached copies."""
    return {k: v.detach().clone() for k, v in target.state_dict().items()}, {}


def probe_backward(module, target, model, args, kwargs, grad_output, opts):
    """One training step of ``target`` (e.g. a data-parallel wrapper of ``model``) under the
    communication counter: ``out = target(*args, **kwargs)``, ``out.backward(grad_output)``
    (inside ``target.no_sync()`` when ``opts["no_sync"]``), then, with ``opts["lr"]``, a plain
    SGD step on ``model``'s parameters (None: no model) and their gradients set to None. With
    ``opts["input_grads"]`` the floating tensor arguments require grad and the value also
    holds ``out`` and their ``input_grads`` (no SGD step). The counter's event
    log gets ``forward_done`` and ``backward_done`` marks. ``opts``: ``forbid`` (dotted names
    as in ``measure``), ``comm_forbid``. Value: ``{"grads", "params"}`` of ``model`` (name to
    tensor; a gradient None where it has none) after backward and after the step."""
    if opts.get("input_grads"):
        args = [a.detach().requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                for a in args]
    with _watched(module, {"comm": True, "comm_forbid": opts.get("comm_forbid", ()), "forbid": opts.get("forbid", []),
                           "alloc": False, "ops": True}) as box:
        counter = _ACTIVE[-1]
        with target.no_sync() if opts.get("no_sync") else contextlib.nullcontext():
            out = target(*args, **kwargs)
            counter.event("forward_done")
            torch.autograd.backward(out, grad_output)
        counter.event("backward_done")
    named = list(model.named_parameters()) if model is not None else []
    grads = {n: None if p.grad is None else p.grad.detach().clone() for n, p in named}
    if opts.get("input_grads"):
        return {"grads": grads, "params": {n: p.detach().clone() for n, p in named}, "out": detach_tree(out),
                "input_grads": [a.grad.detach().clone() if isinstance(a, torch.Tensor) and a.grad is not None
                                else None for a in args]}, box
    lr = opts.get("lr")
    if lr:
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
                p.grad = None
    return {"grads": grads, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}, box


# --- recomputation and loss scaling (activation checkpointing, mixed precision) ------------------
#
# A trusted function to checkpoint (``RecomputeNet``, built next to the code by
# ``probe_build_recompute``), one forward/backward watched end to end (``probe_recompute``:
# what autograd saved, what ``ctx`` objects keep, which calls ran in which phase, the global RNG
# before and after), a loss scaler driven through a scripted sequence of gradients
# (``probe_scaler_run``) and training steps of a trusted model (``probe_train_steps``). The
# trusted side runs the same probes in-process on torch's own ``GradScaler``
# (``GradScalerAdapter``) or a direct call for its oracle, and compares what comes back.

_RECOMPUTE_PHASE = ["idle"]  # what probe_recompute / probe_train_steps is doing (RecomputeNet logs it)
_RECOMPUTE_SEQ = [0]  # RecomputeNet calls so far, all modules together (the order of calls across modules)
_dropout = torch.nn.functional.dropout
_ACTIVATIONS = {"tanh": torch.tanh, "gelu": torch.nn.functional.gelu, "relu": torch.relu}
_saved_tensors_hooks = torch.autograd.graph.saved_tensors_hooks
_BackwardCFunction = torch.autograd.function.BackwardCFunction
_GradScaler = torch.amp.GradScaler
# a submission must not hide what autograd saves from the grader's own hooks
SAVED_HOOKS = ["torch.autograd.graph.saved_tensors_hooks", "torch._C._autograd._push_saved_tensors_default_hooks"]


def _autocast_state(device_type: str) -> list:
    return [bool(torch.is_autocast_enabled(device_type)),
            str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")]


def _autocast(spec):
    """``None``: leave autocast as it is; ``"off"``: ``torch.autocast("cpu", enabled=False)``;
    ``"float16"`` / ``"bfloat16"`` (optionally ``"cuda:bfloat16"``): autocast on with that dtype."""
    if spec is None:
        return contextlib.nullcontext()
    device, _, dt = str(spec).rpartition(":")
    if dt == "off":
        return torch.autocast(device or "cpu", enabled=False)
    return torch.autocast(device or "cpu", dtype=getattr(torch, dt))


class RecomputeNet(torch.nn.Module):
    """A trusted function for recomputation graders (activation checkpointing, AMP steps).

    ``spec``: ``{"d_in", "d_hidden", "d_out", "act" ("tanh" | "gelu" | "relu"), "p" (dropout,
    always applied as in training; 0: none), "residual" (add the input: d_in == d_out, a block
    that keeps x's shape)}``. ``forward(x, w=None, alpha=1.0, act=None, idx=None)``:
    ``h = act(inp(x) * w) * alpha`` (``w`` a tensor broadcast over the hidden features, or
    None; ``act`` a string, None: the spec's), dropout, ``y = out(h)`` (+ ``x``), then the
    rows ``idx`` (an integer tensor) of ``y`` when given. Each call appends ``[phase, grad
    enabled, autocast enabled, autocast dtype, seq]`` (autocast of ``x``'s device type; ``seq``
    numbers the calls of every RecomputeNet in this process in order) to ``log``."""

    def __init__(self, spec: dict):
        super().__init__()
        self.inp = torch.nn.Linear(int(spec["d_in"]), int(spec["d_hidden"]))
        self.out = torch.nn.Linear(int(spec["d_hidden"]), int(spec["d_out"]))
        self.act = str(spec.get("act", "tanh"))
        self.p = float(spec.get("p", 0.0))
        self.residual = bool(spec.get("residual", False))
        self.log: list = []

    def forward(self, x, w=None, alpha=1.0, act=None, idx=None):
        _RECOMPUTE_SEQ[0] += 1
        if len(self.log) < 1000:
            self.log.append([_RECOMPUTE_PHASE[0], torch.is_grad_enabled()] + _autocast_state(x.device.type)
                            + [_RECOMPUTE_SEQ[0]])
        h = self.inp(x)
        if w is not None:
            h = h * w
        h = _ACTIVATIONS[act or self.act](h) * alpha
        if self.p:
            h = _dropout(h, self.p, training=True)
        y = self.out(h)
        if self.residual:
            y = y + x
        return y if idx is None else y.index_select(0, idx)


def probe_build_recompute(module, specs, states):
    """A list of :class:`RecomputeNet`, one per spec, each loaded from its state dict (strict),
    kept in this process."""
    nets = []
    for spec, state in zip(specs, states):
        net = RecomputeNet(spec)
        net.load_state_dict(state, strict=True)
        nets.append(net)
    return nets, {"keep": True}


def _ptr(t) -> int:
    return int(t.untyped_storage().data_ptr())


def _custom_nodes(root, limit=10_000):
    """The custom ``autograd.Function`` nodes (``BackwardCFunction``) of the graph behind ``root``."""
    found, seen, stack = [], set(), [root]
    while stack and len(seen) < limit:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, _BackwardCFunction):
            found.append(node)
        stack += [n for n, _ in getattr(node, "next_functions", ())]
    return found


def _graph_saved(root, skip_ptrs, limit=10_000) -> tuple[int, list]:
    """Bytes of the distinct storages the graph behind ``root`` holds for backward, read from its
    nodes (``_saved_*`` attributes; a custom node's ``saved_tensors``), those in ``skip_ptrs``
    left out, and a few descriptions: a count that no saved-tensors hook of the code can hide."""
    seen_nodes, seen, stack, total, desc = set(), set(), [root], 0, []
    while stack and len(seen_nodes) < limit:
        node = stack.pop()
        if node is None or id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        values = []
        for name in dir(node):
            if name.startswith("_saved_"):
                try:
                    values.append(getattr(node, name))
                except Exception:  # noqa: BLE001 - a freed or unreadable slot holds nothing
                    continue
        if isinstance(node, _BackwardCFunction):
            try:
                values.extend(node.saved_tensors)
            except Exception:  # noqa: BLE001
                pass
        for t in flat(values):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            ptr, nbytes = int(st.data_ptr()), int(st.nbytes())
            if nbytes and ptr not in skip_ptrs and ptr not in seen:
                seen.add(ptr)
                total += nbytes
                if len(desc) < 5:
                    desc.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} held by {type(node).__name__}")
        stack += [n for n, _ in getattr(node, "next_functions", ())]
    return total, desc


def probe_recompute(module, target, args, kwargs, watch, grad_output, opts):
    """One forward ``out = target(*args, **kwargs)`` and ``torch.autograd.backward(out, grad_output)``,
    watched (``watch``: the trusted modules involved, e.g. :class:`RecomputeNet` s).

    Under ``torch.random.fork_rng`` (this process's RNG is left as it was): ``torch.manual_seed(
    opts["seed"])``; the forward under ``opts["autocast_forward"]`` (see ``_autocast``) and a
    ``saved_tensors_hooks`` pair that records every storage autograd packs (each once; the
    watched modules' parameters left out); ``opts["draws"]`` numbers drawn from the global RNG
    (``mid``); the backward under ``opts["autocast_backward"]``; 8 numbers drawn (``after``).
    ``opts["requires_grad"]``: per positional argument (tensors are detached first);
    ``forbid`` / ``reason`` as in ``measure`` (plus ``SAVED_HOOKS``), around forward and backward.

    Value: ``out`` (detached), ``grads`` (per positional argument), ``param_grads`` (per watched
    module), ``logs`` (per watched module, its ``log`` of this run), ``packed_bytes``,
    ``packed_count``, ``packed`` (a few descriptions), ``grad_fn`` (``{"type", "custom",
    "forward"}``: the output's node, whether it is a custom Function's, and that Function's
    class), ``kept`` (floating tensors that custom nodes of the graph keep as attributes, other
    than the arguments and parameters: descriptions), ``kept_bytes``, ``functions`` (the classes of
    the graph's custom Functions), ``graph_saved_bytes`` and ``graph_saved`` (what the graph's nodes
    hold for backward when forward returns, read from the nodes, parameters left out: a cross-check
    of the hooks' count), ``mid``, ``after``,
    ``backward_error`` (None, or what backward raised), ``forbidden``."""
    leaves = _leaves(args, opts.get("requires_grad", []))
    nets = list(watch) if watch is not None else []
    param_ptrs = {_ptr(p) for net in nets for p in net.parameters()}
    arg_ptrs = {_ptr(a) for a in flat(leaves) if isinstance(a, torch.Tensor)}
    for net in nets:
        net.zero_grad(set_to_none=True)
        if hasattr(net, "log"):
            net.log = []
    packed: dict = {}
    alive: list = []  # the packed tensors, alive until forward ends (no storage reused under a key)

    def pack(t):
        st = t.untyped_storage()
        ptr, nbytes = int(st.data_ptr()), int(st.nbytes())
        if nbytes and ptr not in param_ptrs and ptr not in packed:
            packed[ptr] = (nbytes, f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}")
            alive.append(t)
        return t

    seen: list = []
    names = list(opts.get("forbid", [])) + SAVED_HOOKS
    reason = opts.get("reason", "the contract forbids it")
    value: dict = {"backward_error": None}
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(opts.get("seed", 0)))
            _RECOMPUTE_PHASE[0] = "forward"
            with _autocast(opts.get("autocast_forward")), _saved_tensors_hooks(pack, lambda t: t):
                with forbid(names, module, reason, seen), guarded():
                    out = target(*leaves, **kwargs)
            alive.clear()
            _RECOMPUTE_PHASE[0] = "between"
            gf = getattr(out, "grad_fn", None)
            fwd = getattr(type(gf), "_forward_cls", None)
            value["grad_fn"] = {"type": f"{type(gf).__module__}.{type(gf).__qualname__}" if gf is not None else "",
                                "custom": isinstance(gf, _BackwardCFunction),
                                "forward": f"{fwd.__module__}.{fwd.__qualname__}" if fwd is not None else ""}
            kept, kept_bytes, kept_ptrs = [], 0, set()
            for node in _custom_nodes(gf):
                for t in reachable_tensors(node):
                    ptr = _ptr(t)
                    if not t.is_floating_point() or ptr in arg_ptrs or ptr in param_ptrs or ptr in kept_ptrs:
                        continue
                    kept_ptrs.add(ptr)
                    kept_bytes += int(t.untyped_storage().nbytes())
                    if len(kept) < 5:
                        kept.append(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} held by "
                                    f"{type(node).__qualname__}")
            value.update(kept=kept, kept_bytes=kept_bytes, functions=sorted(
                {f"{c.__module__}.{c.__qualname__}" for c in (getattr(type(n), "_forward_cls", None)
                                                            for n in _custom_nodes(gf)) if c is not None}))
            value["graph_saved_bytes"], value["graph_saved"] = _graph_saved(gf, param_ptrs)
            value["mid"] = torch.rand(int(opts.get("draws", 4)))
            _RECOMPUTE_PHASE[0] = "backward"
            try:
                with _autocast(opts.get("autocast_backward")):
                    with forbid(names, module, reason, seen), guarded():
                        torch.autograd.backward(out, grad_output)
            except AssertionError:
                raise
            except Exception as e:  # noqa: BLE001 - what backward raised is graded, with its words
                value["backward_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            _RECOMPUTE_PHASE[0] = "idle"
            value["after"] = torch.rand(8)
    finally:
        _RECOMPUTE_PHASE[0] = "idle"
    value.update(
        out=detach_tree(out),
        grads=[a.grad.detach().clone() if isinstance(a, torch.Tensor) and a.requires_grad and a.grad is not None
               else None for a in leaves],
        param_grads=[{n: None if p.grad is None else p.grad.detach().clone() for n, p in net.named_parameters()}
                     for net in nets],
        logs=[list(getattr(net, "log", [])) for net in nets],
        packed_bytes=sum(b for b, _ in packed.values()), packed_count=len(packed),
        packed=[d for _, d in sorted(packed.values(), key=lambda bd: -bd[0])[:5]],
        forbidden=sorted(set(seen)))
    return value, {}


class GradScalerAdapter:
    """``torch.amp.GradScaler(device, **kwargs)`` behind the interface the loss-scaler graders
    drive: ``scale(loss)``, ``unscale_(optimizer)``, ``step(optimizer) -> bool`` (whether the
    optimizer stepped), ``update()``, ``scale_value`` (a float). Trusted: the graders' oracle."""

    def __init__(self, device: str = "cpu", **kwargs):
        self.scaler = _GradScaler(device, **kwargs)

    def scale(self, loss):
        return self.scaler.scale(loss)

    def unscale_(self, optimizer):
        self.scaler.unscale_(optimizer)

    def step(self, optimizer) -> bool:
        self.scaler.step(optimizer)
        state = self.scaler._per_optimizer_states[id(optimizer)]
        return not sum(float(v.item()) for v in state["found_inf_per_device"].values())

    def update(self):
        self.scaler.update()

    @property
    def scale_value(self) -> float:
        return float(self.scaler.get_scale())


def _optimizer(spec: dict, params):
    """``torch.optim.SGD`` (``{"name": "sgd", "lr", "momentum"}``) or ``AdamW``
    (``{"name": "adamw", "lr", "weight_decay"}``) over ``params``."""
    params = list(params)
    if spec.get("name", "sgd") == "adamw":
        return torch.optim.AdamW(params, lr=float(spec.get("lr", 1e-2)), weight_decay=float(spec.get("weight_decay", 0.0)))
    return torch.optim.SGD(params, lr=float(spec.get("lr", 0.1)), momentum=float(spec.get("momentum", 0.0)))


def _opt_state(opt) -> list:
    """Per parameter (in param-group order), its optimizer state's tensors (copies) and numbers."""
    out = []
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            out.append({k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()
                        if isinstance(v, (torch.Tensor, int, float))})
    return out


def _scale_value(scaler):
    v = getattr(scaler, "scale_value")
    return v if type(v) in (float, int) else f"<{type(v).__name__}>"


def _counting_step(opt):
    """Count ``opt.step`` calls (an instance attribute in front of the class's method)."""
    calls = [0]
    inner = opt.step

    def step(*a, **k):
        calls[0] += 1
        return inner(*a, **k)
    opt.step = step
    return calls


def probe_scaler_run(module, target, kwargs, params, script, opts):
    """Drive a loss scaler ``target(**kwargs)`` (a class: the submission's, or
    :class:`GradScalerAdapter`) as a training loop does, on float32 parameters (copies of
    ``params``) and the optimizer ``opts["optimizer"]`` (see ``_optimizer``). Step ``i`` of
    ``script`` (``{"grads": [one tensor per parameter, inf/NaN allowed], "unscale": bool,
    "twice": bool}``): ``zero_grad``; ``loss = sum((p * g).sum())``; ``scaler.scale(loss).backward()``
    (each ``.grad`` is then ``scale * g``); with ``unscale``, ``scaler.unscale_(opt)`` (with
    ``twice`` a second time, its exception's type recorded; no backward where the scaled loss does
    not require grad); ``stepped = scaler.step(opt)``;
    ``scaler.update()``. Value: ``init_scale`` (``scale_value`` before the first step) and per
    step ``scaled`` (the scaled loss, detached), ``scaled_requires_grad``, ``grads`` (after an
    explicit ``unscale_``, else None), ``twice`` (None, "no error" or the exception type),
    ``stepped`` (what ``step`` returned), ``calls`` (``optimizer.step`` calls it made), ``scale``
    (``scale_value`` after ``update``), ``params`` and ``state`` (the optimizer's)."""
    scaler = target(**kwargs)
    ps = [torch.nn.Parameter(p.detach().clone().to(torch.float32)) for p in params]
    opt = _optimizer(opts.get("optimizer", {}), ps)
    calls = _counting_step(opt)
    steps = []
    value = {"init_scale": _scale_value(scaler), "steps": steps}
    for item in script:
        rec: dict = {"grads": None, "twice": None}
        opt.zero_grad(set_to_none=True)
        loss = sum((p * g.to(torch.float32)).sum() for p, g in zip(ps, item["grads"]))
        scaled = scaler.scale(loss)
        rec["scaled"] = scaled.detach().clone() if isinstance(scaled, torch.Tensor) else scaled
        rec["scaled_requires_grad"] = bool(getattr(scaled, "requires_grad", False))
        if rec["scaled_requires_grad"]:  # else no gradient reaches the parameters (graded from the flag)
            scaled.backward()
        if item.get("unscale"):
            scaler.unscale_(opt)
            rec["grads"] = [None if p.grad is None else p.grad.detach().clone() for p in ps]
            if item.get("twice"):
                try:
                    scaler.unscale_(opt)
                    rec["twice"] = "no error"
                except Exception as e:  # noqa: BLE001 - the type is graded
                    rec["twice"] = type(e).__name__
        before = calls[0]
        stepped = scaler.step(opt)
        rec["stepped"] = stepped if type(stepped) in (bool, type(None)) else f"<{type(stepped).__name__}>"
        rec["calls"] = calls[0] - before
        scaler.update()
        rec["scale"] = _scale_value(scaler)
        rec["params"] = [p.detach().clone() for p in ps]
        rec["state"] = _opt_state(opt)
        steps.append(rec)
    return value, {}


def probe_train_steps(module, target, spec, state, batches, scaler, opts):
    """Training steps ``loss = target(model, (inputs, targets), loss_fn, optimizer, scaler[, dtype=])``
    of a trusted :class:`RecomputeNet` (``spec``, ``state``; ``opts["double"]``: in float64),
    one per ``(inputs, targets)`` of ``batches``. ``opts``: ``loss`` (a name in
    ``TORCH_FUNCTIONS``), ``optimizer`` (see ``_optimizer``), ``scaler_kwargs`` (``scaler``:
    a class made with them, ``"torch.amp.GradScaler"`` for :class:`GradScalerAdapter`, or None:
    no scaler), ``dtype`` (passed by keyword when given),
    ``stale`` (every ``.grad`` holds this value before the first step: a step must clear it).
    Value per step: ``loss`` (what ``target`` returned, detached), ``loss_requires_grad``,
    ``params``, ``dtypes`` (of the parameters), ``state`` (the optimizer's), ``scale``
    (``scale_value`` after the step, None without a scaler) and ``log`` (the model's calls)."""
    net = RecomputeNet(spec)
    net.load_state_dict(state, strict=True)
    if opts.get("double"):
        net = net.double()
    opt = _optimizer(opts.get("optimizer", {}), net.parameters())
    loss_fn = TORCH_FUNCTIONS[opts.get("loss", "torch.nn.functional.mse_loss")]
    if scaler == "torch.amp.GradScaler":
        scaler = GradScalerAdapter
    sc = scaler(**opts.get("scaler_kwargs", {})) if scaler is not None else None
    if opts.get("stale") is not None:
        for p in net.parameters():
            p.grad = torch.full_like(p, float(opts["stale"]))
    extra = {"dtype": opts["dtype"]} if "dtype" in opts else {}
    steps = []
    try:
        _RECOMPUTE_PHASE[0] = "train"
        for x, t in batches:
            net.log = []
            with guarded():
                loss = target(net, (x, t), loss_fn, opt, sc, **extra)
            steps.append({"loss": loss.detach().clone() if isinstance(loss, torch.Tensor) else loss,
                          "loss_requires_grad": bool(getattr(loss, "requires_grad", False)),
                          "params": {n: p.detach().clone() for n, p in net.named_parameters()},
                          "dtypes": {n: str(p.dtype).removeprefix("torch.") for n, p in net.named_parameters()},
                          "state": _opt_state(opt), "scale": _scale_value(sc) if sc is not None else None,
                          "log": list(net.log)})
    finally:
        _RECOMPUTE_PHASE[0] = "idle"
    return steps, {}


# --- timing (perf graders): candidate and baseline in one process, interleaved -------------------

from harness import bench as _bench  # noqa: E402  (its clocks are bound now, before any submission)

# Trusted baselines a grader may name (the submission cannot name others). Bound at import, before
# the submission is imported: a submission that rebinds these names later does not change what runs.
import torch.distributed as _dist  # noqa: E402  (bound here, before any stand-in or submission)
_TORCH_DDP = torch.nn.parallel.DistributedDataParallel  # the lab 07 baseline (probe_torch_ddp)

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
    untimed call slower than this ends the probe at once with the figure ``too_slow_s``).

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
            w0, c0 = _perf_counter(), clock()
            with guards["candidate"]():
                target(*again, **kwargs)
            wall, probe_s = _perf_counter() - w0, probe_s + clock() - c0
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


PROBES = {name.removeprefix("probe_"): fn for name, fn in dict(globals()).items()
          if name.startswith("probe_") and callable(fn)}
"""Every probe by name: the worker's ``probe`` op runs only these."""
