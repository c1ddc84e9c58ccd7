"""Wire format between the grader (trusted) and the sandboxed implementation: values only.

A frame is an 8-byte length and a JSON header, then the raw buffers it names,
each an 8-byte length and the bytes (never pickle, never ``torch.load``). A
tensor is ``{"t": "tensor", "dtype", "shape", "stride", "buf"}`` plus the bytes
of the storage span its view covers (so strided inputs keep their layout); the
receiver checks the dtype against a fixed list and the byte count against shape
and strides, and builds a fresh CPU tensor (moved to the sender's device when it
has one). Objects that cannot travel by value stay in the worker and come back
as ``{"t": "ref", "id"}`` handles. Exceptions come back as the nearest builtin
class (``ValueError``, ``TypeError``, ...) with the message and the worker's
traceback as a note (:func:`rebuild_exception`).

The reader enforces a byte budget per frame (``max_bytes``): the trusted side
passes what the request can legitimately return, so a worker cannot make it
allocate without bound.
"""
from __future__ import annotations

import builtins as _builtins
import json
import math
import os
import select
import struct
import time
from typing import Any, Callable, Iterable

import torch

from ..errors import LabsError

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)

MAX_HEADER = 64 << 20      # bytes of JSON in one frame
MAX_FRAME_BYTES = 16 << 30  # bytes of tensor data in one frame (a worker cannot make us allocate more)
_LEN = struct.Struct("<Q")
VIEW_BASES: dict = {}  # id(view) -> (view, base) for views decoded from View tags (the receiver's)


class WireError(LabsError):
    """A frame that does not follow the protocol (too big, bad dtype, sizes that disagree)."""


class Handle:
    """Base of the trusted side's proxies for objects living in the worker (encoded as refs)."""

    __slots__ = ()


class View:
    """``View(base, view)``: send ``base`` whole and have the receiver pass
    ``base.as_strided(view's shape, stride, storage offset)``; probes report the
    base after the call, so a grader sees what a call wrote outside the view."""

    __slots__ = ("base", "shape", "stride", "offset")

    def __init__(self, base: torch.Tensor, view: torch.Tensor):
        if view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            raise ValueError("View(base, view): view must be a view of base")
        self.base, self.shape, self.stride = base, list(view.shape), list(view.stride())
        self.offset = view.storage_offset() - base.storage_offset()


class NotTransferable(TypeError):
    """A grader tried to send something that has no wire form (a lambda, a grader object)."""


def _span(t: torch.Tensor) -> int:
    """Elements of storage a view covers, from its first element."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def tensor_bytes(t: torch.Tensor) -> tuple[dict, bytes]:
    """Header and bytes of a tensor, keeping its strides (the covered storage span)."""
    t = t.detach()
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise NotTransferable(f"only dense strided tensors travel, got layout {t.layout}")
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise NotTransferable(f"dtype {t.dtype} does not travel")
    device = t.device.type
    if device == "meta":
        return {"t": "tensor", "dtype": dtype, "shape": list(t.shape), "stride": list(t.stride()),
                "device": "meta"}, b""
    t = t.cpu() if device != "cpu" else t
    if any(st < 0 for st in t.stride()):
        t = t.contiguous()
    n = _span(t)
    if n:
        flat = t.as_strided((n,), (1,), t.storage_offset()).contiguous()
        data = flat.view(torch.uint8).numpy().tobytes() if flat.dtype != torch.bool else \
            flat.to(torch.uint8).numpy().tobytes()
    else:
        data = b""
    return {"t": "tensor", "dtype": dtype, "shape": list(t.shape), "stride": list(t.stride()),
            "device": device, "rg": bool(t.requires_grad)}, data


def tensor_from(h: dict, data: bytes) -> torch.Tensor:
    """A fresh tensor from a header and its bytes, after checking that they agree."""
    dtype = DTYPES.get(h.get("dtype"))
    shape, stride = h.get("shape"), h.get("stride")
    if dtype is None or not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride) \
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape + stride) \
            or len(shape) > 64:
        raise WireError(f"bad tensor header {str(h)[:200]}")
    if h.get("device") == "meta":
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    numel = math.prod(shape)
    n = 0 if numel == 0 else 1 + sum((s - 1) * st for s, st in zip(shape, stride))
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(data) != n * itemsize:
        raise WireError(f"tensor {shape} {h['dtype']}: {len(data)} bytes, expected {n * itemsize}")
    if n == 0:
        out = torch.empty(shape, dtype=dtype)
    else:
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        base = raw.to(torch.bool) if dtype == torch.bool else raw.view(dtype)
        out = base.as_strided(shape, stride, 0)
    dev = h.get("device", "cpu")
    if dev != "cpu" and torch.cuda.is_available() and dev == "cuda":
        out = _to_device_keep_layout(out, dev)
    return out


def _to_device_keep_layout(t, device):
    base = t if t._base is None else t._base
    return base.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def _float(x: float):
    return x if math.isfinite(x) else {"t": "float", "v": repr(x)}


def encode(obj, buffers: list, ref_of: Callable[[Any], dict] | None = None, depth: int = 0):
    """JSON-able tree of ``obj``; tensor bytes are appended to ``buffers``.

    ``ref_of(obj)`` turns a value with no wire form into a handle (worker side);
    without it such a value raises NotTransferable (trusted side)."""
    if depth > 32:
        raise NotTransferable("nesting deeper than 32 levels")
    if obj is None or isinstance(obj, (bool, str)):
        return obj if not isinstance(obj, str) else {"t": "str", "v": obj}
    if type(obj) is int or (isinstance(obj, int) and not isinstance(obj, bool) and type(obj).__module__ == "builtins"):
        return {"t": "int", "v": str(int(obj))}
    if type(obj) is float:
        return {"t": "float", "v": repr(obj)}
    if isinstance(obj, Handle):
        return {"t": "ref", "id": obj._ref}
    if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
        h, data = tensor_bytes(obj)
        h["buf"] = len(buffers)
        buffers.append(data)
        return h
    if type(obj) is View:
        return {"t": "view", "base": encode(obj.base, buffers, ref_of, depth + 1),
                "shape": obj.shape, "stride": obj.stride, "offset": obj.offset}
    if isinstance(obj, torch.dtype):
        return {"t": "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"t": "device", "v": str(obj)}
    if type(obj) is torch.Size:
        return {"t": "tuple", "v": [encode(x, buffers, ref_of, depth + 1) for x in obj]}
    if type(obj) in (tuple, list):
        return {"t": type(obj).__name__, "v": [encode(x, buffers, ref_of, depth + 1) for x in obj]}
    if type(obj) is dict:
        return {"t": "dict", "k": [encode(k, buffers, ref_of, depth + 1) for k in obj],
                "v": [encode(v, buffers, ref_of, depth + 1) for v in obj.values()]}
    if type(obj) is slice:
        return {"t": "slice", "v": [encode(x, buffers, ref_of, depth + 1) for x in (obj.start, obj.stop, obj.step)]}
    if obj is Ellipsis:
        return {"t": "ellipsis"}
    if ref_of is not None:
        return ref_of(obj)
    raise NotTransferable(f"cannot send a {type(obj).__module__}.{type(obj).__qualname__} to the sandboxed "
                          f"implementation (tensors, numbers, strings, dtypes, tuples, lists, dicts, handles)")


def decode(tree, buffers: list, ref_from: Callable[[dict], Any], depth: int = 0):
    """Inverse of :func:`encode`; ``ref_from`` resolves a handle. Raises WireError."""
    if depth > 40:
        raise WireError("nesting too deep")
    if tree is None or isinstance(tree, bool):
        return tree
    if not isinstance(tree, dict):
        raise WireError(f"unexpected {type(tree).__name__} in a frame")
    t = tree.get("t")
    if t == "str" and isinstance(tree.get("v"), str):
        return tree["v"]
    if t == "int" and isinstance(tree.get("v"), str) and len(tree["v"]) < 4300:
        return int(tree["v"])
    if t == "float" and isinstance(tree.get("v"), str) and len(tree["v"]) < 64:
        return float(tree["v"])
    if t == "tensor":
        i = tree.get("buf")
        if tree.get("device") == "meta":
            return tensor_from(tree, b"")
        if not isinstance(i, int) or not 0 <= i < len(buffers):
            raise WireError("tensor names a missing buffer")
        out = tensor_from(tree, buffers[i])
        if tree.get("rg") and out.is_floating_point():
            out.requires_grad_(True)
        return out
    if t == "view":
        base = decode(tree.get("base"), buffers, ref_from, depth + 1)
        shape, stride, offset = tree.get("shape"), tree.get("stride"), tree.get("offset")
        if not isinstance(base, torch.Tensor) or not isinstance(shape, list) or not isinstance(stride, list) \
                or not isinstance(offset, int) or offset < 0 or len(shape) != len(stride):
            raise WireError("bad view")
        if not all(isinstance(x, int) and x >= 0 for x in shape + stride):
            raise WireError("bad view geometry")
        span = 0 if math.prod(shape) == 0 else 1 + sum((a - 1) * b for a, b in zip(shape, stride))
        if offset + span > base.numel():
            raise WireError("view outside its base")
        out = base.as_strided(shape, stride, base.storage_offset() + offset)
        VIEW_BASES[id(out)] = (out, base)
        return out
    if t == "dtype":
        d = DTYPES.get(tree.get("v"))
        if d is None:
            raise WireError(f"unknown dtype {tree.get('v')!r}")
        return d
    if t == "device" and isinstance(tree.get("v"), str) and len(tree["v"]) < 32:
        return torch.device(tree["v"])
    if t in ("tuple", "list") and isinstance(tree.get("v"), list):
        items = [decode(x, buffers, ref_from, depth + 1) for x in tree["v"]]
        return tuple(items) if t == "tuple" else items
    if t == "dict" and isinstance(tree.get("k"), list) and isinstance(tree.get("v"), list) \
            and len(tree["k"]) == len(tree["v"]):
        keys = [decode(k, buffers, ref_from, depth + 1) for k in tree["k"]]
        for k in keys:
            if not isinstance(k, (str, int, float, bool, tuple, type(None))):
                raise WireError(f"unhashable dict key of type {type(k).__name__}")
        return dict(zip(keys, (decode(v, buffers, ref_from, depth + 1) for v in tree["v"])))
    if t == "slice" and isinstance(tree.get("v"), list) and len(tree["v"]) == 3:
        return slice(*(decode(x, buffers, ref_from, depth + 1) for x in tree["v"]))
    if t == "ellipsis":
        return Ellipsis
    if t == "ref":
        return ref_from(tree)
    raise WireError(f"unknown value tag {str(t)[:40]!r}")


def write_frame(fd: int, header: dict, buffers: Iterable[bytes] = ()) -> None:
    buffers = list(buffers)
    header = {**header, "nbuf": len(buffers)}
    data = json.dumps(header, separators=(",", ":")).encode()
    chunks = [_LEN.pack(len(data)), data]
    for b in buffers:
        chunks += [_LEN.pack(len(b)), b]
    view = memoryview(b"".join(chunks))
    while view:
        n = os.write(fd, view)
        view = view[n:]


class Reader:
    """Reads frames from a file descriptor with an optional deadline."""

    def __init__(self, fd: int):
        self.fd = fd

    def _read(self, n: int, deadline: float | None, check=None) -> bytes:
        out = bytearray()
        while len(out) < n:
            while deadline is not None or check is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                r, _, _ = select.select([self.fd], [], [], 0.25 if left is None else min(left, 0.25))
                if r:
                    break
                if check is not None:
                    check()  # raises TimeoutError to give up
            chunk = os.read(self.fd, min(n - len(out), 1 << 24))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def read_frame(self, deadline: float | None = None, max_bytes: int = MAX_FRAME_BYTES,
                   check=None) -> tuple[dict, list]:
        """One frame; at most until ``deadline`` (monotonic), and ``check()`` is called every
        quarter second while waiting for its first bytes (it raises TimeoutError to give up)."""
        (n,) = _LEN.unpack(self._read(8, deadline, check))
        if n > MAX_HEADER:
            raise WireError(f"header of {n} bytes")
        header = json.loads(self._read(n, deadline))
        if not isinstance(header, dict):
            raise WireError("header is not an object")
        nbuf = header.get("nbuf", 0)
        if not isinstance(nbuf, int) or not 0 <= nbuf <= 1 << 20:
            raise WireError("bad buffer count")
        buffers, total = [], 0
        for _ in range(nbuf):
            (m,) = _LEN.unpack(self._read(8, deadline))
            total += m
            if total > max_bytes:
                raise WireError(f"frame carries more than {max_bytes} bytes")
            buffers.append(self._read(m, deadline))
        return header, buffers


def dumps(obj) -> bytes:
    """``obj`` (plain data and tensors) as one self-contained byte string (no pickle)."""
    buffers: list = []
    tree = encode(obj, buffers)
    head = json.dumps({"v": tree, "nbuf": len(buffers)}).encode()
    return b"".join([_LEN.pack(len(head)), head] + [_LEN.pack(len(b)) + b for b in buffers])


def loads(data: bytes):
    """Inverse of :func:`dumps`; handles are refused. Raises WireError on a malformed blob."""
    view = memoryview(data)
    (n,) = _LEN.unpack(view[:8])
    if n > MAX_HEADER or 8 + n > len(view):
        raise WireError("truncated blob")
    head = json.loads(bytes(view[8:8 + n]))
    at, buffers = 8 + n, []
    for _ in range(int(head.get("nbuf", 0))):
        (m,) = _LEN.unpack(view[at:at + 8])
        buffers.append(bytes(view[at + 8:at + 8 + m]))
        at += 8 + m

    def no_refs(_):
        raise WireError("handles are not allowed here")
    return decode(head["v"], buffers, no_refs)



# --- exceptions ---------------------------------------------------------------------------------

_BUILTIN_EXC = {name: obj for name, obj in vars(_builtins).items()
                if isinstance(obj, type) and issubclass(obj, BaseException)}
_NOT_RAISED = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException", "BaseExceptionGroup",
               "StopIteration", "StopAsyncIteration"}


def rebuild_exception(info: dict) -> BaseException:
    """The builtin exception class nearest to what the worker raised, with its message."""
    cls = _BUILTIN_EXC.get(str(info.get("builtin")), RuntimeError)
    if cls.__name__ in _NOT_RAISED:
        cls = RuntimeError
    msg = str(info.get("msg", ""))[:8000]
    typename = str(info.get("type", cls.__name__))[:200]
    try:
        exc = cls(msg) if typename == cls.__name__ else cls(f"{typename}: {msg}" if msg else typename)
    except Exception:
        exc = RuntimeError(f"{typename}: {msg}")
    tb = str(info.get("tb", ""))[-3000:]
    if tb and hasattr(exc, "add_note"):
        exc.add_note("raised in the sandboxed implementation:\n" + tb)
    return exc

