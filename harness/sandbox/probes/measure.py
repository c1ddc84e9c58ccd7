"""measure, vjp and friends: allocations, ops, FLOPs, forbidden calls and communication of one call."""
from __future__ import annotations

import contextlib

import torch

from harness.alloc import AllocationTracker

from .. import triton_launches
from ..wire import VIEW_BASES
from .comm import C10D_OPS, CommCounter
from .common import _gc_collect, _malloc_trim, _perf_counter, check_call, detach_tree, flat, forbid, forbidden_ops
from .guards import guarded


# --- measure: allocations, ops, FLOPs, forbidden calls, communication ------------------------

def _figures(tracker, counter, seen, comm) -> dict:
    extra = {"forbidden": sorted(set(seen))}
    if tracker is not None:
        extra.update(max_numel=tracker.max_numel, max_bytes=tracker.max_bytes, total_bytes=tracker.total_bytes,
                     largest=tracker.largest, ops=sorted(tracker.ops), nonfinite=tracker.first_nonfinite,
                     c10d=[list(c) for c in tracker.c10d_calls], arith_elems=tracker.arith_elems)
    if counter is not None:
        extra["flops"] = int(counter.get_total_flops())
    if comm is not None:
        extra["comm"] = comm.report()
    return extra


# FlopCounterMode counts matrix-matrix products only: the matrix-vector ones too (2 FLOP per
# multiply-add), so a dense computation written with ``mv`` or ``dot`` is counted
_aten = torch.ops.aten
MATVEC_FLOPS = {
    _aten.mv: lambda a, b, *_, out_shape=None, **__: 2 * a[0] * a[1],
    _aten.addmv: lambda c, a, b, *_, out_shape=None, **__: 2 * a[0] * a[1],
    _aten.dot: lambda a, b, *_, out_shape=None, **__: 2 * a[0],
    _aten.vdot: lambda a, b, *_, out_shape=None, **__: 2 * a[0],
    _aten.addr: lambda c, u, v, *_, out_shape=None, **__: 2 * u[0] * v[0],
}


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
            counter = stack.enter_context(FlopCounterMode(display=False, custom_mapping=MATVEC_FLOPS))
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
    check_call(target, args, kwargs)
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
    check_call(target, leaves, kwargs)
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
    check_call(target, leaves, kwargs)
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
