"""Object introspection: the storages and tensors an object holds or reaches."""
from __future__ import annotations

import contextlib
import inspect
import types

import torch

from . import common
from .common import flat


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


_NOT_ENTERED = (type(contextlib), type(len), str, bytes, int, float, complex)


def _inner(x) -> list:
    """What ``x`` holds, as ``(value, label)`` pairs, for :func:`walk`: attributes (``__dict__``,
    ``__slots__``), items, and for code the state it carries: a function's closure cells, defaults
    and, for a function of the submission, its module's globals; a bound method's object and
    function; a class's own attributes (a class of the submission: where a class attribute keeps
    state)."""
    if isinstance(x, dict):
        return [y for k, v in x.items() for y in ((k, "[key]"), (v, f"[{k!r}]" if isinstance(k, (str, int)) else "[..]"))]
    if isinstance(x, (list, tuple, set, frozenset)):
        return [(v, f"[{i}]") for i, v in enumerate(x)]
    if isinstance(x, type):
        return [(v, f".{k}") for k, v in vars(x).items()] if x.__module__ == common.API["module"] else []
    if inspect.ismethod(x):
        return [(x.__self__, ".__self__"), (x.__func__, ".__func__")]
    if inspect.isfunction(x):
        cells = [(c.cell_contents, f".<closure {n}>") for n, c in zip(x.__code__.co_freevars, x.__closure__ or ())
                 if _filled(c)]
        defaults = [(v, ".<default>") for v in (x.__defaults__ or ())] + \
            [(v, f".<default {k}>") for k, v in (x.__kwdefaults__ or {}).items()]
        mine = x.__module__ == common.API["module"]
        return cells + defaults + ([(x.__globals__, ".<globals>")] if mine else [])
    if isinstance(x, types.CellType):
        return [(x.cell_contents, ".<cell>")] if _filled(x) else []
    d = getattr(x, "__dict__", None)
    inner = [(v, f".{k}") for k, v in d.items()] if isinstance(d, dict) else []
    for cls in type(x).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if isinstance(name, str) and name not in ("__dict__", "__weakref__") and hasattr(x, name):
                inner.append((getattr(x, name), f".{name}"))
    return inner + [(type(x), ".<class>")]


def _filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def walk(obj, root: str = "obj", limit: int = 100_000):
    """``(tensor, path)`` for every tensor reachable from ``obj``, each object entered once (a cycle
    ends), depth first in definition order: through attributes (``__dict__``, ``__slots__``; an
    ``nn.Module``'s parameters and buffers are in its ``__dict__``), list, tuple and set items,
    dict keys and values, closures, default arguments, the submission's classes' attributes and
    its module's globals (:func:`_inner`), at any depth; other modules and builtins are not
    entered, at most ``limit`` objects are."""
    seen, stack = set(), [(obj, root)]
    while stack and len(seen) < limit:
        x, path = stack.pop()
        if id(x) in seen or isinstance(x, _NOT_ENTERED):
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            yield x, path
            continue
        stack += [(v, path + label) for v, label in reversed(_inner(x))]


def reachable_tensors(obj, limit=100_000):
    """Every tensor reachable from ``obj`` (:func:`walk`), each once."""
    return [t for t, _ in walk(obj, limit=limit)]


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
    """Bytes of every tensor storage reachable from ``target`` (:func:`walk`), except storages
    shared with the tensors in ``exclude`` or their grads.
    Value ``{"total": bytes, "largest": description}``."""
    skip_ptrs = set()
    for p in exclude:
        skip_ptrs.add(p.untyped_storage().data_ptr())
        if p.grad is not None:
            skip_ptrs.add(p.grad.untyped_storage().data_ptr())
    seen_storage = set()
    total, largest = 0, (0, "")
    for t, path in walk(target, "opt"):
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in skip_ptrs or key in seen_storage or st.nbytes() == 0:
            continue
        seen_storage.add(key)
        total += st.nbytes()
        if st.nbytes() > largest[0]:
            largest = (st.nbytes(), f"{path}: {tuple(t.shape)} {t.dtype}, storage {st.nbytes()} bytes")
    return {"total": total, "largest": largest[1]}, {}
