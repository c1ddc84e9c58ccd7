"""The trust boundary: run a submission in a separate, unprivileged worker process.

Graders (trusted) draw inputs from the secret run seed, send *copies* to a worker
process (``harness.worker``, untrusted: it imports the submission), get plain
values back and compare them themselves. With ``pytest --sandbox worker`` (what
``labs grade`` uses) the ``impl`` fixture is a :class:`RemoteModule`; with
``--sandbox none`` (the default, students' local runs) it is the module itself,
as before, with ordinary tracebacks. Graders are written once for both:

* ``impl.f(*args, **kw)`` calls ``f`` in the worker; ``impl.Cls(...)``, a method
  returning an object, or an attribute holding one gives a :class:`RemoteObject`
  handle living in the worker (calls, ``obj(x)``, ``obj.attr``, ``obj[i]``,
  ``len(obj)``, ``for x in obj`` are proxied). Tensors, numbers, strings, None,
  dtypes, devices, tuples, lists and dicts travel by value both ways.
* What must run next to the student's code has a helper here that works in both
  modes: :func:`measure` (allocations, ops seen, FLOPs, forbidden calls),
  :func:`vjp` (autograd: forward, backward with given output gradients),
  :func:`param_grads`, :func:`saved_tensors`, :func:`gradcheck`,
  :func:`is_instance`, :func:`source`.

Wire format (``encode``/``decode``; never pickle): a frame is an 8-byte length
and a JSON header, then the raw buffers it names, each an 8-byte length and the
bytes. A tensor is ``{"t": "tensor", "dtype", "shape", "stride", "buf"}`` plus
the bytes of the storage span its view covers (so strided inputs keep their
layout); the receiver checks the dtype against a fixed list and the byte count
against shape and strides, and builds a fresh CPU tensor (moved to the sender's
device when it has one). Objects that cannot travel by value stay in the worker
and come back as ``{"t": "ref", "id"}`` handles. Exceptions come back as the
nearest builtin class (``ValueError``, ``TypeError``, ...) with the message and
the worker's traceback as a note.

Worker life: one per lab module and pytest session, started on first use,
restarted after a crash, an early exit (``os._exit``), a timeout or a kill; the
test during which that happened fails with the reason and the tail of the
worker's output. After ``MAX_TIMEOUTS`` timeouts or ``MAX_CRASHES`` crashes the
remaining calls fail at once (grading time stays bounded). Isolation is in
``harness.worker`` (namespaces, hidden paths, rlimits, another uid).

What stays trusted-by-measurement (computed inside the worker, so a submission
could forge it): the numbers of :func:`measure` (allocation sizes, ops, FLOPs),
forbidden-call detection, :func:`gradcheck`, :func:`saved_tensors`,
:func:`is_instance`. Cross-checks from the trusted side: ``wall_s`` (parent clock)
and ``peak_rss_bytes`` (the worker's VmHWM from /proc, reset before the call).
Values (outputs, gradients) are always checked by the grader against its own
oracle on its own copies of the inputs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

# --- wire format ------------------------------------------------------------------------------

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
for _name in ("uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        DTYPES[_name] = getattr(torch, _name)

MAX_HEADER = 64 << 20      # bytes of JSON in one frame
MAX_FRAME_BYTES = 16 << 30  # bytes of tensor data in one frame (a worker cannot make us allocate more)
_LEN = struct.Struct("<Q")


class WireError(Exception):
    """A frame that does not follow the protocol (too big, bad dtype, sizes that disagree)."""


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
    if isinstance(obj, RemoteObject):
        return {"t": "ref", "id": obj._ref}
    if isinstance(obj, torch.Tensor) and type(obj) in (torch.Tensor, torch.nn.Parameter):
        h, data = tensor_bytes(obj)
        h["buf"] = len(buffers)
        buffers.append(data)
        return h
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


class _Reader:
    """Reads frames from a file descriptor with an optional deadline."""

    def __init__(self, fd: int):
        self.fd = fd

    def _read(self, n: int, deadline: float | None) -> bytes:
        out = bytearray()
        while len(out) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                r, _, _ = select.select([self.fd], [], [], left)
                if not r:
                    raise TimeoutError
            chunk = os.read(self.fd, min(n - len(out), 1 << 24))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def read_frame(self, deadline: float | None = None, max_bytes: int = MAX_FRAME_BYTES) -> tuple[dict, list]:
        (n,) = _LEN.unpack(self._read(8, deadline))
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


# --- exceptions --------------------------------------------------------------------------------

class SandboxError(Exception):
    """The sandboxed implementation could not answer (crash, early exit, timeout, protocol)."""


class WorkerCrashed(SandboxError):
    pass


class WorkerTimeout(SandboxError):
    pass


import builtins as _builtins

_BUILTIN_EXC = {name: obj for name, obj in vars(_builtins).items()
                if isinstance(obj, type) and issubclass(obj, BaseException)}
_NOT_RAISED = {"SystemExit", "KeyboardInterrupt", "GeneratorExit", "BaseException", "BaseExceptionGroup",
               "StopIteration", "StopAsyncIteration"}


def _rebuild_exception(info: dict) -> BaseException:
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


# --- the worker process, seen from the trusted side -------------------------------------------

MAX_TIMEOUTS = 2
MAX_CRASHES = 6


def _isolation_prefix() -> list[str]:
    """``unshare`` prefix giving the worker no network, its own PID and mount namespaces
    (so it cannot see or signal the grader, and paths can be hidden), when this host allows it."""
    global _PREFIX
    if _PREFIX is not None:
        return _PREFIX
    _PREFIX = []
    exe = shutil.which("unshare")
    if exe and os.environ.get("LABS_SANDBOX_NO_NAMESPACES") != "1":
        base = [exe, "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc"]
        for cand in ([base] if os.geteuid() == 0 else [base + ["--user", "--map-root-user"]]):
            try:
                ok = subprocess.run(cand + ["true"], capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.SubprocessError):
                ok = False
            if ok:
                _PREFIX = cand
                break
    return _PREFIX


_PREFIX: list[str] | None = None


def _worker_uid() -> tuple[int, int, str] | None:
    """(uid, gid, name) to drop to when the grader runs as root: ``student`` (the
    container's user), else ``nobody``; None when not root (cannot switch)."""
    if os.geteuid() != 0:
        return None
    import pwd
    for name in ("student", "nobody"):
        try:
            pw = pwd.getpwnam(name)
            return pw.pw_uid, pw.pw_gid, name
        except KeyError:
            continue
    return None


def _scrubbed_env(home: str) -> dict:
    """The worker's whole environment: a fixed allow-list, never the seed or LABS_* settings."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": os.path.join(home, ".triton"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, ".inductor"), "MPLCONFIGDIR": home}
    for key in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


@dataclasses.dataclass
class WorkerConfig:
    """What the trusted side tells a worker (over its pipe, never on its command line)."""

    module_source: str
    module_filename: str
    stub_source: str | None = None
    api: list = dataclasses.field(default_factory=list)
    hide: list = dataclasses.field(default_factory=list)   # paths made empty in the worker (mount ns)
    memory_mb: int = 8192
    cpu_s: int = 3600
    nproc: int = 512
    call_timeout_s: float = 300.0
    start_timeout_s: float = 120.0


class Worker:
    """One worker process: started, asked, killed. Not thread-safe (pytest runs tests serially)."""

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.problems: list[str] = []
        self.import_error: str | None = None
        self.generation = 0
        self.workdir: str | None = None
        self._log = None
        self._reader: _Reader | None = None

    # lifecycle
    def start(self) -> None:
        self.generation += 1
        self.workdir = tempfile.mkdtemp(prefix="labs-worker-")
        drop = _worker_uid()
        if drop:
            os.chown(self.workdir, drop[0], drop[1])
        os.chmod(self.workdir, 0o700)
        self._log = tempfile.TemporaryFile(prefix="labs-worker-log-")
        # the worker imports the same harness as this process (which may come from
        # PYTHONPATH, ignored under -I, rather than the installed one)
        harness_parent = str(Path(__file__).resolve().parent.parent)
        boot = (f"import sys; sys.argv[1:] = []; sys.path.insert(0, {harness_parent!r}); "
                "from harness.worker import main; main()")
        cmd = _isolation_prefix() + [sys.executable, "-I", "-c", boot]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     cwd=self.workdir, env=_scrubbed_env(self.workdir), start_new_session=True,
                                     close_fds=True)
        for f in (self.proc.stdin, self.proc.stdout):  # 1 MiB pipes: 16x fewer switches per tensor
            with contextlib.suppress(OSError):
                import fcntl
                fcntl.fcntl(f.fileno(), 1031, 1 << 20)  # F_SETPIPE_SZ
        self._reader = _Reader(self.proc.stdout.fileno())
        setup = {"op": "init", "uid": drop[0] if drop else None, "gid": drop[1] if drop else None,
                 "user": drop[2] if drop else None, "workdir": self.workdir, "namespaces": bool(_isolation_prefix()),
                 "hide": [str(p) for p in self.cfg.hide], "memory_mb": self.cfg.memory_mb, "cpu_s": self.cfg.cpu_s,
                 "nproc": self.cfg.nproc, "harness_parent": harness_parent,
                 "module_source": self.cfg.module_source, "module_filename": self.cfg.module_filename,
                 "stub_source": self.cfg.stub_source, "api": list(self.cfg.api),
                 "cuda": torch.cuda.is_available()}
        reply, _ = self._exchange(setup, [], self.cfg.start_timeout_s, what="importing the implementation")
        if not reply.get("ok"):
            self.import_error = str(reply.get("error", "import failed"))[:4000]
        else:
            self.problems = [str(p)[:500] for p in reply.get("problems", [])][:50]

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid_of_python(self) -> int | None:
        """The worker's Python process (the child of ``unshare`` when namespaces are used)."""
        if self.proc is None:
            return None
        pid = self.proc.pid
        if _isolation_prefix():
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                return int(kids[0]) if kids else None
            except (OSError, ValueError):
                return None
        return pid

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
            for f in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(Exception):
                    f.close()
            drop = _worker_uid()
            if drop and drop[2] == "student" and not _isolation_prefix():
                _kill_all_of_uid(drop[0])  # a dedicated uid: leftovers (setsid daemons) die too
        self.proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def output_tail(self, n: int = 1500) -> str:
        if self._log is None:
            return ""
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - n))
            return self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    # requests
    def _exchange(self, header: dict, buffers: list, timeout: float | None, what: str):
        assert self.proc is not None
        try:
            write_frame(self.proc.stdin.fileno(), header, buffers)
            deadline = None if timeout is None else time.monotonic() + timeout
            return self._reader.read_frame(deadline)
        except TimeoutError:
            tail = self.output_tail()
            self.kill()
            raise WorkerTimeout(f"the implementation did not answer within {timeout:.0f} s ({what}); its "
                                f"process was stopped" + (f"; its last output:\n{tail}" if tail else "")) from None
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as e:
            code = self.proc.wait(timeout=10) if self.proc else None
            tail = self.output_tail()
            self.kill()
            how = _exit_reason(code)
            raise WorkerCrashed(f"the implementation's process {how} ({what})"
                                + (f"; its last output:\n{tail}" if tail else "")) from None
        except (WireError, ValueError) as e:
            self.kill()
            raise WorkerCrashed(f"the implementation's process broke the protocol ({what}): {e}") from None
        except BaseException:
            self.kill()  # pytest-timeout or Ctrl-C mid-call: the worker's state is unknown
            raise

    def request(self, header: dict, buffers: list, what: str, timeout: float | None = None):
        return self._exchange(header, buffers, self.cfg.call_timeout_s if timeout is None else timeout, what)


def _exit_reason(code) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"was killed by {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with code {code}"


def _kill_all_of_uid(uid: int) -> None:
    """kill(-1, SIGKILL) as ``uid``: every process of that (dedicated) user dies."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class Sandbox:
    """The worker serving one lab module in this pytest session, restarted as needed."""

    def __init__(self, cfg: WorkerConfig, module_path: Path):
        self.cfg = cfg
        self.module_path = Path(module_path)
        self.worker: Worker | None = None
        self.timeouts = 0
        self.crashes = 0
        self.import_error: str | None = None
        self.test_seq = 0
        self.calls = 0

    def ensure(self) -> Worker:
        if self.import_error:
            raise SandboxError(self.import_error)
        if self.timeouts >= MAX_TIMEOUTS:
            raise WorkerTimeout(f"the implementation timed out {self.timeouts} times; its remaining calls "
                                f"fail without running (grading time is bounded)")
        if self.crashes >= MAX_CRASHES:
            raise WorkerCrashed(f"the implementation's process died {self.crashes} times; its remaining calls "
                                f"fail without running")
        if self.worker is None or not self.worker.alive:
            w = Worker(self.cfg)
            self.worker = w
            try:
                w.start()
            except WorkerTimeout:
                self.timeouts += 1
                self.worker = None
                raise
            except WorkerCrashed as e:
                self.crashes += 1
                self.worker = None
                if w.generation == 1 and self.crashes == 1:
                    self.import_error = f"importing {self.module_path.name} failed: {e}"
                    raise SandboxError(self.import_error) from None
                raise
            if w.import_error:
                self.import_error = w.import_error
                w.kill()
                self.worker = None
                raise SandboxError(self.import_error)
        return self.worker

    def request(self, header: dict, buffers: list, what: str):
        w = self.ensure()
        self.calls += 1
        try:
            reply, bufs = w.request(header, buffers, what)
        except WorkerTimeout:
            self.timeouts += 1
            self.worker = None
            raise
        except WorkerCrashed:
            self.crashes += 1
            self.worker = None
            raise
        return reply, bufs, w

    def begin_test(self) -> None:
        """Forget the previous test's handles (a fresh handle table; module attributes stay)."""
        self.test_seq += 1
        if self.worker is not None and self.worker.alive:
            with contextlib.suppress(SandboxError):
                self.request({"op": "reset"}, [], "resetting handles")

    def close(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(Exception):
                write_frame(self.worker.proc.stdin.fileno(), {"op": "exit"})
            self.worker.kill()
            self.worker = None

    # value plumbing
    def send(self, op: dict, values: dict, what: str, fresh: bool = False):
        """Encode ``values`` into ``op``, ask the worker, decode its answer (or raise its error)."""
        buffers: list = []
        header = dict(op)
        for key, val in values.items():
            header[key] = encode(val, buffers)
        self._check_handles(values)
        reply, bufs, w = self.request(header, buffers, what)
        if reply.get("ok"):
            try:
                value = decode(reply.get("value"), bufs, lambda t: self._ref(t, w))
                extra = reply.get("extra") if isinstance(reply.get("extra"), dict) else {}
                return value, extra
            except (WireError, ValueError, TypeError, RuntimeError) as e:
                raise SandboxError(f"the implementation's answer is not a plain value ({what}): {e}") from None
        exc = reply.get("error")
        if not isinstance(exc, dict):
            raise SandboxError(f"the implementation's process sent a malformed answer ({what})")
        raise _rebuild_exception(exc)

    def _check_handles(self, values):
        def visit(v):
            if isinstance(v, RemoteModule):
                return
            if isinstance(v, RemoteObject):
                if v._sandbox is not self or v._generation != (self.worker.generation if self.worker else -1) \
                        or v._test_seq not in (self.test_seq, None):
                    raise SandboxError(f"a handle to {v._type} from an earlier test or a crashed worker was used")
            elif isinstance(v, (tuple, list)):
                for x in v:
                    visit(x)
            elif isinstance(v, dict):
                for x in v.values():
                    visit(x)
        visit(values)

    def _ref(self, tree: dict, w: Worker):
        rid = tree.get("id")
        if not isinstance(rid, int):
            raise WireError("bad handle")
        pinned = bool(tree.get("pinned"))
        return RemoteObject(self, rid, str(tree.get("type", "object"))[:200],
                            [str(x)[:200] for x in tree.get("mro", [])][:64] if isinstance(tree.get("mro"), list) else [],
                            w.generation, None if pinned else self.test_seq, bool(tree.get("callable")))


# --- proxies -----------------------------------------------------------------------------------

class RemoteObject:
    """A handle to an object living in the worker. Attribute reads come back by value
    (tensors, numbers, ...) or as another handle; calls run in the worker."""

    __slots__ = ("_sandbox", "_ref", "_type", "_mro", "_generation", "_test_seq", "_callable")

    def __init__(self, sandbox: Sandbox, ref: int, typename: str, mro: list, generation: int,
                 test_seq: int | None, is_callable: bool):
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", typename)
        object.__setattr__(self, "_mro", mro)
        object.__setattr__(self, "_generation", generation)
        object.__setattr__(self, "_test_seq", test_seq)
        object.__setattr__(self, "_callable", is_callable)

    def _ask(self, op: str, what: str, **values):
        value, _ = self._sandbox.send({"op": op}, {"target": self, **values}, what)
        return value

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._ask("getattr", f"{self._short}.{name}", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", f"setting {self._short}.{name}", name=name, value=value)

    def __call__(self, *args, **kwargs):
        return self._ask("call", f"calling {self._short}", args=list(args), kwargs=kwargs)

    def __getitem__(self, key):
        return self._ask("getitem", f"{self._short}[{key!r}]", key=key)

    def __len__(self):
        return self._ask("len", f"len({self._short})")

    def __iter__(self):
        return iter(self._ask("iter", f"iterating {self._short}"))

    def __bool__(self):
        return True

    @property
    def _short(self):
        return self._type.rsplit(".", 1)[-1]

    def __repr__(self):
        return f"<sandboxed {self._type}>"


class RemoteModule(RemoteObject):
    """The implementation module, imported in the worker (``impl`` under ``--sandbox worker``).
    ``__file__`` and ``__name__`` are the trusted side's (the staged submission file)."""

    __slots__ = ("__file__", "__name__", "_attrs")

    def __init__(self, sandbox: Sandbox, path: Path, name: str):
        super().__init__(sandbox, 0, name, ["builtins.module"], -1, None, False)
        object.__setattr__(self, "__file__", str(path))
        object.__setattr__(self, "__name__", name)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value, _ = self._sandbox.send({"op": "getattr", "module": True}, {"name": name}, f"impl.{name}")
        return value

    def __setattr__(self, name, value):
        raise TypeError(f"cannot set impl.{name} under --sandbox worker (the implementation lives in another "
                        f"process); use a harness.sandbox helper")

    def __repr__(self):
        return f"<sandboxed module {self.__name__} from {self.__file__}>"


def is_remote(obj) -> bool:
    return isinstance(obj, RemoteObject)


# --- helpers that work in both modes -----------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    """What :func:`measure` saw during one call. Allocation fields as in
    ``harness.alloc.AllocationTracker`` (elements, bytes); ``ops``: ATen op names;
    ``flops``: ``torch.utils.flop_counter`` total (None unless asked); ``wall_s``:
    seconds of the call measured by the grader; ``peak_rss_bytes``: the worker's
    peak resident memory during the call from /proc (None in-process).
    Allocation, ops and FLOPs are counted next to the implementation (see the
    module docstring on what that means in the worker)."""

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


def _sandbox_of(fn) -> Sandbox | None:
    return fn._sandbox if isinstance(fn, RemoteObject) else None


def _modules_for(fn) -> list:
    mod = inspect.getmodule(fn)
    return [mod] if mod is not None else []


def _measurement_from(tracker, flops, forbidden, wall) -> Measurement:
    m = Measurement(wall_s=wall, flops=flops, forbidden_called=forbidden)
    if tracker is not None:
        m.max_numel, m.max_bytes, m.total_bytes = tracker.max_numel, tracker.max_bytes, tracker.total_bytes
        m.largest, m.ops = tracker.largest, set(tracker.ops)
        m.first_nonfinite = tracker.first_nonfinite
    return m


@contextlib.contextmanager
def _local_measure(fn, alloc, ops, flops, forbid, no_grad, reason, nonfinite=False):
    from .alloc import AllocationTracker
    from .testing import forbid_calls
    tracker = AllocationTracker(watch_nonfinite=nonfinite) if (alloc or ops or nonfinite) else None
    counter = None
    box = {}
    with contextlib.ExitStack() as stack:
        if forbid:
            stack.enter_context(forbid_calls(forbid, modules=_modules_for(fn), reason=reason))
        if no_grad:
            stack.enter_context(torch.no_grad())
        if flops:
            from torch.utils.flop_counter import FlopCounterMode
            counter = stack.enter_context(FlopCounterMode(display=False))
        if tracker is not None:
            stack.enter_context(tracker)
        t0 = time.perf_counter()
        yield box
        box["wall"] = time.perf_counter() - t0
    box["m"] = _measurement_from(tracker, counter.get_total_flops() if counter else None, [], box["wall"])


def _rss_reset(pid):
    if pid:
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")


def _rss_peak(pid) -> int | None:
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _remote_measured(sb: Sandbox, op: dict, values: dict, what: str):
    """Send a measured op; add the grader-side wall clock and the worker's peak RSS."""
    w = sb.ensure()
    pid = w.pid_of_python()
    _rss_reset(pid)
    t0 = time.perf_counter()
    value, extra = sb.send(op, values, what)
    wall = time.perf_counter() - t0
    peak = _rss_peak(pid)
    return value, extra, wall, peak


def _measurement_from_extra(extra: dict, wall: float, peak) -> Measurement:
    def num(key):
        v = extra.get(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0
    flops = extra.get("flops")
    return Measurement(max_numel=num("max_numel"), max_bytes=num("max_bytes"), total_bytes=num("total_bytes"),
                       largest=str(extra.get("largest", ""))[:300],
                       ops={str(o)[:100] for o in extra.get("ops", [])[:10000]} if isinstance(extra.get("ops"), list) else set(),
                       flops=int(flops) if isinstance(flops, (int, float)) and not isinstance(flops, bool) else None,
                       forbidden_called=[str(x)[:200] for x in extra.get("forbidden", [])][:20]
                       if isinstance(extra.get("forbidden"), list) else [],
                       wall_s=wall, peak_rss_bytes=peak, first_nonfinite=str(extra.get("nonfinite") or "")[:300])


def measure(fn, *args, alloc: bool = True, ops: bool = True, flops: bool = False, forbid: Iterable[str] = (),
            no_grad: bool = False, nonfinite: bool = False, reason: str = "the contract forbids it", **kwargs):
    """Call ``fn(*args, **kwargs)`` next to the implementation and measure it.

    Returns ``(out, Measurement)``. ``alloc``/``ops``: an AllocationTracker around
    the call; ``flops``: a FlopCounterMode; ``forbid``: dotted names (e.g.
    ``torch.nn.functional.scaled_dot_product_attention``) patched to raise
    AssertionError during the call, in their home module and in the implementation
    module's globals (a call is also recorded in ``forbidden_called``, even if the
    implementation swallows the error); ``no_grad``: run under ``torch.no_grad()``;
    ``nonfinite``: record the first op whose floating output held NaN/Inf.
    ``fn`` is an implementation function, class, method or handle (``impl.f``,
    ``obj.method``, ``obj``). The measurement's own keyword arguments cannot be
    passed through to ``fn``."""
    forbid = list(forbid)
    sb = _sandbox_of(fn)
    if sb is None:
        with _local_measure(fn, alloc, ops, flops, forbid, no_grad, reason, nonfinite) as box:
            out = fn(*args, **kwargs)
        return out, box["m"]
    opts = {"alloc": alloc, "ops": ops, "flops": flops, "forbid": forbid, "no_grad": no_grad, "reason": reason,
            "nonfinite": nonfinite}
    out, extra, wall, peak = _remote_measured(sb, {"op": "measure", "opts": opts},
                                              {"target": fn, "args": list(args), "kwargs": kwargs},
                                              f"measuring {fn._short}")
    return out, _measurement_from_extra(extra, wall, peak)


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


def _local_vjp(fn, args, kwargs, grad_outputs, requires_grad, forbid, measure_backward, reason):
    from .alloc import AllocationTracker
    from .testing import forbid_calls
    leaves = []
    for i, a in enumerate(args):
        rg = requires_grad[i] if requires_grad is not None else (isinstance(a, torch.Tensor) and a.requires_grad)
        if isinstance(a, torch.Tensor) and rg:
            a = a.detach().requires_grad_(True)  # an alias of the caller's tensor: its grad stays here
        leaves.append(a)
    m = None
    with forbid_calls(forbid, modules=_modules_for(fn), reason=reason) if forbid else contextlib.nullcontext():
        out = fn(*leaves, **kwargs)
        outs = [t for t in _flat(out) if isinstance(t, torch.Tensor)]
        gouts = [g for g in _flat(grad_outputs) if isinstance(g, torch.Tensor)] if grad_outputs is not None else None
        pairs = [(o, g) for o, g in zip(outs, gouts or [None] * len(outs)) if o.requires_grad]
        if not pairs:
            raise AssertionError("the output does not require grad: no autograd graph reaches the inputs "
                                 "(detached, computed under no_grad, or not built from them)")
        tracker = AllocationTracker() if measure_backward else None
        t0 = time.perf_counter()
        with tracker if tracker is not None else contextlib.nullcontext():
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs] if gouts is not None else None)
        if tracker is not None:
            m = _measurement_from(tracker, None, [], time.perf_counter() - t0)
    grads = tuple(a.grad if isinstance(a, torch.Tensor) and a.requires_grad else None for a in leaves)
    return VJP(_detach_tree(out), grads, m)


def _flat(x):
    if isinstance(x, (tuple, list)):
        for y in x:
            yield from _flat(y)
    else:
        yield x


def _detach_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (tuple, list)):
        return type(x)(_detach_tree(y) for y in x)
    return x


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
    kwargs = kwargs or {}
    forbid = list(forbid)
    sb = _sandbox_of(fn)
    if sb is None:
        return _local_vjp(fn, args, kwargs, grad_outputs, requires_grad, forbid, measure_backward, reason)
    rg = list(requires_grad) if requires_grad is not None else \
        [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    opts = {"requires_grad": rg, "forbid": forbid, "measure_backward": measure_backward, "reason": reason}
    value, extra, wall, peak = _remote_measured(
        sb, {"op": "vjp", "opts": opts},
        {"target": fn, "args": [a.detach() if isinstance(a, torch.Tensor) else a for a in args], "kwargs": kwargs,
         "grad_outputs": grad_outputs}, f"autograd through {fn._short}")
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == len(args)):
        raise SandboxError("the implementation's process sent a malformed autograd answer")
    for g in value[1]:
        if g is not None and type(g) is not torch.Tensor:
            raise AssertionError(f"a gradient is a {type(g).__name__}, not a tensor")
    m = _measurement_from_extra(extra, wall, peak) if measure_backward else None
    return VJP(value[0], value[1], m)


def param_grads(module) -> dict:
    """``{name: grad or None}`` of ``module.named_parameters()`` (after :func:`vjp`)."""
    sb = _sandbox_of(module)
    if sb is None:
        return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in module.named_parameters()}
    value, _ = sb.send({"op": "param_grads"}, {"target": module}, "reading parameter gradients")
    if not isinstance(value, dict):
        raise SandboxError("malformed parameter gradients")
    return value


def saved_tensors(fn, args: tuple, kwargs: dict | None = None) -> tuple:
    """``(out, [tensors saved for backward by out.grad_fn])`` of ``fn(*args)`` with the
    tensor arguments requiring grad as given (see :func:`vjp`)."""
    kwargs = kwargs or {}
    sb = _sandbox_of(fn)
    if sb is None:
        out = fn(*args, **kwargs)
        saved = list(getattr(getattr(out, "grad_fn", None), "saved_tensors", ()) or ())
        return out.detach() if isinstance(out, torch.Tensor) else out, [t.detach() for t in saved]
    rg = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    value, _ = sb.send({"op": "saved_tensors", "opts": {"requires_grad": rg}},
                       {"target": fn, "args": [a.detach() if isinstance(a, torch.Tensor) else a for a in args],
                        "kwargs": kwargs}, f"autograd through {fn._short}")
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
    ``torch.allclose``, which ``torch.autograd.gradcheck`` uses) cannot pass it; the
    same check runs in both sandbox modes. ``inputs``: float64 tensors."""
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


# --- object introspection next to the implementation (trusted-by-measurement) ------------------
# Run where the object lives: in this process for a local object, in the worker for a handle
# (through the worker's ``helper`` op, which only calls functions of this module named in
# HELPERS). What they report about a submission's own objects comes from the worker.

def _held_tensors(obj, depth=0):
    """Tensors held by ``obj``'s attributes (also inside lists, tuples and dicts, 3 levels)."""
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


def _h_storages(obj):
    return {int(t.untyped_storage().data_ptr()): int(t.untyped_storage().nbytes()) for t in _held_tensors(obj)}


def _h_raw_bytes(obj):
    out = []
    for t in _held_tensors(obj):
        out.append(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage()).clone())
    return out


def _h_fill_nan(obj):
    for t in _held_tensors(obj):
        if t.is_floating_point():
            t.fill_(float("nan"))


def _h_call_views(owner, fn, args, kwargs):
    """``(out, [storage_of_owner(x) for each tensor x in out])``."""
    ptrs = set(_h_storages(owner))
    out = fn(*args, **kwargs)
    flags = [int(t.untyped_storage().data_ptr()) in ptrs for t in _flat(out) if isinstance(t, torch.Tensor)]
    return out, flags


_WATCH: dict = {}


def _h_watch_begin(module, cls_name, method):
    """Replace ``module.<cls_name>`` by a subclass that records, for every instance, the
    storages held after ``__init__`` and flags a ``method`` call after which they changed."""
    base = getattr(module, cls_name)
    report = {"created": 0, "violations": []}

    class Watched(base):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self._labs_ptrs = set(_h_storages(self)) - {None}
            report["created"] += 1

        def _labs_check(self, where):
            now = set(_h_storages(self)) - {None}
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
    return None


def _h_watch_end(module, cls_name):
    base, report = _WATCH.pop((id(module), cls_name))
    setattr(module, cls_name, base)
    return dict(report)


HELPERS = {"storages": _h_storages, "raw_bytes": _h_raw_bytes, "fill_nan": _h_fill_nan,
           "call_views": _h_call_views, "watch_begin": _h_watch_begin, "watch_end": _h_watch_end}


def _helper(name, target, *args):
    sb = _sandbox_of(target)
    if sb is None:
        return HELPERS[name](target, *args)
    value, _ = sb.send({"op": "helper", "name": name}, {"target": target, "args": list(args)}, f"inspecting {target._short}")
    return value


def held_storages(obj) -> dict:
    """``{data_ptr: nbytes}`` of the distinct storages behind the tensors ``obj``'s
    attributes hold (also in lists, tuples, dicts). Pointers are the worker's."""
    return _helper("storages", obj)


def held_bytes(obj) -> list:
    """Copies (uint8) of every byte of every storage behind ``obj``'s tensors."""
    return _helper("raw_bytes", obj)


def fill_held_nan(obj) -> None:
    """Fill every floating tensor ``obj``'s attributes hold with NaN, in place."""
    _helper("fill_nan", obj)


def call_views(owner, fn, *args, **kwargs) -> tuple:
    """``(fn(*args, **kwargs), flags)``: one bool per output tensor, True when it is a
    view of a storage ``owner`` holds (checked next to the implementation)."""
    return _helper("call_views", owner, fn, list(args), kwargs)


@contextlib.contextmanager
def watch_storages(impl, cls_name: str, method: str):
    """While active, every ``impl.<cls_name>`` created (by the grader or inside the
    implementation) is checked after each ``method`` call: the storages it holds must
    be those it allocated in ``__init__``. Yields a dict filled on exit:
    ``created`` (instances made), ``violations`` (calls after which storage changed)."""
    report: dict = {}
    _helper("watch_begin", impl, cls_name, method) if isinstance(impl, RemoteObject) else \
        _h_watch_begin(impl, cls_name, method)
    try:
        yield report
    finally:
        got = _helper("watch_end", impl, cls_name) if isinstance(impl, RemoteObject) else _h_watch_end(impl, cls_name)
        report.update(got if isinstance(got, dict) else {})
