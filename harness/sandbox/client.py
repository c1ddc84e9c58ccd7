"""The trusted side of the sandbox: start workers, send requests, proxy objects, call probes.

With ``pytest --sandbox worker`` (``labs grade``) the ``impl`` fixture is a
:class:`RemoteModule`; with ``--sandbox none`` (students' local runs) it is the
module itself. Graders are written once for both:

* ``impl.f(*args, **kw)`` calls ``f`` in the worker; ``impl.Cls(...)``, a method
  returning an object, or an attribute holding one gives a :class:`RemoteObject`
  handle living in the worker (calls, ``obj(x)``, ``obj.attr``, ``obj[i]``,
  ``len(obj)``, ``for x in obj`` are proxied). Tensors, numbers, strings, None,
  dtypes, devices, tuples, lists and dicts travel by value both ways.
* Every measurement runs next to the code through one probe
  (``harness.sandbox.probes``): :func:`measure`, :func:`vjp`, :func:`param_grads`,
  :func:`saved_tensors`, :func:`held_storages`, ... dispatch to the worker for a
  handle and run in-process for a local object.

Worker life: a :class:`Worker` is one launcher process (``harness.sandbox.server``)
holding ``servers`` request loops: one for a single-process lab, W for the ranks
of a multi-rank lab (``harness.distributed``). A :class:`Sandbox` restarts its
worker after a crash, an early exit (``os._exit``), a timeout or a kill; the test
during which that happened fails with the reason and the tail of the worker's
output. A :class:`Budget` shared by every sandbox of one lab stops a submission
after ``MAX_TIMEOUTS`` timeouts or ``MAX_CRASHES`` crashes: its remaining calls
fail at once (grading time stays bounded). A launcher that cannot start before
the submission is imported raises :class:`SandboxStartError`: an infrastructure
failure, never the student's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

import torch

from .. import bench
from . import isolation, probes, wire
from .wire import Handle, View, WireError  # noqa: F401  (View: part of the public API)
from ..errors import ExitCode, LabsError


# --- errors ------------------------------------------------------------------------------------

class SandboxError(LabsError):
    """The sandboxed implementation could not answer (crash, early exit, timeout, protocol)."""
    code = ExitCode.GRADING_FAILED


class WorkerCrashed(SandboxError):
    pass


class WorkerTimeout(SandboxError):
    pass


class SandboxStartError(SandboxError):
    """The sandbox itself could not start (before the submission was imported): an
    infrastructure failure, reported as "grading failed", never as a 0."""


MAX_TIMEOUTS = 2
MAX_CRASHES = 6
REPLY_SLACK_BYTES = 64 << 20  # what any reply may carry beyond the request's own allowance


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
    servers: int = 1
    ranks: bool = False   # the servers are ranks of a multi-rank lab (distributed imports preloaded)


class Budget:
    """Timeouts and crashes of one submission, shared by all its sandboxes."""

    def __init__(self):
        self.timeouts = 0
        self.crashes = 0

    def check(self):
        if self.timeouts >= MAX_TIMEOUTS:
            raise WorkerTimeout(f"the implementation timed out {self.timeouts} times; its remaining calls "
                                f"fail without running (grading time is bounded)")
        if self.crashes >= MAX_CRASHES:
            raise WorkerCrashed(f"the implementation's process died {self.crashes} times; its remaining calls "
                                f"fail without running")


class _Channel:
    """One server's pipes and note file, seen from the trusted side."""

    def __init__(self):
        self.req_r, self.req_w = os.pipe()
        self.rep_r, self.rep_w = os.pipe()
        self.note = tempfile.TemporaryFile(prefix="labs-note-")
        os.fchmod(self.note.fileno(), 0o666)  # the server, another uid, writes its notes here
        self.reader = wire.Reader(self.rep_r)
        self.pid: int | None = None  # the server's pid in this (the grader's) pid namespace
        for fd in (self.req_w, self.rep_r):
            with contextlib.suppress(OSError):
                import fcntl
                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MiB pipes, fewer switches per tensor

    def child_fds(self):
        return [self.req_r, self.rep_w, self.note.fileno()]

    def after_start(self):
        for fd in (self.req_r, self.rep_w):
            os.close(fd)

    def read_note(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            return os.pread(self.note.fileno(), 400, 0).split(b"\0", 1)[0].decode("utf-8", "replace")
        return ""

    def exit_code(self, wait_s: float = 1.0) -> int | None:
        """The server's exit status as its launcher recorded it (None if not (yet) known)."""
        end = time.monotonic() + wait_s
        while True:
            with contextlib.suppress(OSError, ValueError):
                raw = os.pread(self.note.fileno(), 32, 400).split(b"\0", 1)[0].decode()
                if raw.startswith("exit "):
                    return int(raw[5:])
            if time.monotonic() >= end:
                return None
            time.sleep(0.02)

    def close(self):
        for fd in (self.req_w, self.rep_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(Exception):
            self.note.close()


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            for tid in os.listdir(f"/proc/{p}/task"):
                kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                out += [int(k) for k in kids]
                todo += [int(k) for k in kids]
        except (OSError, ValueError):
            continue
    return out


def _ns_pid(pid: int) -> int | None:
    """The innermost pid of ``pid`` (its pid inside the sandbox's pid namespace)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class Worker:
    """One launcher process and its servers: started, asked, killed. A server's requests
    are serial; different servers may be asked from different threads."""

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.proc: subprocess.Popen | None = None
        self.channels: list[_Channel] = []
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.import_error: str | None = None
        self.generation = 0
        self.workdir: str | None = None
        self.start_held: int | None = None  # the launcher's anonymous + shared bytes: a server's at its fork
        self._log = None
        self._ctl: socket.socket | None = None

    # lifecycle
    def start(self) -> None:
        self.generation += 1
        self.workdir = tempfile.mkdtemp(prefix="labs-worker-")
        drop = isolation.worker_uid()
        if drop:
            os.chown(self.workdir, drop[0], drop[1])
        os.chmod(self.workdir, 0o700)
        self._log = tempfile.TemporaryFile(prefix="labs-worker-log-")
        # the worker imports a copy of this process's worker-facing harness modules, and no others
        harness_parent = isolation.stage_harness(self.workdir)
        boot = (f"import sys; sys.argv[1:] = []; sys.path.insert(0, {harness_parent!r}); "
                "from harness.sandbox.server import main; main()")
        self.channels = [_Channel() for _ in range(self.cfg.servers)]
        # The control channel is a socket: the servers' pipes travel over it (SCM_RIGHTS) once the
        # launcher runs, so no process between us and it (unshare) holds a copy that would hide an EOF.
        ctl, ctl_child = socket.socketpair()
        cmd = isolation.isolation_prefix() + [sys.executable, "-I", "-c", boot]
        try:
            self.proc = subprocess.Popen(cmd, stdin=ctl_child.fileno(), stdout=ctl_child.fileno(), stderr=self._log,
                                         cwd=self.workdir, env=isolation.scrubbed_env(self.workdir),
                                         start_new_session=True, close_fds=True)
        except OSError as e:
            ctl.close()
            self.kill()
            raise SandboxStartError(f"the sandbox could not start: {e}") from None
        finally:
            ctl_child.close()
        self._ctl = ctl
        setup = {"op": "init", "uid": drop[0] if drop else None, "gid": drop[1] if drop else None,
                 "user": drop[2] if drop else None, "workdir": self.workdir,
                 "namespaces": bool(isolation.isolation_prefix()),
                 "hide": [str(p) for p in self.cfg.hide], "memory_mb": self.cfg.memory_mb, "cpu_s": self.cfg.cpu_s,
                 "nproc": self.cfg.nproc, "harness_parent": harness_parent,
                 "package_dirs": isolation.package_dirs(),
                 "module_source": self.cfg.module_source, "module_filename": self.cfg.module_filename,
                 "stub_source": self.cfg.stub_source, "api": list(self.cfg.api),
                 "cuda": torch.cuda.is_available(), "servers": len(self.channels), "ranks": self.cfg.ranks}
        deadline = time.monotonic() + self.cfg.start_timeout_s
        reader = wire.Reader(ctl.fileno())
        try:
            wire.write_frame(ctl.fileno(), setup)
            socket.send_fds(ctl, [b"F"], [fd for c in self.channels for fd in c.child_fds()])
            for c in self.channels:
                c.after_start()
            reply, _ = reader.read_frame(deadline)
        except (TimeoutError, EOFError, OSError, WireError, ValueError) as e:
            tail = self.output_tail()
            self.kill()
            raise SandboxStartError(f"the sandbox could not start ({type(e).__name__})"
                                    + (f"; its output:\n{tail}" if tail else "")) from None
        if not reply.get("ok"):
            self.kill()
            raise SandboxStartError(str(reply.get("error", "the sandbox could not start"))[:4000])
        self.notes = [str(n)[:300] for n in reply.get("notes", [])][:20]
        problems = []
        for i, c in enumerate(self.channels):
            try:
                ready, _ = c.reader.read_frame(deadline, max_bytes=0)
            except TimeoutError:
                tail = self.output_tail()
                self.kill()
                raise WorkerTimeout(f"importing the implementation took longer than {self.cfg.start_timeout_s:.0f} s"
                                    + (f"; its last output:\n{tail}" if tail else "")) from None
            except (EOFError, OSError, WireError, ValueError):
                tail = self.output_tail()
                self.kill()
                raise WorkerCrashed("the implementation's process died while importing the submission"
                                    + (f"; its last output:\n{tail}" if tail else "")) from None
            if not ready.get("ok"):
                self.import_error = str(ready.get("error", "import failed"))[:4000]
                return
            problems = [str(p)[:500] for p in ready.get("problems", [])][:50]
        self.problems = problems
        self._find_pids()

    def _find_pids(self) -> None:
        """Host pids of the servers (for /proc figures), matched by their order of creation."""
        if self.proc is None:
            return
        kids = sorted(_descendants(self.proc.pid))
        launcher = [k for k in kids if _ns_pid(k) in (1, None)] if isolation.isolation_prefix() else [self.proc.pid]
        servers = [k for k in kids if k not in launcher]
        servers.sort(key=lambda k: _ns_pid(k) or k)
        for c, pid in zip(self.channels, servers):
            c.pid = pid
        # the servers were forked from the launcher before importing the submission: what they
        # hold beyond its resident memory came after (the submission's import, its calls)
        self.start_held = _held_bytes(launcher[0]) if launcher and servers else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid_of_server(self, i: int = 0) -> int | None:
        return self.channels[i].pid if i < len(self.channels) else None

    def terminate(self) -> None:
        """SIGKILL the launcher and its servers, leaving pipes open (other threads may be
        reading them: they see EOF). Safe to call from any thread, any number of times."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(proc.pid, signal.SIGKILL)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.wait(timeout=10)
            drop = isolation.worker_uid()
            if drop and drop[2] != "nobody" and not isolation.isolation_prefix():
                isolation.kill_all_of_uid(drop[0])  # a dedicated uid: leftovers (setsid daemons) die too
        self.proc = None
        if self._ctl is not None:
            with contextlib.suppress(OSError):
                self._ctl.close()
            self._ctl = None
        for c in self.channels:
            c.close()
        if self.workdir:
            import shutil
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
    def request(self, server: int, header: dict, buffers: list, what: str, timeout: float | None = None,
                max_bytes: int | None = None, cleanup=None):
        """Send one frame to ``server`` and read its answer; the answer may carry at most
        ``max_bytes`` of buffers (default: what was sent plus a slack). On a failure
        ``cleanup`` runs (default: :meth:`kill`; a multi-rank run passes :meth:`terminate`)."""
        cleanup = cleanup or self.kill
        if self.proc is None:
            raise WorkerCrashed(f"the implementation's process is gone ({what})")
        c = self.channels[server]
        timeout = self.cfg.call_timeout_s if timeout is None else timeout
        sent = sum(len(b) for b in buffers)
        limit = max_bytes if max_bytes is not None else 4 * sent + REPLY_SLACK_BYTES
        try:
            wire.write_frame(c.req_w, header, buffers)
            return c.reader.read_frame(time.monotonic() + timeout, max_bytes=limit)
        except TimeoutError:
            tail = self.output_tail()
            cleanup()
            raise WorkerTimeout(f"the implementation did not answer within {timeout:.0f} s ({what}); its "
                                f"process was stopped" + (f"; its last output:\n{tail}" if tail else "")) from None
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            code = c.exit_code()
            tail = self.output_tail()
            cleanup()
            raise WorkerCrashed(f"the implementation's process {_exit_reason(code)} ({what})"
                                + (f"; its last output:\n{tail}" if tail else "")) from None
        except (WireError, ValueError) as e:
            cleanup()
            raise WorkerCrashed(f"the implementation's process broke the protocol ({what}): {e}") from None
        except BaseException:
            cleanup()  # pytest-timeout or Ctrl-C mid-call: the worker's state is unknown
            raise


def _exit_reason(code) -> str:
    if code is None:
        return "stopped answering (it exited or closed its channel)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        return f"was killed by {signal.Signals(code - 128).name} (exit {code})"
    return f"exited with code {code}"


class Sandbox:
    """The worker serving one lab module (``servers`` request loops), restarted as needed."""

    def __init__(self, cfg: WorkerConfig, module_path: Path, budget: Budget | None = None):
        self.cfg = cfg
        self.module_path = Path(module_path)
        self.worker: Worker | None = None
        self.budget = budget or Budget()
        self.import_error: str | None = None
        self.test_seq = 0
        self.calls = 0

    @property
    def timeouts(self):
        return self.budget.timeouts

    def ensure(self) -> Worker:
        if self.import_error:
            raise SandboxError(self.import_error)
        self.budget.check()
        if self.worker is None or not self.worker.alive:
            w = Worker(self.cfg)
            self.worker = w
            try:
                w.start()
            except SandboxStartError:
                self.worker = None
                raise
            except WorkerTimeout:
                self.budget.timeouts += 1
                self.worker = None
                raise
            except WorkerCrashed as e:
                self.budget.crashes += 1
                self.worker = None
                if w.generation == 1 and self.budget.crashes == 1:
                    self.import_error = f"importing {self.module_path.name} failed: {e}"
                    raise SandboxError(self.import_error) from None
                raise
            if w.import_error:
                self.import_error = w.import_error
                w.kill()
                self.worker = None
                raise SandboxError(self.import_error)
        return self.worker

    def request(self, header: dict, buffers: list, what: str, server: int = 0, timeout: float | None = None,
                max_bytes: int | None = None):
        w = self.ensure()
        self.calls += 1
        try:
            reply, bufs = w.request(server, header, buffers, what, timeout=timeout, max_bytes=max_bytes)
        except WorkerTimeout:
            self.budget.timeouts += 1
            self.worker = None
            raise
        except WorkerCrashed:
            self.budget.crashes += 1
            self.worker = None
            raise
        return reply, bufs, w

    def begin_test(self) -> None:
        """Forget the previous test's handles (a fresh handle table; module attributes stay)."""
        self.test_seq += 1
        if self.worker is not None and self.worker.alive:
            for i in range(self.cfg.servers):
                with contextlib.suppress(SandboxError):
                    self.request({"op": "reset"}, [], "resetting handles", server=i)

    def kill(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def close(self) -> None:
        if self.worker is not None:
            for c in self.worker.channels:
                with contextlib.suppress(Exception):
                    wire.write_frame(c.req_w, {"op": "exit"})
            self.worker.kill()
            self.worker = None

    # value plumbing
    def send(self, op: dict, values: dict, what: str, server: int = 0, timeout: float | None = None,
             max_bytes: int | None = None):
        """Encode ``values`` into ``op``, ask server ``server``, decode its answer (or raise its error)."""
        buffers: list = []
        header = dict(op)
        for key, val in values.items():
            header[key] = wire.encode(val, buffers)
        self._check_handles(values, server)
        reply, bufs, w = self.request(header, buffers, what, server=server, timeout=timeout, max_bytes=max_bytes)
        if reply.get("ok"):
            try:
                value = wire.decode(reply.get("value"), bufs, lambda t: self._ref(t, w, server))
                extra = reply.get("extra") if isinstance(reply.get("extra"), dict) else {}
                return value, extra
            except (WireError, ValueError, TypeError, RuntimeError) as e:
                raise SandboxError(f"the implementation's answer is not a plain value ({what}): {e}") from None
        exc = reply.get("error")
        if not isinstance(exc, dict):
            raise SandboxError(f"the implementation's process sent a malformed answer ({what})")
        raise wire.rebuild_exception(exc)

    def _check_handles(self, values, server):
        def visit(v):
            if isinstance(v, RemoteModule):
                return
            if isinstance(v, RemoteObject):
                if v._sandbox is not self or v._server != server \
                        or v._generation != (self.worker.generation if self.worker else -1) \
                        or v._test_seq not in (self.test_seq, None):
                    raise SandboxError(f"a handle to {v._type} from an earlier test, another rank or a crashed "
                                       f"worker was used")
            elif isinstance(v, (tuple, list)):
                for x in v:
                    visit(x)
            elif isinstance(v, dict):
                for x in v.values():
                    visit(x)
        visit(values)

    def _ref(self, tree: dict, w: Worker, server: int):
        rid = tree.get("id")
        if not isinstance(rid, int):
            raise WireError("bad handle")
        pinned = bool(tree.get("pinned"))
        mro = [str(x)[:200] for x in tree.get("mro", [])][:64] if isinstance(tree.get("mro"), list) else []
        return RemoteObject(self, rid, str(tree.get("type", "object"))[:200], mro, w.generation,
                            None if pinned else self.test_seq, bool(tree.get("callable")), server)


# --- proxies -----------------------------------------------------------------------------------

class RemoteObject(Handle):
    """A handle to an object living in a worker's server. Attribute reads come back by
    value (tensors, numbers, ...) or as another handle; calls run in the worker."""

    __slots__ = ("_sandbox", "_ref", "_type", "_mro", "_generation", "_test_seq", "_callable", "_server")

    def __init__(self, sandbox: Sandbox, ref: int, typename: str, mro: list, generation: int,
                 test_seq: int | None, is_callable: bool, server: int = 0):
        object.__setattr__(self, "_sandbox", sandbox)
        object.__setattr__(self, "_ref", ref)
        object.__setattr__(self, "_type", typename)
        object.__setattr__(self, "_mro", mro)
        object.__setattr__(self, "_generation", generation)
        object.__setattr__(self, "_test_seq", test_seq)
        object.__setattr__(self, "_callable", is_callable)
        object.__setattr__(self, "_server", server)

    def _ask(self, op: str, what: str, **values):
        value, _ = self._sandbox.send({"op": op}, {"target": self, **values}, what, server=self._server)
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

    __slots__ = ("__file__", "__name__")

    def __init__(self, sandbox: Sandbox, path: Path, name: str, server: int = 0):
        super().__init__(sandbox, 0, name, ["builtins.module"], -1, None, False, server)
        object.__setattr__(self, "__file__", str(path))
        object.__setattr__(self, "__name__", name)

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value, _ = self._sandbox.send({"op": "getattr", "module": True}, {"name": name}, f"impl.{name}",
                                      server=self._server)
        return value

    def __setattr__(self, name, value):
        raise TypeError(f"cannot set impl.{name} under --sandbox worker (the implementation lives in another "
                        f"process); use a harness.sandbox helper")

    def __repr__(self):
        return f"<sandboxed module {self.__name__} from {self.__file__}>"


def is_remote(obj) -> bool:
    return isinstance(obj, RemoteObject)


# --- probes: one call path for both modes -------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    """What :func:`measure` saw during one call. Allocation fields as in
    ``harness.alloc.AllocationTracker`` (elements, bytes); ``ops``: ATen op names;
    ``flops``: ``torch.utils.flop_counter`` total (None unless asked); ``comm``: the
    communication counter's report (multi-rank, when asked); ``wall_s``: seconds of
    the call measured by the grader; ``peak_rss_bytes``: the worker's peak resident
    memory during the call from /proc (None in-process); ``peak_growth_bytes``: that
    peak minus the worker's resident memory just before the request (so it counts the
    request's decoded inputs too; None in-process); ``peak_over_start_bytes``: that growth
    plus the memory the process held before the request beyond what it held when it was
    forked, before the submission was imported (anonymous and shared memory, RssAnon +
    RssShmem of /proc; so a buffer made at import or kept since an earlier call counts;
    None in-process);
    ``cpu_s``: the worker's CPU
    seconds during the call from /proc (None in-process); ``triton_launches``: Triton
    kernel launches during the call (``harness.sandbox.triton_launches``; None unless
    asked). Allocation, ops, FLOPs, comm and launches are counted next to the
    implementation, so a submission can blind them; wall, RSS and CPU time are read from
    outside, where it cannot."""

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
    comm: dict | None = None
    cpu_s: float | None = None
    peak_growth_bytes: int | None = None
    peak_over_start_bytes: int | None = None
    triton_launches: int | None = None


def _num(extra, key):
    v = extra.get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else 0


def measurement_from(extra: dict, outside: dict) -> Measurement:
    """A Measurement from a probe's figures (a worker's claims, checked for type) and the
    grader's own ``outside`` figures (see :func:`run_probe`)."""
    peak, before = outside.get("peak_rss_bytes"), outside.get("rss_before_bytes")
    held, start = outside.get("held_before_bytes"), outside.get("start_held_bytes")
    growth = None if peak is None or before is None else max(0, peak - before)
    flops = extra.get("flops")
    ops = extra.get("ops")
    forbidden = extra.get("forbidden")
    comm = extra.get("comm")
    return Measurement(max_numel=_num(extra, "max_numel"), max_bytes=_num(extra, "max_bytes"),
                       total_bytes=_num(extra, "total_bytes"), largest=str(extra.get("largest", ""))[:300],
                       ops={str(o)[:100] for o in ops[:10000]} if isinstance(ops, list) else set(),
                       flops=int(flops) if isinstance(flops, (int, float)) and not isinstance(flops, bool) else None,
                       forbidden_called=[str(x)[:200] for x in forbidden][:20] if isinstance(forbidden, list) else [],
                       wall_s=outside["wall_s"], peak_rss_bytes=peak,
                       peak_growth_bytes=growth,
                       peak_over_start_bytes=None if growth is None or held is None or start is None
                       else max(0, held - start) + growth,
                       first_nonfinite=str(extra.get("nonfinite") or "")[:300],
                       comm=_comm_report(comm) if comm is not None else None, cpu_s=outside.get("cpu_s"),
                       triton_launches=_num(extra, "triton_launches") if "triton_launches" in extra else None)


def _comm_report(c) -> dict:
    if not isinstance(c, dict):
        return {"forbidden": ["<malformed report>"], "collectives": {}, "sent_bytes": 1 << 62}
    out = {k: _num(c, k) for k in ("sent_msgs", "sent_bytes", "sent_elems", "recv_msgs", "recv_bytes",
                                   "collective_elems")}
    cols = c.get("collectives")
    out["collectives"] = {str(k)[:60]: _num(cols, k) for k in list(cols)[:50]} if isinstance(cols, dict) else {}
    fb = c.get("forbidden")
    out["forbidden"] = [str(x)[:60] for x in fb][:50] if isinstance(fb, list) else []
    out["events"] = _events(c.get("events"))
    return out


_EVENT_KINDS = {"launch", "c10d", "send", "recv", "wait", "ready", "forward_done", "backward_done"}


def _events(raw) -> list[dict]:
    """The counter's ordered event log, checked: known kinds only, plain fields."""
    out = []
    for e in raw if isinstance(raw, list) else []:
        if not isinstance(e, dict) or e.get("k") not in _EVENT_KINDS:
            out.append({"k": "malformed"})
            continue
        ev = {"k": e["k"]}
        for key in ("op", "dtype", "p"):
            if isinstance(e.get(key), str):
                ev[key] = e[key][:200]
        for key in ("numel", "sent"):
            if isinstance(e.get(key), int) and not isinstance(e.get(key), bool):
                ev[key] = e[key]
        if isinstance(e.get("async_op"), bool):
            ev["async_op"] = e["async_op"]
        out.append(ev)
    return out[:10_000]


def _rss_reset(pid) -> int | None:
    """Reset ``pid``'s peak resident memory to its current value; return that value
    (bytes), or None where /proc cannot be written or read."""
    if not pid:
        return None
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return None
    return _proc_status_bytes(pid, "VmHWM")


def proc_text(pid, name: str) -> str:
    """The text of /proc/<pid>/<name> (``status``, ``net/dev``, ``net/snmp``), "" where
    the process or the file cannot be read."""
    if not pid:
        return ""
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return ""


def proc_fields(pid, name: str, key: str) -> list[str] | None:
    """The fields after ``key:`` on its first line of /proc/<pid>/<name> (``status``,
    ``net/dev``), or None where the process or the line cannot be read."""
    for line in proc_text(pid, name).splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip() == key:
            return rest.split()
    return None


def _proc_status_bytes(pid, key: str) -> int | None:
    """``key`` (VmHWM, VmRSS, ...) of /proc/<pid>/status in bytes, None if unreadable."""
    fields = proc_fields(pid, "status", key)
    try:
        return int(fields[0]) * 1024 if fields else None
    except ValueError:
        return None


def _held_bytes(pid) -> int | None:
    """Anonymous plus shared resident bytes of ``pid`` (RssAnon + RssShmem): the memory it
    made, without the pages of files it maps (libraries), which a fork does not copy."""
    anon, shmem = _proc_status_bytes(pid, "RssAnon"), _proc_status_bytes(pid, "RssShmem")
    return None if anon is None or shmem is None else anon + shmem


def _rss_peak(pid) -> int | None:
    return _proc_status_bytes(pid, "VmHWM")


def _cpu_seconds(pid) -> float | None:
    """utime + stime of ``pid`` (all its threads) from /proc/<pid>/stat."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _target_of(values: dict):
    for key in ("target", "fn"):
        if isinstance(values.get(key), RemoteObject):
            return values[key]
    return next((v for v in values.values() if isinstance(v, RemoteObject)), None)


def _local_views(x):
    """In-process, a ``View`` becomes the view itself (over the caller's base)."""
    if type(x) is View:
        out = x.base.as_strided(x.shape, x.stride, x.base.storage_offset() + x.offset)
        wire.VIEW_BASES[id(out)] = (out, x.base)
        return out
    if isinstance(x, (list, tuple)):
        return type(x)(_local_views(y) for y in x)
    if isinstance(x, dict):
        return {k: _local_views(v) for k, v in x.items()}
    return x


def run_probe(name: str, *, on=None, what: str = "", timeout: float | None = None, max_bytes: int | None = None,
              **values):
    """Run probe ``name`` where its target lives (``on``, a handle, else the first handle
    among ``values``; in-process when there is none). Returns ``(value, figures,
    outside)``: ``outside`` holds the grader's own figures (``wall_s``, and for a
    worker its ``peak_rss_bytes``, ``rss_before_bytes``, ``held_before_bytes`` and
    ``start_held_bytes`` (see ``Measurement``) and ``cpu_s``; None in-process)."""
    target = on if isinstance(on, RemoteObject) else _target_of(values)
    if target is None:
        module = next((inspect.getmodule(v) for v in values.values() if inspect.getmodule(v) is not None), None)
        t0 = time.perf_counter()
        try:
            value, figures = probes.PROBES[name](module, **_local_views(values))
        finally:
            wire.VIEW_BASES.clear()
        return value, figures, {"wall_s": time.perf_counter() - t0, "peak_rss_bytes": None,
                                "rss_before_bytes": None, "held_before_bytes": None, "start_held_bytes": None,
                                "cpu_s": None}
    sb, server = target._sandbox, target._server
    w = sb.ensure()
    pid = w.pid_of_server(server)
    before, held = _rss_reset(pid), _held_bytes(pid)
    cpu0 = _cpu_seconds(pid)
    t0 = time.perf_counter()
    op = {"op": "probe", "name": name, "keys": list(values)}
    value, figures = sb.send(op, {"v_" + k: v for k, v in values.items()}, what or f"{name} of {target._short}",
                             server=server, timeout=timeout, max_bytes=max_bytes)
    wall = time.perf_counter() - t0
    cpu1 = _cpu_seconds(pid)
    return value, figures, {"wall_s": wall, "peak_rss_bytes": _rss_peak(pid) if before is not None else None,
                            "rss_before_bytes": before, "held_before_bytes": held, "start_held_bytes": w.start_held,
                            "cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}


def measure(fn, *args, alloc: bool = True, ops: bool = True, flops: bool = False, forbid: Iterable[str] = (),
            no_grad: bool = False, nonfinite: bool = False, reason: str = "the contract forbids it",
            timeout: float | None = None, triton: bool = False, **kwargs):
    """Call ``fn(*args, **kwargs)`` next to the implementation and measure it.

    Returns ``(out, Measurement)``. ``alloc``/``ops``: an AllocationTracker around
    the call; ``flops``: a FlopCounterMode; ``forbid``: dotted names (e.g.
    ``torch.nn.functional.scaled_dot_product_attention``) patched to raise
    AssertionError during the call, in their home module and in the implementation
    module's globals (a call is also recorded in ``forbidden_called``, even if the
    implementation swallows the error); ``no_grad``: run under ``torch.no_grad()``;
    ``nonfinite``: record the first op whose floating output held NaN/Inf;
    ``triton``: count the Triton kernel launches (``Measurement.triton_launches``);
    ``timeout``: seconds before the call is stopped (default: the lab's call limit).
    ``fn`` is an implementation function, class, method or handle (``impl.f``,
    ``obj.method``, ``obj``). The measurement's own keyword arguments cannot be
    passed through to ``fn``."""
    opts = {"alloc": alloc, "ops": ops, "flops": flops, "forbid": list(forbid), "no_grad": no_grad,
            "reason": reason, "nonfinite": nonfinite, "triton": triton}
    out, figures, outside = run_probe("measure", target=fn, args=list(args), kwargs=kwargs, opts=opts,
                                      what=f"measuring {getattr(fn, '_short', getattr(fn, '__name__', 'a call'))}",
                                      timeout=timeout)
    return out, measurement_from(figures, outside)


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
    rg = list(requires_grad) if requires_grad is not None else \
        [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    opts = {"requires_grad": rg, "forbid": list(forbid), "measure_backward": measure_backward, "reason": reason}
    value, figures, outside = run_probe(
        "vjp", target=fn, args=[a.detach() if isinstance(a, torch.Tensor) else a for a in args],
        kwargs=kwargs or {}, grad_outputs=grad_outputs, opts=opts,
        what=f"autograd through {getattr(fn, '_short', getattr(fn, '__name__', 'a call'))}")
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], tuple) and len(value[1]) == len(args)):
        raise SandboxError("the implementation's process sent a malformed autograd answer")
    for g in value[1]:
        if g is not None and type(g) is not torch.Tensor:
            raise AssertionError(f"a gradient is a {type(g).__name__}, not a tensor")
    m = measurement_from(figures, outside) \
        if measure_backward else None
    return VJP(value[0], value[1], m)


def param_grads(module) -> dict:
    """``{name: grad or None}`` of ``module.named_parameters()`` (after :func:`vjp`)."""
    value, _, _ = run_probe("param_grads", target=module, what="reading parameter gradients")
    if not isinstance(value, dict):
        raise SandboxError("malformed parameter gradients")
    return value


def saved_tensors(fn, args: tuple, kwargs: dict | None = None) -> tuple:
    """``(out, [tensors saved for backward by out.grad_fn])`` of ``fn(*args)`` with the
    tensor arguments requiring grad as given (see :func:`vjp`)."""
    rg = [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    value, _, _ = run_probe("saved_tensors", target=fn,
                            args=[a.detach() if isinstance(a, torch.Tensor) else a for a in args],
                            kwargs=kwargs or {}, opts={"requires_grad": rg})
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
    ``torch.allclose``, which ``torch.autograd.gradcheck`` uses) cannot pass it.
    ``inputs``: float64 tensors."""
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


def held_storages(obj, *, deep: bool = False) -> dict:
    """``{data_ptr: nbytes}`` of the distinct storages behind the tensors ``obj``'s
    attributes hold (also in lists, tuples, dicts); ``deep``: behind every tensor reachable
    from ``obj`` (helper objects, containers, module buffers, at any depth). Pointers are the
    worker's."""
    return run_probe("storages", target=obj, deep=deep)[0]


def held_bytes(obj, *, deep: bool = False) -> list:
    """Copies (uint8) of every byte of every storage behind ``obj``'s tensors (``deep``: as
    in :func:`held_storages`)."""
    return run_probe("raw_bytes", target=obj, deep=deep)[0]


def fill_held(obj, value: float, *, deep: bool = False) -> int:
    """Fill every floating tensor ``obj``'s attributes hold (``deep``: as in
    :func:`held_storages`) with ``value`` (a float; NaN to catch reads of unwritten
    slots, 0.0 for a deterministic start), in place; returns how many were filled."""
    return run_probe("fill", target=obj, value=float(value), deep=deep)[0]


def call_views(owner, fn, *args, deep: bool = False, **kwargs) -> tuple:
    """``(fn(*args, **kwargs), flags)``: one bool per output tensor, True when it is a
    view of a storage ``owner`` holds (checked next to the implementation; ``deep``: as in
    :func:`held_storages`)."""
    return run_probe("call_views", target=owner, fn=fn, args=list(args), kwargs=kwargs, deep=deep)[0]


def reachable_bytes(obj, exclude=()) -> dict:
    """``{"total", "largest"}``: bytes of every tensor storage reachable from ``obj``,
    except those of the tensors in ``exclude`` and their gradients."""
    return run_probe("reachable_bytes", target=obj, exclude=list(exclude))[0]


def restart(impl) -> None:
    """Start the process that holds ``impl`` (the implementation module's handle) afresh, so
    nothing the submission kept (a memo of earlier inputs, a cache, module state) survives
    into the next call: determinism and caching checks call this between their two calls.
    ``impl`` keeps working (it names the module); every other handle of the old process is
    invalid afterwards. In-process (``--sandbox none``) the module is re-executed in place.
    Raises TypeError for a handle that is not a module."""
    if isinstance(impl, RemoteModule):
        impl._sandbox.kill()
        impl._sandbox.ensure()
    elif inspect.ismodule(impl):
        impl.__spec__.loader.exec_module(impl)
    else:
        raise TypeError(f"restart(impl): impl must be the implementation module, got {type(impl).__name__}")


def resident_bytes(obj) -> int | None:
    """Live memory of the process that holds ``obj`` (a handle: a module, object or function
    of the implementation), in bytes: its resident set (VmRSS from /proc, read by the trusted
    side) after a garbage collection and ``malloc_trim`` there. State a submission hides from
    introspection (a module-level dict, a ``SimpleNamespace``, a closure) still counts.
    None in-process (``--sandbox none``) or where /proc cannot be read. Graders compare two
    readings (before and after the state is built) on shapes where the state is far above the
    allocator's noise (tens of MiB)."""
    if not isinstance(obj, RemoteObject):
        return None
    run_probe("settle", target=obj, what=f"settling {obj._short}")
    return _proc_status_bytes(obj._sandbox.ensure().pid_of_server(obj._server), "VmRSS")


@contextlib.contextmanager
def watch_storages(impl, cls_name: str, method: str, *, deep: bool = False):
    """While active, every ``impl.<cls_name>`` created (by the grader or inside the
    implementation) is checked after each ``method`` call: the storages it holds (``deep``:
    as in :func:`held_storages`) must be those it allocated in ``__init__``. Yields a dict
    filled on exit: ``created`` (instances made), ``bare`` (those holding no storage after
    ``__init__``: nothing to check), ``violations`` (calls after which storage changed)."""
    report: dict = {}
    if isinstance(impl, RemoteObject):
        run_probe("watch_begin", target=impl, cls_name=cls_name, method=method, deep=deep)
    else:
        probes.probe_watch_begin(impl, impl, cls_name, method, deep)
    try:
        yield report
    finally:
        got = run_probe("watch_end", target=impl, cls_name=cls_name)[0] if isinstance(impl, RemoteObject) \
            else probes.probe_watch_end(impl, impl, cls_name)[0]
        report.update(got if isinstance(got, dict) else {})


# --- timing: candidate and baseline in one process, cross-checked from outside -------------------

OUTSIDE_MARGIN = 0.25    # unexplained outside time allowed, as a fraction of the claimed in-process time
OUTSIDE_FIXED_S = 2e-3   # ... plus this, plus twice the measured round trip and copy of the inputs
CPU_TICK_S = 0.03        # /proc CPU times count clock ticks (10 ms): both ends' rounding and a margin
BASELINE_TOLERANCE = 3.0  # a trusted baseline's worker median is graded within this factor of ours


@dataclasses.dataclass
class Timed:
    """What :func:`timed` graded. ``ratio = candidate_s / baseline_s`` (lower is better);
    ``candidate_s``, ``baseline_s``: the medians graded (seconds per call); ``outside``:
    True when the candidate's in-process figures disagreed with the outside total (the
    worker's CPU time from /proc on CPU, the wall clock on CUDA) and ``candidate_s`` is
    the outside figure; ``baseline_outside``: True when a trusted
    baseline's worker median was more than ``BASELINE_TOLERANCE`` times off the grader's
    own and ``baseline_s`` was clamped; ``figures``: the claims and the outside figures (for
    ``record_perf``)."""

    ratio: float
    candidate_s: float
    baseline_s: float
    outside: bool = False
    baseline_outside: bool = False
    figures: dict = dataclasses.field(default_factory=dict)


def _samples(fig, key, n=None) -> list:
    xs = fig.get(key) if isinstance(fig, dict) else None
    if not isinstance(xs, list) or (n is not None and len(xs) != n) or len(xs) > 100000 or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in xs):
        raise SandboxError(f"the implementation's process sent malformed timing figures ({key})")
    return [float(x) for x in xs]


def _clone_args(x):
    return probes._clone_tree(x)


def _median_of(fn, n=5, clock=None) -> float:
    clock = clock or time.perf_counter
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return sorted(out)[n // 2]


def timed(candidate, baseline, inputs, *, warmup_inputs, check=None, kwargs: dict | None = None,
          baseline_kwargs: dict | None = None, forbid: Iterable[str] = (), forbid_ops: Iterable[str] = (),
          reason: str = "the contract forbids it", device="cpu", repeats: int | None = None,
          backend: str | None = None, no_grad: bool = True, verify_baseline: bool = True,
          threads: int | None = None, timeout: float | None = None) -> Timed:
    """Time ``candidate(*args, **kwargs)`` against ``baseline(*args, **baseline_kwargs)``
    next to the implementation, interleaved (``harness.bench.run_interleaved``: >= 3
    warm-up calls on ``warmup_inputs``, a cache flush before every call, CUDA events
    plus a device-wide synchronize on CUDA, the median of ``repeats`` >= 10 rounds,
    default ``len(inputs)``: a fresh input per round).

    ``candidate``: an implementation callable (``impl.f``, a method or module handle);
    ``baseline``: a trusted name from ``harness.sandbox.probes.BASELINES`` (e.g.
    ``"torch.nn.functional.scaled_dot_product_attention"``; ``backend`` picks an SDPA
    backend: ``math``, ``flash``, ...) or another implementation callable. ``inputs``:
    the pool, a list of positional-argument tuples (sent to the worker once, before the
    timed request); ``warmup_inputs``: >= 3 others. ``forbid``: dotted names patched to
    raise during the candidate's calls only (the baseline may call them); ``forbid_ops``:
    ATen op-name substrings the candidate must not reach (checked on one untimed call).
    ``threads``: torch's intra-op threads of both while timed; default 1 on CPU (on a
    shared, loaded machine a second OpenMP thread makes times swing tenfold), unchanged
    on CUDA.
    ``check(i, out)``: raises when the candidate's output for ``inputs[i]`` is wrong;
    every pool input's output is checked here, against the grader's own oracle.

    Cross-checks (the worker's figures are claims):

    * Outside total. ``W``, measured here for the one timed request (the inputs travel
      before it, the outputs after it): on CPU the worker's CPU seconds from /proc (the
      in-process figures are CPU time too), on CUDA (or where /proc cannot be read) the
      request's wall clock. ``W`` must be explained by the claimed calls: with
      ``claimed`` the sum of every claimed call (warm-up and timed, both sides), ``n``
      the number of calls, ``per_call`` twice the flush and loop overhead measured here
      on a no-op, and ``fixed = OUTSIDE_FIXED_S`` + twice the time to copy the pool here
      + twice the round trip of an empty request (wall clock) or ``CPU_TICK_S`` (the
      resolution of /proc CPU times), the claims are accepted when
      ``W - claimed - n * per_call - fixed <= OUTSIDE_MARGIN * claimed``. Otherwise the
      candidate is graded on the outside figure: every second not claimed by the
      baseline is charged to it, ``(W - fixed - n * per_call - B) / n_c`` per call
      (``n_c``: the candidate's calls, ``B``: the baseline's claimed total, capped for a
      named baseline at ``n_b * BASELINE_TOLERANCE`` times our own median), or its
      claimed median if that is larger; ``outside`` is then True.
    * Trusted baseline. With ``verify_baseline`` and a named baseline, the baseline is
      also timed here on copies of the pool, and the worker's median is graded clamped
      to within ``BASELINE_TOLERANCE`` of ours (a submission slowing the baseline, or
      lying about it, gains at most that factor; ``baseline_outside``). The factor is
      wide because the two timings are not interleaved (a shared CI machine's load
      swings in between). A baseline that is an implementation callable is the
      submission's own code and cannot be checked so.

    In the worker, a candidate whose plain (untimed) call takes more than a third of the
    call limit shared out over every call of the request fails at once, rather than
    timing out (a timeout counts against the submission's budget).

    Raises AssertionError when the candidate called a forbidden name or op, was too
    slow to time, or a check fails; SandboxError for malformed figures."""
    inputs = [tuple(a) for a in inputs]
    warmup_inputs = [tuple(a) for a in warmup_inputs]
    repeats = len(inputs) if repeats is None else int(repeats)
    if len(warmup_inputs) < bench.WARMUP_MIN or repeats < bench.REPEATS_MIN:
        raise ValueError(f"need >= {bench.WARMUP_MIN} warm-up inputs and >= {bench.REPEATS_MIN} repeats, "
                         f"got {len(warmup_inputs)} and {repeats}")
    kwargs, baseline_kwargs = dict(kwargs or {}), dict(baseline_kwargs or {})
    dev = torch.device(device)
    threads = (1 if dev.type == "cpu" else None) if threads is None else int(threads)
    opts = {"threads": threads, "device": str(dev), "repeats": repeats, "forbid": list(forbid),
            "forbid_ops": list(forbid_ops), "reason": reason, "backend": backend, "no_grad": no_grad}
    name = getattr(candidate, "_short", getattr(candidate, "__name__", "the candidate"))
    remote = isinstance(candidate, RemoteObject)
    if remote:  # what one call may take so that the whole timed request fits in the call limit
        limit = candidate._sandbox.cfg.call_timeout_s if timeout is None else timeout
        opts["max_call_s"] = limit / (3 * (len(warmup_inputs) + repeats + 2))

    # figures of this process: the flush and the loop's own overhead per call, the copy of the pool
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    with probes._threads(threads):
        buf = bench.flush_buffer(dev)
        flush_s = _median_of(lambda: (buf.zero_(), sync()), clock=time.thread_time if dev.type == "cpu" else None)
        del buf
        noop = bench.run_interleaved({"a": lambda *a, **k: None, "b": lambda *a, **k: None}, [()], [()] * 3,
                                     device=dev, repeats=bench.REPEATS_MIN, flush=False)
        loop_s = max(max(tm.wall_s + tm.warmup_s) for tm in noop.values())
        copy_s = _median_of(lambda: (_clone_args(inputs), sync()), n=3,
                            clock=time.thread_time if dev.type == "cpu" else None)

    if remote:
        sb, server = candidate._sandbox, candidate._server

        def keep(value, what):
            return sb.send({"op": "probe", "name": "keep", "keys": ["value"]}, {"v_value": value}, what,
                           server=server, timeout=timeout)[0]
        t0 = time.perf_counter()
        keep(None, "timing a round trip")
        rtt_s = time.perf_counter() - t0
        pool, warm = keep([list(a) for a in inputs], "sending the timing inputs"), \
            keep([list(a) for a in warmup_inputs], "sending the warm-up inputs")
    else:
        rtt_s = 0.0
        pool, warm = [list(a) for a in _clone_args(inputs)], [list(a) for a in _clone_args(warmup_inputs)]
    cpu0 = time.process_time()
    value, figures, outside = run_probe("timed", target=candidate, baseline=baseline, inputs=pool,
                                        warmup_inputs=warm, kwargs=kwargs, baseline_kwargs=baseline_kwargs,
                                        opts=opts, what=f"timing {name}", timeout=timeout)
    # the outside total: the worker's CPU seconds from /proc on CPU (this process's when local),
    # the wall clock of the request on CUDA (or where /proc cannot be read)
    on_cpu = dev.type == "cpu" and (outside["cpu_s"] is not None or not remote)
    out_total = (outside["cpu_s"] if remote else time.process_time() - cpu0) if on_cpu else outside["wall_s"]
    called = figures.get("forbidden") or figures.get("ops_forbidden")
    if called:
        raise AssertionError(f"{name} called {', '.join(str(c)[:100] for c in called[:5])} during the timed "
                             f"calls: {reason}")
    if "too_slow_s" in figures:
        slow = _samples({"t": [figures["too_slow_s"]]}, "t")[0]
        raise AssertionError(f"one call of {name} took {slow:.3g} s: too slow to time within the call limit "
                             f"(at most {opts['max_call_s']:.3g} s per call here): no performance credit")
    n_warm = len(warmup_inputs)
    cand, base = figures.get("candidate"), figures.get("baseline")
    c_times, b_times = _samples(cand, "times_s", repeats), _samples(base, "times_s", repeats)
    c_warm, b_warm = _samples(cand, "warmup_s", n_warm + 1), _samples(base, "warmup_s", n_warm)
    if on_cpu:  # CPU seconds of every call
        c_claim, b_claim = sum(c_times) + sum(c_warm), sum(b_times) + sum(b_warm)
    else:       # wall seconds of every call
        c_claim = _samples({"t": [cand.get("total_s")]}, "t")[0] + c_warm[0]
        b_claim = _samples({"t": [base.get("total_s")]}, "t")[0]

    # every timed output, checked here
    if len(value) != len(inputs):
        raise SandboxError("the implementation's process sent the wrong number of timed outputs")
    for i in range(len(inputs)):
        out = value[i]
        if check is not None:
            check(i, out)

    median = bench._median
    c_s, b_s = median(c_times), median(b_times)
    b_local = None
    baseline_outside = False
    b_share = b_claim  # the baseline's share of the outside total
    if verify_baseline and isinstance(baseline, str):
        fn = probes.BASELINES[baseline]
        guards = {}
        if backend is not None:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            chosen = getattr(SDPBackend, probes.SDPA_BACKENDS[backend])
            guards["baseline"] = lambda: sdpa_kernel(chosen)
        with torch.no_grad() if no_grad else contextlib.nullcontext(), probes._threads(threads):
            mine = bench.run_interleaved({"baseline": fn}, _clone_args(inputs), _clone_args(warmup_inputs),
                                         device=dev, repeats=repeats, kwargs={"baseline": baseline_kwargs},
                                         guards=guards)
        b_local = mine["baseline"].median_s
        clamped = min(max(b_s, b_local / BASELINE_TOLERANCE), b_local * BASELINE_TOLERANCE)
        if clamped != b_s:
            b_s, baseline_outside = clamped, True
        b_share = min(b_claim, (n_warm + repeats) * BASELINE_TOLERANCE * b_local)

    n_c, n_b = n_warm + repeats + (2 if "max_call_s" in opts else 1), n_warm + repeats
    claimed = c_claim + b_claim
    per_call = 2 * (flush_s + loop_s)
    fixed = OUTSIDE_FIXED_S + 2 * copy_s + (2 * rtt_s if not on_cpu else 0.0) + (CPU_TICK_S if on_cpu else 0.0)
    unexplained = out_total - claimed - (n_c + n_b) * per_call - fixed
    used_outside = unexplained > OUTSIDE_MARGIN * claimed
    if used_outside:
        implied = (out_total - fixed - (n_c + n_b) * per_call - b_share) / n_c
        c_s = max(c_s, implied)
    ratio = c_s / b_s if b_s > 0 else math.inf
    report = {"flush_s": flush_s, "loop_overhead_s": loop_s, "copy_s": copy_s, "rtt_s": rtt_s,
              "candidate_s": c_s, "baseline_s": b_s, "claimed_candidate_s": median(c_times),
              "claimed_baseline_s": median(b_times), "outside_total_s": out_total, "outside_clock":
              "cpu" if on_cpu else "wall", "claimed_s": claimed, "unexplained_s": unexplained,
              "outside": used_outside, "baseline_outside": baseline_outside}
    if b_local is not None:
        report["local_baseline_s"] = b_local
    return Timed(ratio=ratio, candidate_s=c_s, baseline_s=b_s, outside=used_outside,
                 baseline_outside=baseline_outside, figures=report)


# --- recomputation and loss scaling (activation checkpointing, mixed precision) -----------------

def build_recompute(on, specs: list, states: list):
    """A list of trusted ``RecomputeNet`` modules (``harness.sandbox.probes``), one per spec,
    loaded from ``states``: made in the worker holding ``on`` (the implementation module's
    handle; the value is then a handle to the list) or here (``on`` a local module or None)."""
    if isinstance(on, RemoteObject):
        return run_probe("build_recompute", on=on, specs=list(specs), states=list(states),
                         what="building the trusted modules")[0]
    return probes.probe_build_recompute(on, list(specs), list(states))[0]


def _checked_dict(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise SandboxError(f"the implementation's process sent a malformed answer ({what})")
    return value


def recompute(target, args: tuple, *, watch, grad_output=None, kwargs: dict | None = None,
              requires_grad: tuple | None = None, seed: int = 0, draws: int = 4, autocast_forward=None,
              autocast_backward=None, forbid: Iterable[str] = (), reason: str = "the contract forbids it") -> dict:
    """``out = target(*args, **kwargs)`` then ``torch.autograd.backward(out, grad_output)``, watched
    next to the implementation (``probes.probe_recompute``): under ``torch.manual_seed(seed)``,
    ``draws`` numbers drawn from the global RNG between forward and backward, the forward's
    saved storages counted through ``saved_tensors_hooks`` (``watch``'s parameters left out),
    the custom autograd nodes' kept tensors, each watched module's calls by phase, 8 numbers
    drawn after backward. ``autocast_forward`` / ``autocast_backward``: None (as is), ``"off"``,
    ``"float16"``, ``"bfloat16"`` (CPU autocast). ``target`` is an implementation callable for
    the submission, or a local callable (the grader's direct call: its oracle, run here with the
    same code). ``requires_grad``: one bool per positional argument (default: the tensors' own).
    Returns the probe's dict (see ``probes.probe_recompute``)."""
    rg = list(requires_grad) if requires_grad is not None else \
        [isinstance(a, torch.Tensor) and a.requires_grad for a in args]
    opts = {"requires_grad": rg, "seed": int(seed), "draws": int(draws), "autocast_forward": autocast_forward,
            "autocast_backward": autocast_backward, "forbid": list(forbid), "reason": reason}
    sent = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    value, _, _ = run_probe("recompute", target=target, args=sent, kwargs=kwargs or {}, watch=watch,
                            grad_output=grad_output, opts=opts,
                            what=f"forward and backward through {getattr(target, '_short', getattr(target, '__name__', 'a call'))}")
    return _checked_dict(value, "recomputation")


def drive_scaler(target, *, kwargs: dict, params: list, script: list, optimizer: dict) -> dict:
    """Drive the loss scaler ``target(**kwargs)`` (the submission's class, or the trusted
    ``probes.GradScalerAdapter`` run here as the oracle) through ``script``, one scripted
    gradient per parameter and step (``probes.probe_scaler_run``). Returns its dict."""
    value, _, _ = run_probe("scaler_run", target=target, kwargs=dict(kwargs), params=list(params),
                            script=list(script), opts={"optimizer": dict(optimizer)},
                            what=f"driving {getattr(target, '_short', getattr(target, '__name__', 'a scaler'))}")
    return _checked_dict(value, "loss scaler run")


def train_steps(target, *, spec: dict, state: dict, batches: list, scaler=None, opts: dict) -> list:
    """Training steps of a trusted ``RecomputeNet`` through ``target`` (the submission's
    ``train_step``, or a local reference step: the oracle), one per batch
    (``probes.probe_train_steps``; ``scaler``: a scaler class, ``"torch.amp.GradScaler"`` (the
    trusted ``probes.GradScalerAdapter``, made where the step runs) or None). Returns one dict
    per step."""
    value, _, _ = run_probe("train_steps", target=target, spec=dict(spec), state=dict(state), batches=list(batches),
                            scaler=scaler, opts=dict(opts),
                            what=f"training through {getattr(target, '_short', getattr(target, '__name__', 'a step'))}")
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise SandboxError("the implementation's process sent malformed training steps")
    return value
