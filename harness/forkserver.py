"""A warm grader: one process that has imported torch, pytest and the harness forks each grader run.

A grader run (``pytest graders/NN --impl ... --sandbox worker``, ``harness.grading.run``) used
to be a fresh Python that spent about 3 CPU seconds importing torch, pytest and the harness
before its first test. :class:`ForkServer` starts that Python once, imports what every run
imports, and then forks one child per run: the child sets its working directory,
environment and output, and runs ``pytest.main(argv)``; its exit status comes back. A fork
gives every run a fresh copy of the warm process, so nothing of one run (module state,
caches, handles) reaches the next; the server itself never runs a test and holds no
state of a run.

The server is trusted code only (it never imports a submission: student code runs in the
sandbox workers a run starts, as ever). It dies with the process that started it
(``PR_SET_PDEATHSIG``), and each run's child with it. :func:`run` is the one entry point:
``run(argv, cwd=..., env=..., timeout=...)`` returns ``(exit code, output, timed out)``, like
``subprocess.run`` of ``python -m pytest argv`` with a time limit. It starts the process's
server on first use; set ``LABS_FORKSERVER=0`` for a fresh Python per run instead.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

WARM_MODULES = ("torch", "torch._dynamo", "torch.utils.flop_counter", "torch.distributed", "pytest", "xdist",
                "pytest_timeout", "harness.plugin", "harness.toolkit", "harness.sandbox.worker",
                "harness.sandbox.ranks", "harness.sandbox.timing", "harness.progress")


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``), so a killed
    `labs grade-all` leaves no grader running (a run's own session escapes the terminal's
    process-group signal). A no-op elsewhere."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# --- the server (its own process) --------------------------------------------------------------

def serve() -> None:
    """The server's loop: import ``WARM_MODULES``, then for each request fork a run; report
    each run's pid when it starts and its exit status when it ends. Runs until the client
    closes its end (stdin is the socket)."""
    import importlib
    import selectors
    die_with_parent()
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    _warm_pytest_plugins()
    pycache = tempfile.mkdtemp(prefix="labs-pycache-")  # 0700: this server's own
    from .sandbox import zygote
    zygote.start()  # every run's sandbox workers fork from it (before any run: they inherit it)
    gc.freeze()  # the warm heap: a run's collections skip it, and its pages stay shared
    sock = socket.socket(fileno=os.dup(0))
    os.close(0)
    os.open(os.devnull, os.O_RDONLY)
    running: dict[int, int] = {}  # pid -> request id
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    _send(sock, {"ready": True})
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is sock:
                msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 4)  # one request per message (SEQPACKET)
                if not msg:
                    for pid in running:
                        with contextlib.suppress(OSError):
                            os.killpg(pid, signal.SIGKILL)
                    shutil.rmtree(pycache, ignore_errors=True)
                    zygote.stop()
                    return
                req = json.loads(msg)
                pid = os.fork()
                if pid == 0:  # pragma: no cover - the run
                    _child(req, fds, pycache)
                for fd in fds:
                    os.close(fd)
                running[pid] = req["id"]
                _send(sock, {"id": req["id"], "pid": pid})
            else:
                with contextlib.suppress(OSError):
                    os.read(wake_r, 4096)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            rid = running.pop(pid, None)
            if rid is not None:
                _send(sock, {"id": rid, "exit": os.waitstatus_to_exitcode(status)})


def _warm_pytest_plugins() -> None:
    """Import the installed pytest plugins (entry points ``pytest11``) and fill importlib's
    metadata cache, which each run's ``pytest.main`` would otherwise scan and import again
    (about 0.4 CPU s a run)."""
    from importlib.metadata import entry_points
    for ep in entry_points(group="pytest11"):
        with contextlib.suppress(Exception):
            ep.load()


def _child(req: dict, fds: list, pycache: str) -> None:
    """In the forked run: its own session, working directory, environment and output, then
    ``pytest.main``; never returns. The graders' modules, assertion-rewritten, are cached as
    bytecode in ``pycache`` (the server's private folder, never the course tree), so only a
    server's first run of a lab compiles them (about 0.4 CPU s a run)."""
    code = 70
    try:
        die_with_parent()  # the server: which dies with the grading process
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        out = fds[0]
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.pycache_prefix, sys.dont_write_bytecode = pycache, False
        sys.argv = ["pytest", *req["argv"]]
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = sys.stdout
        import pytest
        code = int(pytest.main(list(req["argv"])))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported as the run's exit status
        import traceback
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


def _send(sock: socket.socket, msg: dict) -> None:
    sock.send(json.dumps(msg).encode())


# --- the client (the grading process) ------------------------------------------------------------

class ForkServer:
    """A started server and the runs it forked for this process (thread safe)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        boot = "from harness.forkserver import serve; serve()"
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", boot], stdin=theirs.fileno(), env=env,
                                     stdout=subprocess.DEVNULL, close_fds=True)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.cond = threading.Condition()
        self.events: dict[int, dict] = {}
        self.next_id = 0
        self.alive = True
        self.sock.settimeout(600)
        first = self.sock.recv(65536)
        if not first or json.loads(first).get("ready") is not True:
            raise OSError("the fork server did not start")
        self.sock.settimeout(None)
        threading.Thread(target=self._reader, daemon=True, name="labs-forkserver").start()

    def _reader(self) -> None:
        while True:
            try:
                msg = self.sock.recv(65536)
            except OSError:
                msg = b""
            if not msg:
                with self.cond:
                    self.alive = False
                    self.cond.notify_all()
                return
            event = json.loads(msg)
            with self.cond:
                self.events.setdefault(event["id"], {}).update(event)
                self.cond.notify_all()

    def _wait(self, rid: int, key: str, deadline: float | None) -> dict | None:
        with self.cond:
            while key not in self.events.get(rid, {}):
                left = None if deadline is None else deadline - time.monotonic()
                if not self.alive or (left is not None and left <= 0):
                    return None
                self.cond.wait(timeout=left if left is None else min(left, 1.0))
            return self.events[rid]

    def run(self, argv: list, *, cwd, env: dict, timeout: float | None) -> tuple[int, str, bool]:
        with tempfile.TemporaryFile() as out:
            with self.lock:
                self.next_id += 1
                rid = self.next_id
                req = json.dumps({"id": rid, "argv": [str(a) for a in argv], "cwd": str(cwd), "env": env})
                socket.send_fds(self.sock, [req.encode()], [out.fileno()])
            deadline = None if timeout is None else time.monotonic() + timeout
            started = self._wait(rid, "pid", time.monotonic() + 600)
            if started is None:
                raise OSError("the fork server did not start the run")
            pid = started["pid"]
            timed_out = False
            done = self._wait(rid, "exit", deadline)
            if done is None:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
                done = self._wait(rid, "exit", time.monotonic() + 60) or {"exit": -signal.SIGKILL}
            with self.cond:
                self.events.pop(rid, None)
            out.seek(0)
            return int(done["exit"]), out.read().decode(errors="replace"), timed_out

    def close(self) -> None:
        """End the server (it kills any run still going) and wait for it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread's recv; close alone would not
            self.sock.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)


_SERVER: list = []
_START = threading.Lock()


def _start() -> ForkServer:
    """A server started from a thread that lives as long as this process: the server dies with
    the thread that forked it (``PR_SET_PDEATHSIG`` follows the thread, not the process), and a
    grading pool's thread ends before the process does. Raises OSError when it cannot start."""
    got: list = []
    ready = threading.Event()

    def parent():
        try:
            got.append(ForkServer())
        except OSError as e:
            got.append(e)
        ready.set()
        threading.Event().wait()  # until the process exits

    threading.Thread(target=parent, daemon=True, name="labs-forkserver-parent").start()
    ready.wait()
    if isinstance(got[0], OSError):
        raise got[0]
    return got[0]


def run(argv: list, *, cwd, env: dict, timeout: float | None) -> tuple[int, str, bool]:
    """``python -m pytest argv`` in ``cwd`` with exactly ``env``, at most ``timeout`` seconds
    (then its whole session is killed): ``(exit code, output, timed out)``. Forked from this
    process's warm server (started on first use), or a fresh Python where ``LABS_FORKSERVER=0``
    or the server cannot start."""
    if os.environ.get("LABS_FORKSERVER", "1") != "0":
        with _START:
            if not _SERVER or not _SERVER[0].alive:
                with contextlib.suppress(OSError):
                    _SERVER[:] = [_start()]
                    atexit.register(_SERVER[0].close)  # waited for: its runs' CPU time counts in ours
        if _SERVER and _SERVER[0].alive:
            with contextlib.suppress(OSError):
                return _SERVER[0].run(argv, cwd=cwd, env=env, timeout=timeout)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *map(str, argv)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            preexec_fn=die_with_parent)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return proc.returncode, out, True
