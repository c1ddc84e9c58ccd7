"""Sharded training (lab 15): full parameters resident, storages that persist, reduce-scatter inputs.

The contract's tagging probe (lab-contracts.md §15, Part B), run next to the submission: one run
of a sharding wrapper around a trusted :class:`TrainNet` (construction, training steps: forward,
backward, a ``torch.optim`` step and ``zero_grad(set_to_none=True)``; then a no-grad forward)
under one ``TorchDispatchMode`` that

* tags as full-parameter storage the output of every all-gather and every storage a copying op
  (``clone``, ``copy_``, ``_to_copy``, ``cat``, ``stack``, ``*_copy``, ...) fills from a tagged
  one, and after every op of forward and backward sums the bytes of the tagged storages still
  alive (weak references: a storage autograd's saved tensors keep counts, one resized to 0
  counts 0);
* keeps a weak reference to every storage an op allocates, so that the bytes still alive after
  construction and after each step (the optimizer's state left out; the original parameters
  added while they live) are read;
* records the elements and float64 sum of every reduce-scatter's input before it runs (the
  gradient it carries, however the reduce-scatter was reached).

The figures are claims of the submission's process: the submission's calls run under
``guards.guarded`` (no dispatch-stack manipulation), and this module's functions and the torch
functions it calls are bound before the submission is imported and checked in place afterwards.
"""
from __future__ import annotations

import gc
import sys
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from . import guards
from .common import _gc_collect, forbid
from .objects import probe_reachable_bytes

_ADAMW, _SGD = torch.optim.AdamW, torch.optim.SGD  # bound before the submission is imported
_new_with_weak_ptr = torch.UntypedStorage._new_with_weak_ptr
_nbytes = torch.UntypedStorage.nbytes
_storage = torch.Tensor.untyped_storage
_freeze, _unfreeze = gc.freeze, gc.unfreeze

C10D = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
# all-gathers: their outputs are full-parameter storage (c10d ops return their output tensors too)
ALL_GATHERS = ("_allgather_base_", "allgather_", "allgather_coalesced_", "allgather_into_tensor_coalesced_",
               "all_gather_into_tensor", "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced")
# reduce-scatters and the position of their input (the gradient they carry)
REDUCE_SCATTERS = {"_reduce_scatter_base_": 1, "reduce_scatter_": 1, "reduce_scatter_tensor_coalesced_": 1,
                   "reduce_scatter_tensor": 0, "reduce_scatter_tensor_coalesced": 0}
# copying ops: a storage they fill from a tagged one is tagged too (and every ``*_copy`` op)
COPIES = {"clone", "copy_", "_to_copy", "cat", "stack", "hstack", "vstack", "_foreach_copy_", "index_select",
          "index", "take", "gather", "masked_select", "constant_pad_nd", "repeat", "roll", "flip", "contiguous",
          "_reshape_copy", "narrow_copy", "split_with_sizes_copy", "unbind_copy", "lift_fresh_copy"}


def _key(t):
    try:
        return _storage(t)._cdata
    except (RuntimeError, NotImplementedError):  # no storage (sparse, meta)
        return None


def _live(refs: dict) -> dict:
    """``{key: nbytes}`` of the storages in ``refs`` (key -> (weak ref, label)) still alive;
    expired ones are dropped from ``refs``."""
    out = {}
    for k, (ref, _) in list(refs.items()):
        s = _new_with_weak_ptr(ref.cdata)
        if s is None:
            del refs[k]
            continue
        out[k] = _nbytes(s)
    return out


SETTLE_S = (0.001, 0.004, 0.016, 0.064, 0.0)  # waits before each recount of storages alive (0.085 s at most)


class ShardingWatch(TorchDispatchMode):
    """See the module docstring. ``phase``: where the ops run (``"forward"``, ``"backward"``,
    ``"no_grad"`` are the ones whose resident full-parameter bytes are summed after every op);
    ``peaks[phase] = [bytes, op, held]``; ``rs``: ``[phase, elements, sum]`` per reduce-scatter."""

    def __init__(self):
        super().__init__()
        self.phase = "construct"
        self.tagged: dict = {}     # storage key -> (weak ref, op that tagged it)
        self.allocated: dict = {}  # storage key -> (weak ref, "phase: op shape dtype")
        self.peaks: dict = {}
        self.rs: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, ns = str(func.overloadpacket.__name__), func.namespace
        if ns in C10D and name in REDUCE_SCATTERS and len(self.rs) < 1000:
            pos = REDUCE_SCATTERS[name] if ns == "c10d" else 0
            ins = [t for t in tree_flatten(args[pos] if len(args) > pos else [])[0] if isinstance(t, torch.Tensor)]
            self.rs.append([self.phase, sum(t.numel() for t in ins),
                            float(sum(float(t.detach().double().sum()) for t in ins if t.is_floating_point()))])
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        written = [t for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
                   for t in tree_flatten(args[i] if i < len(args) else kwargs.get(a.name))[0]
                   if isinstance(t, torch.Tensor)]
        if ns in C10D and name in ALL_GATHERS:
            self._tag(outs + written, f"{ns}.{name}")
        elif (name in COPIES or name.endswith("_copy")) and any(
                _key(t) in self.tagged for t in tree_flatten([args, kwargs])[0] if isinstance(t, torch.Tensor)):
            self._tag(outs + written, f"aten.{name}")
        returns = func._schema.returns
        for i, t in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
            if i < len(returns) and returns[i].alias_info is None:
                for leaf in tree_flatten(t)[0]:
                    if isinstance(leaf, torch.Tensor):
                        self._remember(self.allocated, leaf,
                                       f"{self.phase}: {ns}.{name} {tuple(leaf.shape)} {str(leaf.dtype)[6:]}")
        if self.phase in ("forward", "backward", "no_grad"):
            live = _live(self.tagged)
            held = sum(live.values())
            peak = self.peaks.setdefault(self.phase, [0, "", []])
            if held > peak[0]:  # the storages held then: what tagged each (an all-gather, or a copy of one)
                peak[:] = [held, f"{ns}.{name}", sorted(([self.tagged[k][1], n] for k, n in live.items() if n),
                                                        key=lambda e: -e[1])[:8]]
        return out

    def _tag(self, tensors, label):
        for t in tensors:
            self._remember(self.tagged, t, label)

    @staticmethod
    def _remember(refs, t, label):
        k = _key(t)
        if k is not None and (k not in refs or refs[k][0].expired()):
            refs[k] = (StorageWeakRef(_storage(t)), label)

    def held(self) -> int:
        """Bytes of full-parameter storage alive now."""
        _gc_collect()
        return sum(_live(self.tagged).values())

    def alive(self, exclude=(), extra=(), expected=()) -> dict:
        """``{"bytes", "largest"}``: storages allocated while watching (and the weak refs ``extra``)
        still alive, except the storage keys in ``exclude``. Where more than the storage keys
        ``expected`` (the shards and the model's buffers) is alive, it is counted again after short
        waits (``SETTLE_S``): a gloo worker thread drops the tensors of a collective it ran only
        after it has woken the caller, and on a loaded machine it can be descheduled in between for
        the rest of a call (CI saw a unit's original weight, broadcast at construction, still alive)."""
        exclude, expected = set(exclude), set(expected)
        refs = dict(self.allocated)
        for ref in extra:
            refs.setdefault(ref.cdata, (ref, "an original parameter"))
        for wait in SETTLE_S:
            _gc_collect()
            live = {k: n for k, n in _live(refs).items() if k not in exclude and n}
            if set(live) <= expected:
                break
            time.sleep(wait)
        for k in list(self.allocated):
            if k not in refs:
                del self.allocated[k]
        big = max(live, key=live.get, default=None)
        return {"bytes": sum(live.values()), "largest": "" if big is None else f"{refs[big][1]}, {live[big]} bytes"}


def _install():
    """Check this module's figures in place after every guarded call (``guards._IN_PLACE``)."""
    guards.install_guards()
    mine = [(ShardingWatch, a, v) for a, v in vars(ShardingWatch).items() if callable(v) or isinstance(v, staticmethod)]
    mine += [(_MODULE, a, _BOUND[a]) for a in _BOUND]
    for entry in mine:
        if not any(o is entry[0] and a == entry[1] for o, a, _ in guards._IN_PLACE):
            guards._IN_PLACE.append(entry)


def _submission(watch, phase, fn, *a, forbidden=(), module=None, **k):
    """``fn(*a, **k)`` under ``watch`` in ``phase``, guarded, with ``forbidden`` names raising."""
    watch.phase = phase
    seen: list = []
    with forbid(list(forbidden), module, "the contract forbids it", seen), guards.guarded(), watch:
        out = fn(*a, **k)
    if seen:
        raise AssertionError(f"called {', '.join(sorted(set(seen)))}: the contract forbids it")
    return out


def _opt_keys(opt) -> set:
    return {_key(t) for st in opt.state.values() for t in tree_flatten(st)[0] if isinstance(t, torch.Tensor)}


def probe_sharded_run(module, target, model, units, batches, opts):
    """One watched run of ``target(model, [model.layers[n] for n in units], prefetch=opts["prefetch"])``
    (see the module docstring): per ``[x, grad_output]`` of ``batches`` a forward, backward with
    ``grad_output``, ``opts["optim"]`` (``"torch.optim.AdamW"`` or ``"torch.optim.SGD"``, with
    ``opts["optim_kwargs"]``) stepping ``wrapper.parameters()`` and ``zero_grad(set_to_none=True)``;
    then with ``opts["no_grad"]`` (an input) a forward under ``torch.no_grad()``. ``opts["forbid"]``:
    dotted names as in ``measure``. Value: ``shards0`` (the shards after construction), ``steps``
    (per backward: the shards' ``grads`` after it, the ``params`` after the step, ``peak`` and
    ``op`` of the full-parameter bytes in ``forward`` and ``backward`` and the storages ``held`` then
    (``[what tagged it, bytes]``, largest first), ``after_backward`` (bytes
    still held when backward returned), ``alive`` (``{"bytes", "largest"}`` after the step and
    ``zero_grad``, the optimizer's state left out), ``rs`` (``[elements, sum]`` of each
    reduce-scatter input in backward), ``reach`` (``{"total", "largest"}``: the bytes reachable from
    the wrapper then, ``objects.probe_reachable_bytes``: a storage no op allocated shows there)),
    ``construct_alive`` and ``construct_reach`` (after construction), and
    ``no_grad``: ``{"y", "peak", "op", "held", "after"}``."""
    _install()
    _freeze()  # what exists now is left out of the collections below (a full collection costs a quarter second)
    try:
        return _run(module, target, model, units, batches, opts)
    finally:
        _unfreeze()


def _run(module, target, model, units, batches, opts):
    watch = ShardingWatch()
    originals = [StorageWeakRef(_storage(p)) for p in model.parameters()]
    mods = [model.layers[n] for n in units]
    kw = {"forbidden": opts.get("forbid", ()), "module": module}
    fsdp = _submission(watch, "construct", target, model, mods, prefetch=bool(opts.get("prefetch", False)), **kw)
    del mods
    params = list(fsdp.parameters())
    value = {"shards0": [p.detach().clone() for p in params], "steps": []}
    shards = {_key(p) for p in params} | {_key(b) for b in model.buffers()}
    value["construct_alive"] = watch.alive(extra=originals, expected=shards)
    value["construct_reach"] = probe_reachable_bytes(module, fsdp, [])[0]
    optim = _ADAMW if opts.get("optim") == "torch.optim.AdamW" else _SGD
    opt = optim(params, **dict(opts.get("optim_kwargs", {"lr": 0.1})))
    for x, go in batches:
        watch.rs = []
        out = _submission(watch, "forward", fsdp, x, **kw)
        _submission(watch, "backward", torch.autograd.backward, out, go, **kw)
        del out
        step = {"after_backward": watch.held(), "grads": [None if p.grad is None else p.grad.detach().clone()
                                                          for p in params]}
        _submission(watch, "step", opt.step, **kw)
        _submission(watch, "step", opt.zero_grad, set_to_none=True, **kw)
        step["params"] = [p.detach().clone() for p in params]
        step["alive"] = watch.alive(exclude=_opt_keys(opt), extra=originals, expected=shards)
        step["reach"] = probe_reachable_bytes(module, fsdp, [])[0]
        for phase in ("forward", "backward"):
            step[phase] = list(watch.peaks.pop(phase, [0, "", []]))
        step["rs"] = [[n, s] for ph, n, s in watch.rs if ph == "backward"]
        value["steps"].append(step)
    if opts.get("no_grad") is not None:
        with torch.no_grad():
            y = _submission(watch, "no_grad", fsdp, opts["no_grad"], **kw)
        peak = watch.peaks.pop("no_grad", [0, "", []])
        value["no_grad"] = {"y": y.detach().clone(), "peak": peak[0], "op": peak[1], "held": peak[2],
                            "after": watch.held()}
    return value, {}


# this module's functions as bound at import, before the submission: checked in place after every guarded call
_MODULE = sys.modules[__name__]
_BOUND = {a: v for a, v in vars(_MODULE).items() if a.startswith("_") and callable(v) and not a.startswith("__")}
