"""The worker and its proxies: start a sandboxed worker, send it requests, hold handles to its objects.

With ``pytest --sandbox worker`` (``labs grade``) the ``impl`` fixture is a
:class:`RemoteModule`; with ``--sandbox none`` (students' local runs) it is the
module itself. Graders are written once for both: ``impl.f(*args, **kw)`` calls
``f`` in the worker; ``impl.Cls(...)``, a method returning an object, or an attribute
holding one gives a :class:`RemoteObject` handle living in the worker (calls,
``obj(x)``, ``obj.attr``, ``obj[i]``, ``len(obj)``, ``for x in obj`` are proxied).
Tensors, numbers, strings, None, dtypes, devices, tuples, lists and dicts travel by
value both ways (``harness.sandbox.wire``). Measurements are probe calls
(``harness.sandbox.calls``, ``harness.sandbox.timing``).

Worker life: a :class:`Worker` is one launcher process (``harness.sandbox.server``)
holding ``servers`` request loops: one for a single-process lab, W for the ranks
of a multi-rank lab (``harness.sandbox.ranks``). A :class:`Sandbox` restarts its
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
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..impl import APIMismatch
from . import isolation, wire
from . import cgroups, outside, zygote
from .outside import descendants, ns_pid
from .wire import Handle, WireError
from ..errors import ExitCode, LabsError


# --- errors ------------------------------------------------------------------------------------

class SandboxError(LabsError):
    """The sandboxed implementation could not answer (crash, early exit, timeout, protocol)."""
    code = ExitCode.GRADING_FAILED


class WorkerCrashed(SandboxError):
    pass


class WorkerTimeout(SandboxError):
    pass


class NotRun(SandboxError):
    """The submission's grading budget is spent (it timed out ``MAX_TIMEOUTS`` times or died
    ``MAX_CRASHES`` times): this call, and its test, did not run (recorded as "not run", never
    as a failure of what it would have graded). ``timed_out``: the budget went on timeouts."""

    def __init__(self, message: str, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


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
    lab: str = ""         # the lab's number (named in an api mismatch)
    hide: list = dataclasses.field(default_factory=list)   # paths made empty in the worker (mount ns)
    own: str = ""         # the submission's own folder (in hide): without namespaces it may stay readable
    memory_mb: int = 8192
    cpu_s: int = 3600
    nproc: int = 512
    call_timeout_s: float = 300.0  # wall seconds a call may wait without using CPU (a sleep, a deadlock)
    call_cpu_s: float = 300.0      # CPU seconds a call may use (an endless loop): load cannot inflate it
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
            raise NotRun(f"not run: the implementation timed out {self.timeouts} times before this test; its "
                         f"remaining tests are not run (grading time is bounded)", timed_out=True)
        if self.crashes >= MAX_CRASHES:
            raise NotRun(f"not run: the implementation's process died {self.crashes} times before this test; its "
                         f"remaining tests are not run")


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


class Worker:
    """One launcher process and its servers: started, asked, killed. A server's requests
    are serial; different servers may be asked from different threads."""

    def __init__(self, cfg: WorkerConfig):
        self.cfg = cfg
        self.proc: zygote.Launcher | None = None
        self.channels: list[_Channel] = []
        self.notes: list[str] = []
        self.import_error: str | None = None
        self.generation = 0
        self.workdir: str | None = None
        self.groups: cgroups.WorkerGroups | None = None  # the worker's cgroups, where they can be made
        self.figures: list[outside.Figures] = []  # per server: what the trusted side reads from outside
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
        self.channels = [_Channel() for _ in range(self.cfg.servers)]
        # The control channel is a socket: the servers' pipes travel over it (SCM_RIGHTS) once the
        # launcher runs, so no process between us and it holds a copy that would hide an EOF.
        ctl, ctl_child = socket.socketpair()
        self.groups = cgroups.WorkerGroups.make(self.cfg.servers, pids=self.cfg.nproc,
                                                memory_bytes=(self.cfg.memory_mb + 1024) * (self.cfg.servers + 1) << 20)
        try:  # a fork of the warm template (harness.sandbox.zygote): torch is imported already
            self.proc = zygote.spawn(workdir=self.workdir, env=isolation.scrubbed_env(self.workdir),
                                     cgroup_procs=self.groups.launcher.procs_files() if self.groups else [],
                                     ctl=ctl_child.fileno(), log=self._log.fileno())
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
                 "hide": [str(p) for p in self.cfg.hide], "own": self.cfg.own, "private": isolation.grader_side_files(),
                 "memory_mb": self.cfg.memory_mb, "cpu_s": self.cfg.cpu_s,
                 "nproc": self.cfg.nproc, "harness_parent": self.proc.lib,
                 "package_dirs": isolation.package_dirs(),
                 "module_source": self.cfg.module_source, "module_filename": self.cfg.module_filename,
                 "stub_source": self.cfg.stub_source, "api": list(self.cfg.api), "lab": self.cfg.lab,
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
        # each server says it forked; we move it into its cgroup, it makes its memory its own and says
        # so; we read where it starts from; then it imports the submission and says ready
        try:
            for i, c in enumerate(self.channels):
                c.pid = self._place(i, self._frame(c, deadline, "forked"))
                wire.write_frame(c.req_w, {"op": "go"})
            for c in self.channels:
                self._frame(c, deadline, "private")
            launcher = self._launcher_pid()
            self.figures = [outside.Figures(c.pid, self.groups.servers[i] if self.groups else None, launcher,
                                            [x.pid for x in self.channels]) for i, c in enumerate(self.channels)]
            for c in self.channels:
                wire.write_frame(c.req_w, {"op": "import"})
        except (TimeoutError, EOFError, OSError, WireError, ValueError) as e:
            tail = self.output_tail()
            self.kill()
            raise SandboxStartError(f"a server of the sandbox could not start ({type(e).__name__}: {e})"
                                    + (f"; its output:\n{tail}" if tail else "")) from None
        for i, c in enumerate(self.channels):
            watch = self.watch(i)  # the import is a call like any other: the same limits
            try:
                ready, _ = c.reader.read_frame(watch.deadline, max_bytes=0, check=watch.check)
            except TimeoutError:
                tail = self.output_tail()
                self.kill()
                raise WorkerTimeout(f"importing the implementation: it {watch.why()}"
                                    + (f"; its last output:\n{tail}" if tail else "")) from None
            except (EOFError, OSError, WireError, ValueError):
                tail = self.output_tail()
                self.kill()
                raise WorkerCrashed("the implementation's process died while importing the submission"
                                    + (f"; its last output:\n{tail}" if tail else "")) from None
            if not ready.get("ok"):
                self.import_error = str(ready.get("error", "import failed"))[:4000]
                return

    @staticmethod
    def _frame(c: "_Channel", deadline: float, key: str) -> dict:
        """The next start-up frame of a server, which must carry ``key`` (before the submission is
        imported: anything else is an infrastructure failure)."""
        frame, _ = c.reader.read_frame(deadline, max_bytes=0)
        if "infra" in frame:
            raise ValueError(str(frame["infra"])[:2000])
        if key not in frame:
            raise ValueError(f"expected {key!r}, got {sorted(frame)[:5]}")
        return frame

    def _launcher_pid(self) -> int:
        """The launcher's host pid (the child of ``unshare`` that is pid 1 of the new namespace)."""
        if isolation.isolation_prefix():
            found = [k for k in descendants(self.proc.pid) if ns_pid(k) == 1]
            if found:
                return found[0]
        return self.proc.pid

    def _place(self, i: int, frame: dict) -> int:
        """The host pid of server ``i`` (it reported its pid in its own namespace), moved into its
        cgroup before it runs a line of the submission."""
        theirs = frame.get("forked")
        if not isinstance(theirs, int):
            raise ValueError("a malformed forked frame")
        if isolation.isolation_prefix():
            found = [k for k in descendants(self.proc.pid) if ns_pid(k) == theirs]
            if len(found) != 1:
                raise ValueError(f"server {i} (pid {theirs} in its namespace) not found among the worker's processes")
            pid = found[0]
        else:
            pid = theirs
            if pid not in descendants(self.proc.pid):
                raise ValueError(f"server {i} (pid {pid}) is not a process of this worker")
        if self.groups is not None:
            self.groups.servers[i].add(pid)
        return pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid_of_server(self, i: int = 0) -> int | None:
        return self.channels[i].pid if i < len(self.channels) else None

    def watch(self, server: int, wall_s: float | None = None) -> "outside.CallWatch":
        """The limits of one call to ``server`` (see :class:`outside.CallWatch`): the ranks of a multi-rank
        lab are watched together (a rank waiting for a busy peer is not hung)."""
        wall_s = self.cfg.call_timeout_s if wall_s is None else wall_s
        cpu_s = self.cfg.call_cpu_s if wall_s == self.cfg.call_timeout_s else min(self.cfg.call_cpu_s,
                                                                                   wall_s * outside.CPU_PER_WALL)
        if self.cfg.ranks and self.figures:
            return outside.CallWatch(outside.AllServers(self.figures), wall_s, cpu_s * len(self.figures))
        return outside.CallWatch(self.figures[server] if server < len(self.figures) else None, wall_s, cpu_s)

    def terminate(self) -> None:
        """SIGKILL the launcher and its servers, leaving pipes open (other threads may be
        reading them: they see EOF). Safe to call from any thread, any number of times."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        groups = self.groups
        if groups is not None:  # what left the process group (setsid) is still in the cgroup
            groups.worker.kill(timeout_s=2.0)

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
                isolation.remove_ipc_of_uid(drop[0])  # and the System V objects it made (no IPC namespace)
        self.proc = None
        if self.groups is not None:  # whatever is left in the worker's cgroups dies, and they go
            self.groups.remove()
            self.groups = None
        self.figures = []
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
        watch = self.watch(server, timeout)
        try:
            wire.write_frame(c.req_w, header, buffers)
            return c.reader.read_frame(watch.deadline, max_bytes=limit, check=watch.check)
        except TimeoutError:
            tail = self.output_tail()
            cleanup()
            raise WorkerTimeout(f"the implementation {watch.why()} ({what}); its process was stopped"
                                + (f"; its last output:\n{tail}" if tail else "")) from None
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
        self.import_timed_out = False  # its import did not finish: final, the grading's status is timeout
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
            except WorkerTimeout as e:
                self.budget.timeouts += 1
                self.worker = None
                if w.generation == 1:  # the submission's import hung: nothing of it can be graded
                    self.import_error, self.import_timed_out = f"importing {self.module_path.name} timed out: {e}", True
                    raise SandboxError(self.import_error) from None
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
        if exc.get("api") is True:  # a grader's call the submission's API does not accept: this test fails
            raise APIMismatch(str(exc.get("msg", ""))[:2000])
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
