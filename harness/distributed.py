"""Run a test body on W ranks of a ``torch.distributed`` process group.

Graders of the distributed labs (01 all-reduce, 02 ZeRO) call::

    results = harness.distributed.run(body, W, *args, impl_path=impl_path, timeout=20)

``body(ctx, *args)`` must be a module-level function of the test file; each
rank loads that file by path (never by import name) and calls it with a
``Rank`` context: ``ctx.rank``, ``ctx.world_size``, ``ctx.impl`` (the
implementation module, loaded by path with ``harness.impl.load_module``, as the
``impl`` fixture does), ``ctx.device`` and ``ctx.note(msg)``. ``run`` returns
the W return values, rank order. They travel as ``torch.save`` bytes read back
with ``torch.load(weights_only=True)``: plain data and tensors only, and a rank
(running untrusted code) cannot make the trusted parent unpickle objects.

How it runs
  * A pool of W worker processes per world size is kept for the session
    (forked from a ``forkserver`` that has imported torch once, so a new pool
    costs a fraction of a second, not seconds per rank). Every run gets a new
    process group: the parent holds a fresh ``TCPStore`` on a free port
    (port 0, chosen by the OS, never a fixed one), the ranks join it and
    destroy the group at the end of the body. gloo on CPU; nccl when
    ``device="cuda"`` and at least W GPUs are visible (rank r uses GPU r).
  * ``timeout`` seconds per run. A run that takes longer (a deadlock: with
    gloo a blocking ``send`` waits for its matching ``recv``) fails with
    ``RankTimeout``, naming each rank's last message (the communication call
    it is blocked in, from ``CommCounter``, or its last ``ctx.note``) and the
    tail of its output. The pool's process groups are killed (each worker is a
    session leader; SIGKILL to the group) and a fresh pool serves the next run,
    so no rank inherits a hung state and the suite goes on.
  * A rank that raises fails the run with ``RankError``: the rank, the
    exception and its traceback. A rank that dies (segfault, ``os._exit``)
    fails with ``RankError`` naming its exit code; the pool is recycled unless
    every rank raised cleanly (each destroyed its process group and waits for
    the next task).

Communication counter (inside a body)::

    with ctx.count_comm(forbid=COLLECTIVES) as comm:
        impl.ring_all_reduce(t)
    comm.report()   # {"sent_msgs", "sent_bytes", "recv_msgs", "recv_bytes", "sent_elems",
                    #  "collectives": {name: calls}, "collective_elems", "forbidden": [names]}

wraps ``torch.distributed``'s point-to-point calls (``send``, ``recv``,
``isend``, ``irecv``, ``batch_isend_irecv``) and collectives in
``torch.distributed``, ``torch.distributed.distributed_c10d`` and the names the
implementation module bound with ``from torch.distributed import ...``.
A forbidden collective raises ``AssertionError`` in the rank and is recorded
even if the caller swallows the exception. Calls made on ``ProcessGroup``
objects directly bypass the counter (a known limit).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import datetime
import io
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, field
from multiprocessing.connection import wait as _wait_conns
from pathlib import Path
from typing import Any, Callable

import torch

P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
COLLECTIVES = ("all_reduce", "all_reduce_coalesced", "reduce_scatter", "reduce_scatter_tensor",
               "reduce_scatter_single", "_reduce_scatter_base", "all_gather", "all_gather_into_tensor",
               "all_gather_single", "_all_gather_base", "all_gather_coalesced", "all_gather_object",
               "broadcast", "broadcast_object_list",
               "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier")
DATA_COLLECTIVES = tuple(c for c in COLLECTIVES if c not in ("barrier", "monitored_barrier"))
"""Collectives that move data (lab 01 forbids all of them; barriers move none)."""

ERROR_GRACE_S = 3.0  # after one rank fails, how long the others get to report before the pool is killed
_NOTE_BYTES = 400


_GLOO_TIMEOUT = "Timed out waiting"
_SECONDARY = (_GLOO_TIMEOUT, "Connection closed by peer", "Connection reset by peer", "Broken pipe")


def _short(text: str, keep: int = 1500) -> str:
    """An error text without the harness's own frames, capped at ``keep`` characters."""
    lines = text.splitlines()
    out, skip = [], False
    for line in lines:
        if line.startswith('  File "') and ("harness/distributed.py" in line or "torch/distributed/c10d_logger" in line):
            skip = True
            continue
        if skip and line.startswith("    "):
            continue
        skip = False
        out.append(line)
    return "\n".join(out)[-keep:]


class RankError(AssertionError):
    """A rank raised or died; the message names the rank, the exception and its traceback."""


class RankTimeout(AssertionError):
    """A run exceeded its timeout (a deadlock or a far too slow rank)."""


# --------------------------------------------------------------------------- child side

@dataclass
class Rank:
    """What a test body receives on each rank."""

    rank: int
    world_size: int
    impl: Any
    device: str
    backend: str
    _note: Any = field(repr=False, default=None)

    def note(self, msg: str) -> None:
        """Record this rank's progress; shown if the run times out."""
        data = msg.encode("utf-8", "replace")[: _NOTE_BYTES - 1]
        if self._note is not None:
            self._note.value = data

    def count_comm(self, forbid=(), modules=None) -> "CommCounter":
        """A ``CommCounter`` patching ``torch.distributed`` and ``self.impl`` (see the module doc)."""
        return CommCounter(forbid=forbid, modules=([self.impl] if self.impl is not None else []) if modules is None else modules,
                           rank=self)


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _numel_list(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(_numel_list(y) for y in x)
    return 0


class CommCounter:
    """Count point-to-point messages/bytes and collective calls in this rank while active.

    ``forbid``: collective names (from ``COLLECTIVES``) that raise ``AssertionError`` when
    called. Bytes are counted from the tensors passed (``numel * element_size``).
    Collective volume ``collective_elems``: for each call, the elements of its largest
    tensor argument (the full buffer of a reduce-scatter or all-gather).
    """

    def __init__(self, forbid=(), modules=(), rank: Rank | None = None):
        self.forbid = set(forbid)
        unknown = self.forbid - set(COLLECTIVES) - set(P2P)
        if unknown:
            raise ValueError(f"forbid: unknown names {sorted(unknown)}")
        self.modules = list(modules)
        self._rank = rank
        self.sent_msgs = self.sent_bytes = self.sent_elems = self.recv_msgs = self.recv_bytes = 0
        self.collectives: dict[str, int] = {}
        self.collective_elems = 0
        self.forbidden: list[str] = []
        self._patches = []
        self._depth = 0  # > 0 inside a collective: its internal calls are not counted again

    def report(self) -> dict:
        return {"sent_msgs": self.sent_msgs, "sent_bytes": self.sent_bytes, "sent_elems": self.sent_elems,
                "recv_msgs": self.recv_msgs, "recv_bytes": self.recv_bytes,
                "collectives": dict(self.collectives), "collective_elems": self.collective_elems,
                "forbidden": list(self.forbidden)}

    def _note(self, msg):
        if self._rank is not None:
            self._rank.note(msg)

    def _wrap(self, name, original):
        counter = self

        if name in ("send", "isend"):
            def wrapper(tensor, *a, **k):
                if counter._depth == 0:
                    counter.sent_msgs += 1
                    counter.sent_bytes += _nbytes(tensor)
                    counter.sent_elems += tensor.numel() if isinstance(tensor, torch.Tensor) else 0
                peer = k.get("dst", k.get("group_dst", a[0] if a else "?"))
                counter._note(f"in {name}(dst={peer}, {_nbytes(tensor)} bytes) since t={time.time():.1f}")
                out = original(tensor, *a, **k)
                counter._note(f"returned from {name}(dst={peer})")
                return out
        elif name in ("recv", "irecv"):
            def wrapper(tensor, *a, **k):
                if counter._depth == 0:
                    counter.recv_msgs += 1
                    counter.recv_bytes += _nbytes(tensor)
                peer = k.get("src", k.get("group_src", a[0] if a else "any"))
                counter._note(f"in {name}(src={peer}, {_nbytes(tensor)} bytes) since t={time.time():.1f}")
                out = original(tensor, *a, **k)
                counter._note(f"returned from {name}(src={peer})")
                return out
        elif name == "batch_isend_irecv":
            def wrapper(p2p_op_list, *a, **k):  # bytes are counted by the isend/irecv it calls
                counter._note(f"in batch_isend_irecv({len(p2p_op_list)} ops)")
                return original(p2p_op_list, *a, **k)
        else:
            def wrapper(*a, **k):
                if counter._depth == 0:  # a deprecated name calling its successor counts once
                    counter.collectives[name] = counter.collectives.get(name, 0) + 1
                    counter.collective_elems += max([_numel_list(x) for x in list(a) + list(k.values())] or [0])
                if name in counter.forbid:
                    counter.forbidden.append(name)
                    raise AssertionError(f"called torch.distributed.{name}: the contract forbids collectives "
                                         f"here (point-to-point send/recv only)")
                counter._note(f"in {name} since t={time.time():.1f}")
                counter._depth += 1
                try:
                    out = original(*a, **k)
                finally:
                    counter._depth -= 1
                counter._note(f"returned from {name}")
                return out
        wrapper.__wrapped__ = original
        wrapper._labs_counter = True
        return wrapper

    def __enter__(self):
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        homes = [dist, c10d]
        for name in P2P + COLLECTIVES:
            original = getattr(c10d, name, None) or getattr(dist, name, None)
            if original is None:
                continue
            new = self._wrap(name, original)
            for m in homes + self.modules:
                for attr, value in list(vars(m).items()):
                    if value is original:
                        self._patches.append((m, attr, original))
                        setattr(m, attr, new)
        return self

    def __exit__(self, *exc):
        for m, attr, original in reversed(self._patches):
            setattr(m, attr, original)
        self._patches.clear()
        return False


def _format_exc(e: BaseException) -> str:
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))[-6000:]


def _worker(rank: int, world_size: int, conn, note, log_path: str) -> None:
    """Loop of one pool worker: receive a task, run it on this rank, send the result."""
    os.setsid()  # own process group: the parent kills it with everything it started
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)
    from . import impl as _impl
    import torch.distributed as dist

    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        os.ftruncate(1, 0)
        os.lseek(1, 0, os.SEEK_SET)
        note.value = b"starting"
        body_file, body_name, impl_path, args, kwargs, port, backend, device, pg_timeout = task
        status, payload, phase = "ok", b"", "setup-error"
        try:
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                                  timeout=datetime.timedelta(seconds=pg_timeout))
            if backend == "nccl":
                torch.cuda.set_device(rank)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=pg_timeout))
            try:
                # every rank has joined the mesh before any body can finish and tear it down
                dist.barrier(device_ids=[rank]) if backend == "nccl" else dist.barrier()
                phase = "error"
                impl = _impl.load_module(impl_path) if impl_path else None
                body = getattr(_impl.load_module(body_file), body_name)
                ctx = Rank(rank, world_size, impl, device, backend, note)
                note.value = b"running the test body"
                value = body(ctx, *args, **kwargs)
                buf = io.BytesIO()
                torch.save(_to_cpu(value), buf)
                payload = buf.getvalue()
                note.value = b"finished"
            finally:
                dist.destroy_process_group()
        except BaseException as e:  # report everything, SystemExit from student code included
            status, payload = phase, f"{type(e).__name__}: {e}\n{_format_exc(e)}".encode()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            conn.send((status, payload))
        except (BrokenPipeError, OSError):
            return


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


# --------------------------------------------------------------------------- parent side

_CTX = None


def _context():
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        # What every rank needs, imported once in the server and inherited by each fork.
        # torch._dynamo is imported lazily by torch.optim.Optimizer.__init__ (seconds each).
        _CTX.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "pytest",
                                     "harness.distributed", "harness.impl", "harness.testing"])
    return _CTX


@contextlib.contextmanager
def _no_main_module():
    """Hide ``__main__`` while starting a worker, so the child does not re-import the
    parent's main script (pytest's, or a ``python -c`` string) just to run ``_worker``."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _Pool:
    """W worker processes, one per rank, each with a pipe, a note slot and a log file."""

    def __init__(self, world_size: int):
        ctx = _context()
        self.world_size = world_size
        self.logdir = tempfile.mkdtemp(prefix=f"labs-dist-W{world_size}-")
        self.conns, self.procs, self.notes, self.logs = [], [], [], []
        for r in range(world_size):
            parent, child = ctx.Pipe()
            note = ctx.Array(ctypes.c_char, _NOTE_BYTES, lock=False)
            log = os.path.join(self.logdir, f"rank{r}.log")
            p = ctx.Process(target=_worker, args=(r, world_size, child, note, log), daemon=True,
                            name=f"labs-rank{r}-of-{world_size}")
            with _no_main_module():
                p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
            self.notes.append(note)
            self.logs.append(log)

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def log_tail(self, r: int, n: int = 1500) -> str:
        try:
            data = Path(self.logs[r]).read_bytes()[-n:]
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()

    def note(self, r: int) -> str:
        return self.notes[r].value.decode("utf-8", "replace")

    def kill(self) -> None:
        for p in self.procs:
            if p.pid is None:
                continue
            for sig_target in (lambda: os.killpg(p.pid, signal.SIGKILL), lambda: os.kill(p.pid, signal.SIGKILL)):
                try:
                    sig_target()
                    break
                except (ProcessLookupError, PermissionError, OSError):
                    continue
        for p in self.procs:
            p.join(timeout=5)
        for c in self.conns:
            c.close()
        for log in self.logs:
            with contextlib.suppress(OSError):
                os.unlink(log)
        with contextlib.suppress(OSError):
            os.rmdir(self.logdir)


_POOLS: dict[int, _Pool] = {}


def _pool(world_size: int) -> _Pool:
    p = _POOLS.get(world_size)
    if p is None or not p.alive():
        if p is not None:
            p.kill()
        p = _POOLS[world_size] = _Pool(world_size)
    return p


def _recycle(world_size: int) -> None:
    p = _POOLS.pop(world_size, None)
    if p is not None:
        p.kill()


@atexit.register
def shutdown() -> None:
    """Kill every pool (also run at interpreter exit)."""
    for w in list(_POOLS):
        _recycle(w)


def choose_backend(device: str, world_size: int) -> str:
    """``nccl`` for ``device="cuda"`` with at least ``world_size`` GPUs, else ``gloo``."""
    if str(device).startswith("cuda"):
        if torch.cuda.device_count() < world_size:
            raise ValueError(f"device=cuda with W={world_size} needs {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        return "nccl"
    return "gloo"


def run(body: Callable, world_size: int, *args, impl_path=None, timeout: float = 30.0,
        device: str = "cpu", **kwargs) -> list:
    """Run ``body(ctx, *args, **kwargs)`` on ``world_size`` ranks; return the W results.

    ``body`` must be a module-level function (each rank loads its file by path);
    ``args``/``kwargs`` are pickled to the ranks (plain data and CPU tensors).
    ``impl_path`` is loaded in each rank as ``ctx.impl``. Raises ``RankError``
    (a rank raised or died) or ``RankTimeout`` (the run took longer than
    ``timeout`` seconds); both are ``AssertionError``s, so a test fails with
    the message. ``ValueError`` for ``world_size < 1`` or a body that is not a
    module-level function.
    """
    __tracebackhide__ = True  # pytest shows the ranks' message, not this function
    import torch.distributed as dist

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    name = getattr(body, "__qualname__", "")
    body_file = getattr(getattr(body, "__code__", None), "co_filename", None)
    if not name or "<" in name or "." in name or body_file is None:
        raise ValueError(f"body must be a module-level function, got {body!r}")
    backend = choose_backend(device, world_size)
    pool = _pool(world_size)
    # The parent holds the store: port 0 lets the OS pick a free port, held for the whole run.
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout + 5))
    # gloo's own timeout fires a little before ours, so a blocked rank reports where it waited.
    pg_timeout = max(1.0, timeout - ERROR_GRACE_S - 1.0)
    task = (str(Path(body_file).resolve()), name, str(impl_path) if impl_path else None,
            args, kwargs, store.port, backend, device, pg_timeout)
    try:
        for c in pool.conns:
            c.send(task)
    except (BrokenPipeError, OSError) as e:
        _recycle(world_size)
        raise RankError(f"W={world_size}: could not start the ranks ({e})") from None

    results: dict[int, tuple[str, bytes]] = {}
    start = time.monotonic()
    deadline = start + timeout
    first_error_at = None
    pending = {c: r for r, c in enumerate(pool.conns)}
    while pending:
        now = time.monotonic()
        limit = deadline if first_error_at is None else min(deadline, first_error_at + ERROR_GRACE_S)
        if now >= limit:
            break
        ready = _wait_conns(list(pending) + [pool.procs[r].sentinel for r in pending.values()],
                           timeout=limit - now)
        for obj in ready:
            if obj in pending:
                r = pending.pop(obj)
                try:
                    results[r] = obj.recv()
                except (EOFError, OSError):
                    results[r] = ("died", b"")
                if results[r][0] != "ok" and first_error_at is None:
                    first_error_at = time.monotonic()
        for r, p in enumerate(pool.procs):  # a rank that died without sending
            if not p.is_alive() and pool.conns[r] in pending and not pool.conns[r].poll():
                pending.pop(pool.conns[r])
                results[r] = ("died", f"exit code {p.exitcode}".encode())
                if first_error_at is None:
                    first_error_at = time.monotonic()
    del store
    elapsed = time.monotonic() - start

    errors = {r: v for r, v in results.items() if v[0] != "ok"}
    if errors:
        texts = {r: p.decode("utf-8", "replace") for r, (s, p) in errors.items()}
        if any(_GLOO_TIMEOUT in texts[r] for r in errors):  # a peer may see the timed-out rank leave
            _recycle(world_size)
            raise RankTimeout(f"timed out after {elapsed:.1f}s with W={world_size}: a deadlock? (e.g. neighbours "
                              "that both start with a blocking send wait forever for each other); where "
                              "each rank waited:\n\n" + "\n\n".join(
                                  f"rank {r}: " + _short(texts[r])
                                  for r in sorted(texts, key=lambda r: (_GLOO_TIMEOUT not in texts[r], r)))[:12000])
        msgs = []
        # the root cause first: errors that are not a peer's disappearance or a timeout
        for r in sorted(errors, key=lambda r: (any(k in texts[r] for k in _SECONDARY), r)):
            s, p = errors[r]
            if s in ("error", "setup-error"):
                msgs.append(f"rank {r} of {world_size} raised " + _short(texts[r], 5000))
            else:
                tail = pool.log_tail(r)
                msgs.append(f"rank {r} of {world_size} died ({p.decode() or 'no result'}; last note: "
                            f"{pool.note(r)!r})" + (f"\n--- its output ---\n{tail}" if tail else ""))
        for r in range(world_size):
            if r not in results:
                msgs.append(f"rank {r} of {world_size} did not finish (last note: {pool.note(r)!r})")
        if len(results) < world_size or any(s != "error" for s, _ in errors.values()):
            _recycle(world_size)  # a rank is stuck or dead: start afresh
        # else every rank raised, destroyed its process group and waits for the next task
        raise RankError("\n\n".join(msgs)[:12000])
    if len(results) < world_size:
        lines = [f"timed out after {elapsed:.1f}s (limit {timeout:g}s) with W={world_size}: a deadlock? "
                 "(e.g. neighbours that both start with a blocking send wait forever for each other)"]
        for r in range(world_size):
            state = "finished" if r in results else "still running"
            lines.append(f"  rank {r}: {state}; last message: {pool.note(r)}")
            tail = pool.log_tail(r, 600)
            if tail and r not in results:
                lines.append("    output tail: " + tail.replace("\n", "\n    "))
        _recycle(world_size)
        raise RankTimeout("\n".join(lines))
    out = []
    for r in range(world_size):
        out.append(torch.load(io.BytesIO(results[r][1]), weights_only=True))
    return out
