"""Plumbing every probe family uses: clocks bound before the submission, tree helpers, forbidden names."""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib
import inspect
import time

import torch

from harness import impl as _impl


# Bound before any submission is imported (a submission that rebinds the module's
# attributes later does not change what the probes call).
_perf_counter = time.perf_counter
_process_time = time.process_time
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
    import torch.utils.flop_counter  # noqa: F401  (the FLOP counter)



def note(msg: str) -> None:
    """Where a rank is (shown when a multi-rank run times out); the server replaces it."""


API = {"module": None, "contract": None}  # the submission's module name and the contract (the stub): the server's


def check_call(target, args, kwargs) -> None:
    """Before the grader's call ``target(*args, **kwargs)`` of the submission's own function, class
    or method: raise ``harness.impl.APIMismatch`` when its signature does not bind the call (the
    contract's names and calls are all the graders rely on; any other signature that accepts
    them is fine)."""
    if API["module"] is None or getattr(target, "__module__", None) != API["module"]:
        return
    if not (inspect.isfunction(target) or inspect.ismethod(target) or inspect.isclass(target)):
        return
    why = _impl.unbound_call(target, args, kwargs, API["contract"])
    if why:
        raise _impl.APIMismatch(why)


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
