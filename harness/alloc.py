"""Allocation tracker: the largest and total tensor bytes allocated inside a call.

A ``TorchDispatchMode`` sees every ATen op below autograd, on CPU and CUDA, so
it measures what a submission allocates whatever device it runs on (peak GPU
memory is the cross-check on CUDA). An op's output counts as an allocation
unless its schema says it aliases an input (views, in-place and ``out=``
ops). Tensors created by Triton kernels' wrappers through ``torch.empty``
count like any other.

Usage::

    with AllocationTracker() as t:
        out = f(q, k, v)
    t.max_numel, t.max_bytes, t.total_bytes, t.largest  # largest: "aten.bmm (2, 4, 300, 300) float32"
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


C10D_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
C10D_NOT_COLLECTIVES = ("_wrap_tensor_autograd",)  # besides the waits: functional plumbing, no message


def c10d_sent_elements(name: str, namespace: str, args) -> int | None:
    """Elements an all-to-all dispatcher op sends to the *other* ranks of its group: its input
    less this rank's own split (which stays in the process); None for any other op, or where
    the arguments cannot be read. ``c10d.alltoall_base_(output, input, group,
    output_split_sizes, input_split_sizes, ...)`` (``dist.all_to_all_single``; empty splits:
    W equal blocks of rows), ``c10d.alltoall_(outputs, inputs, group, ...)``
    (``dist.all_to_all``) and the functional ``all_to_all_single(input, output_split_sizes,
    input_split_sizes, group_name)``."""
    try:
        from torch._C._distributed_c10d import ProcessGroup
        if namespace == "c10d" and name == "alltoall_":
            rank = ProcessGroup.unbox(args[2]).rank()
            return sum(t.numel() for i, t in enumerate(args[1]) if i != rank)
        if namespace == "c10d" and name == "alltoall_base_":
            inp, group, splits = args[1], ProcessGroup.unbox(args[2]), list(args[4])
        elif namespace in ("_c10d_functional", "_c10d_functional_autograd") and name == "all_to_all_single":
            from torch.distributed.distributed_c10d import _resolve_process_group
            inp, group, splits = args[0], _resolve_process_group(args[3]), list(args[2])
        else:
            return None
        rank, W = group.rank(), group.size()
        rows = inp.shape[0] if inp.dim() else 1
        per_row = inp.numel() // rows if rows else 0
        own = int(splits[rank]) if splits else rows // W
        return int(inp.numel() - own * per_row)
    except Exception:  # noqa: BLE001 - a figure we cannot read is None, never a failed call
        return None


REDUCTIONS = ("sum", "mean", "prod", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "var", "std",
              "var_mean", "std_mean", "logsumexp", "_softmax", "_log_softmax", "cumsum", "cumprod", "nansum")


def _arith_elements(func, name: str, args, out) -> int:
    """Element operations of one op that FlopCounterMode leaves out: a pointwise op's floating
    output elements, a reduction's floating input elements; 0 for anything else."""
    if torch.Tag.pointwise in func.tags:
        return sum(t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.is_floating_point())
    if name in REDUCTIONS and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
        return args[0].numel()
    return 0


class AllocationTracker(TorchDispatchMode):
    """Record allocations made by ATen ops while active.

    Attributes (units: elements and bytes):
      ``max_numel``  elements of the largest tensor allocated;
      ``max_bytes``  bytes of the largest tensor allocated;
      ``total_bytes`` bytes allocated in all, freed or not;
      ``largest``    the op, shape and dtype of the largest allocation;
      ``ops``        names of every op seen (for "must not call" checks);
      ``c10d_sent_bytes`` bytes of the tensors passed to the c10d ``send`` dispatcher op
                     (what ``dist.send``/``isend`` end in, also when called as
                     ``torch.ops.c10d.send``);
      ``c10d_calls`` in order, ``(op, elements)`` of every collective dispatcher op
                     (``C10D_NAMESPACES``; waits and ``C10D_NOT_COLLECTIVES`` left out):
                     ``dist.*``, ProcessGroup methods, ``torch.distributed.nn`` and
                     functional collectives all end in one;
      ``first_nonfinite`` with ``watch_nonfinite=True``: the first op whose floating
                     output held NaN or Inf (casting NaN to an integer is undefined
                     behaviour even where it gives 0, so final outputs can hide it);
      ``arith_elems`` element operations of the arithmetic ``FlopCounterMode`` does not count:
                     the output elements of every pointwise op (``torch.Tag.pointwise``) and
                     the input elements of every reduction (``REDUCTIONS``), floating only: a
                     dense computation written with broadcasting and ``sum`` shows here.
    """

    def __init__(self, watch_nonfinite: bool = False):
        super().__init__()
        self.watch_nonfinite = watch_nonfinite
        self.first_nonfinite = ""
        self.max_numel = 0
        self.max_bytes = 0
        self.total_bytes = 0
        self.largest = ""
        self.ops: set[str] = set()
        self.c10d_sent_bytes = 0
        self.c10d_calls: list[tuple[str, int]] = []
        self.on_c10d = None  # called with (op, elements, sent) for each of them (sent: c10d_sent_elements)
        self.arith_elems = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket.__name__)
        self.ops.add(name)
        if func.namespace in C10D_NAMESPACES and name not in C10D_NOT_COLLECTIVES and "wait" not in name \
                and len(self.c10d_calls) < 10_000:
            first = next((t for t in tree_flatten(list(args))[0] if isinstance(t, torch.Tensor)), None)
            numel = sum(t.numel() for t in tree_flatten(args[0])[0] if isinstance(t, torch.Tensor)) \
                if args and first is not None else 0
            self.c10d_calls.append((name, numel))
            if self.on_c10d is not None:
                self.on_c10d(name, numel, c10d_sent_elements(name, func.namespace, args))
        if name == "send" and func.namespace == "c10d" and args:
            self.c10d_sent_bytes += sum(t.numel() * t.element_size() for t in tree_flatten(args[0])[0]
                                        if isinstance(t, torch.Tensor))
        self.arith_elems += _arith_elements(func, name, args, out)
        returns = func._schema.returns
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for i, t in enumerate(outs):
            aliased = i < len(returns) and returns[i].alias_info is not None
            for leaf in tree_flatten(t)[0]:
                if isinstance(leaf, torch.Tensor) and not aliased:
                    self._record(name, leaf)
                if self.watch_nonfinite and not self.first_nonfinite and isinstance(leaf, torch.Tensor) \
                        and leaf.is_floating_point() and leaf.numel() and not bool(torch.isfinite(leaf).all()):
                    self.first_nonfinite = f"aten.{name} -> {tuple(leaf.shape)} with NaN/Inf"
        return out

    def _record(self, name: str, t: torch.Tensor):
        nbytes = t.numel() * t.element_size()
        self.total_bytes += nbytes
        if t.numel() > self.max_numel:
            self.max_numel = t.numel()
            self.max_bytes = nbytes
            self.largest = f"aten.{name} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
