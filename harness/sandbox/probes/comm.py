"""The communication counter (multi-rank labs): every torch.distributed path counted, in order."""
from __future__ import annotations

import time

import torch

from . import common
from .common import flat


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
            "monitored_barrier_": "monitored_barrier",
            # the functional collectives' ops (``torch.ops._c10d_functional.*`` and ``_c10d_functional_autograd``)
            "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce_coalesced",
            "all_reduce_coalesced_": "all_reduce_coalesced", "all_gather_into_tensor": "all_gather_into_tensor",
            "all_gather_into_tensor_out": "all_gather_into_tensor", "all_gather_into_tensor_coalesced": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter",
            "all_to_all_single": "all_to_all_single", "broadcast": "broadcast"}
# ``torch.distributed._functional_collectives`` functions and the collective each one counts as: counted
# and forbidden like the functions above, without a ``launch`` event (their dispatcher op logs them)
FUNCTIONAL = {"all_reduce": "all_reduce", "all_reduce_inplace": "all_reduce",
              "all_reduce_coalesced": "all_reduce_coalesced", "all_gather_tensor": "all_gather_into_tensor",
              "all_gather_tensor_autograd": "all_gather_into_tensor", "all_gather_tensor_inplace": "all_gather_into_tensor",
              "all_gather_into_tensor_coalesced": "all_gather", "all_gather_inplace": "all_gather",
              "reduce_scatter_tensor": "reduce_scatter_tensor", "reduce_scatter_tensor_autograd": "reduce_scatter_tensor",
              "reduce_scatter_tensor_inplace": "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced": "reduce_scatter",
              "all_to_all_single": "all_to_all_single", "all_to_all_single_autograd": "all_to_all_single",
              "all_to_all_inplace": "all_to_all", "permute_tensor": "all_to_all_single", "broadcast": "broadcast"}
_ACTIVE: list = []        # the CommCounter in force (at most one)
_INSTALLED: list = []     # (owner, attribute, original, stand-in) replaced by install_comm_hooks


def _first_tensor_bytes(x) -> tuple[int, int]:
    """(bytes, elements) of the first tensor in ``x`` (a tensor or nested lists of them)."""
    for y in flat(x):
        if isinstance(y, torch.Tensor):
            return _nbytes(y), y.numel()
    return 0, 0


def _peer(name: str, a: tuple, args: tuple, k: dict, method: bool):
    """The global rank a send goes to / a receive comes from; None where unknown (any source, a
    backend object torch does not map). Functions: ``dst``/``src`` (global), or ``group_dst``/
    ``group_src`` of ``group``; methods: the group's own rank (``pg.send(tensors, dstRank, tag)``)."""
    sending = name in ("send", "isend")
    side = "dst" if sending else "src"
    try:
        dist = torch.distributed  # imported by install_comm_hooks (no import inside a watched call)
        if name == "recv_anysource":
            return None
        if method:
            local = args[1] if len(args) > 1 else k.get(side + "Rank")
            return None if local is None else int(dist.get_global_rank(a[0], int(local)))
        peer = k.get(side, args[1] if len(args) > 1 else None)
        group = k.get("group", args[2] if len(args) > 2 else None)
        local = k.get("group_" + side, args[4] if len(args) > 4 else None)
        if peer is None and local is not None:
            peer = local if group is None else dist.get_global_rank(group, int(local))
        return None if peer is None else int(peer)
    except Exception:  # noqa: BLE001 - a peer we cannot read is None, never a failed call
        return None


def _hook(name: str, original, method: bool, as_collective: str | None = None):
    """A permanent stand-in for a torch.distributed function or ProcessGroup method: it
    reports to the active CommCounter (if any), forbids what it forbids, and calls through.
    ``as_collective``: a functional collective counted as this collective (no ``launch`` event)."""
    kind = name if as_collective is None and (name in P2P or name == "recv_anysource") else "collective"

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
            peer = _peer(name, a, args, k, method)
            c.event("send" if sending else "recv", numel=numel, peer=peer)  # peer: a global rank, or None
            side = "dst" if sending else "src"
            common.note(f"in {name}({side}={peer}, {nbytes} bytes) since t={time.time():.1f}")
        elif kind == "collective" and name != "batch_isend_irecv":
            functional = as_collective is not None
            label = as_collective or (_PG_METHODS.get(name, name) if method else name)
            c.collectives[label] = c.collectives.get(label, 0) + 1
            tensor = next((y for y in flat(list(args) + list(k.values())) if isinstance(y, torch.Tensor)), None)
            extra = {"sum": float(tensor.detach().double().sum())} if tensor is not None and \
                tensor.is_floating_point() and tensor.device.type == "cpu" else {}  # no GPU sync
            if not functional:
                c.event("launch", op=label, numel=max([_numel_list(x) for x in list(args) + list(k.values())] or [0]),
                        dtype=str(tensor.dtype).removeprefix("torch.") if tensor is not None else None,
                        async_op=bool(k.get("async_op", False)) or method, **extra)
            c.collective_elems += max([_numel_list(x) for x in list(args) + list(k.values())] or [0])
            if label in c.forbid:
                c.forbidden.append(label)
                where = f"_functional_collectives.{name} ({label})" if functional else label
                raise AssertionError(f"called torch.distributed.{where}: the contract forbids collectives "
                                     f"here (point-to-point send/recv only)")
            common.note(f"in {label} since t={time.time():.1f}")
        else:  # batch_isend_irecv: its isend/irecv calls are the ones counted
            common.note(f"in {name} since t={time.time():.1f}")
            return original(*a, **k)
        c._depth += 1
        try:
            out = original(*a, **k)
        finally:
            c._depth -= 1
        common.note(f"returned from {name}")
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
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:  # pragma: no cover - a torch without them
        funcol = None
    for name, label in FUNCTIONAL.items() if funcol is not None else ():
        original = vars(funcol).get(name)
        if callable(original):
            new = _hook(name, original, method=False, as_collective=label)
            _INSTALLED.append((funcol, name, original, new))
            setattr(funcol, name, new)
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
        """Append ``{"k": kind, **fields}`` to the ordered event log (at most 10,000 kept). A
        ``send``/``recv`` event has ``numel`` and ``peer``: the global rank it goes to / comes from
        (``dst``/``src``, ``group_dst``/``group_src`` translated, a group method's rank translated;
        None where unknown: a receive from any source)."""
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
