"""A warm template of the sandbox's launcher: one process that has imported torch forks each worker.

Starting a worker used to cost a fresh Python that imports torch, ``torch.distributed``,
the compiler stack the probes use and Triton: 2.5 to 4 CPU seconds, paid again for every
grading, every world size of a multi-rank lab and every restart after a crash. A zygote
pays it once. It is a fresh ``python -I`` (never a fork of the grader: it holds no grader
module, no seed, no course path) started with the worker's scrubbed environment, that
imports the worker-facing harness (a staged copy, :func:`isolation.stage_harness`) and what
the launcher imports, runs no op (an op could start torch's thread pools, and a forked
child would hang in its first parallel op), and then only forks.

Each :func:`spawn` asks it for one launcher. Its child, still trusted code:

1. starts a session of its own and joins the worker's cgroups (before anything else, so
   its work and its children's are the worker's from the start);
2. takes the control socket as fds 0 and 1 and the log as fd 2, closes every other fd
   (the zygote's socket included), enters the worker's directory and environment;
3. where the host has namespaces, unshares them (network, pid, IPC, UTS, cgroup, mount;
   a user namespace mapping root to the grader's uid when the grader is not root, as
   ``unshare --map-root-user``), makes every mount private and forks the launcher as pid 1
   of the new pid namespace, then waits for it and exits with its status (the launcher dies
   with it: ``PR_SET_PDEATHSIG``), as ``unshare --fork --kill-child`` did;
4. runs ``harness.sandbox.server.main`` (the launcher): isolation, the allow-list root, the
   grading's uid, then the servers that import the submission, exactly as before.

The zygote never imports a submission and no child's state flows back into it: it forks
from a state no grading has touched. Only the trusted side can reach it: its socket lives in
a 0700 directory of the grader's user, each connection's peer must be that user
(``SO_PEERCRED``), and a worker's own network and mount namespaces leave the socket out of
its view. It exits when the process that started it closes its stdin (exits).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import glob
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from . import isolation, server

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_REC, MS_PRIVATE = 16384, 1 << 18
PR_SET_PDEATHSIG = 1
_IMPORTED_WITH: dict = {}  # the zygote's values of IMPORT_ENV when it imported torch and Triton
WARM = ("torch", "torch.distributed", "torch._dynamo", "torch.utils.flop_counter", "triton.runtime.jit")
# what torch and Triton read when they are imported (Triton decorates its own library for its
# interpreter or not): a launcher whose environment differs here is a fresh Python, not a fork
IMPORT_ENV = ("TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH",
              "CUDA_HOME")


def launcher_env(env: dict) -> dict:
    """``env`` (a scrubbed environment) as a launcher and the zygote get it: where the host has no
    NVIDIA device, Triton can only run under its interpreter, so ``TRITON_INTERPRET=1`` unless set."""
    if "TRITON_INTERPRET" not in env and not glob.glob("/dev/nvidia[0-9]*"):
        env = {**env, "TRITON_INTERPRET": "1"}
    return env


# --- the zygote (its own process) --------------------------------------------------------------

def serve(path: str) -> None:
    """Import what a launcher imports, listen on ``path``, fork a launcher per request; return
    when stdin closes (the starter exited)."""
    import importlib
    _IMPORTED_WITH.update({k: os.environ.get(k) for k in IMPORT_ENV})
    ctypes.CDLL(None).mallopt(-8, 1)  # one malloc arena, as the launcher sets (see server.main)
    for name in WARM:  # what server.main imports (Triton where it is installed)
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.freeze()  # the warm heap: a worker's collections skip it, and its pages stay shared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    os.write(1, b"ready\n")
    while True:
        ready, _, _ = select.select([0, listener], [], [], 0.5)
        while True:  # reap the children that exited (each waited for its launcher)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        if 0 in ready and not os.read(0, 64):
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            return
        if listener in ready:
            conn, _ = listener.accept()
            try:
                _answer(conn, listener)
            except (OSError, ValueError):  # a request it cannot read: that client gets no launcher
                pass
            finally:
                conn.close()


def _answer(conn: socket.socket, listener: socket.socket) -> None:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    if int.from_bytes(creds[4:8], sys.byteorder) != os.geteuid():
        return  # only the grader's own user may ask
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 2)
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return
    request = json.loads(msg)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 70
        try:
            listener.close()
            conn.close()
            code = _launch(request, *fds)
        finally:
            os._exit(code)
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(pid)  # opened while the child cannot have been reaped: it is this one
    try:
        socket.send_fds(conn, [json.dumps({"pid": pid}).encode()], [pidfd])
    finally:
        os.close(pidfd)


def _launch(request: dict, ctl: int, log: int) -> int:
    """Steps 1-4 of the module docstring, in the forked child; returns the exit status."""
    os.setsid()
    for f in request["cgroup_procs"]:
        with open(f, "w") as fh:
            fh.write(str(os.getpid()))
    os.dup2(ctl, 0)
    os.dup2(ctl, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(request["workdir"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv[1:] = []
    fresh = any(request["env"].get(k) != _IMPORTED_WITH.get(k) for k in IMPORT_ENV)
    libc = ctypes.CDLL(None, use_errno=True)
    mode = request["namespaces"]  # "", "root" or "user"
    if mode:
        uid, gid = os.geteuid(), os.getegid()
        flags = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP | CLONE_NEWNS
        if libc.unshare(flags | (CLONE_NEWUSER if mode == "user" else 0)) != 0:
            os.write(2, f"unshare: {os.strerror(ctypes.get_errno())}\n".encode())
            return 71
        if mode == "user":
            for name, text in (("uid_map", f"0 {uid} 1"), ("setgroups", "deny"), ("gid_map", f"0 {gid} 1")):
                with open(f"/proc/self/{name}", "w") as fh:
                    fh.write(text)
        if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            os.write(2, f"making / private: {os.strerror(ctypes.get_errno())}\n".encode())
            return 71
        pid = os.fork()
        if pid:  # the process between: it holds nothing of the launcher's and waits for it
            for fd in (0, 1, 2):
                os.close(fd)
            return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if fresh:  # what was imported here does not fit this environment: a fresh Python, as before the zygote
        boot = f"import sys; sys.path.insert(0, {sys.path[0]!r}); from harness.sandbox.server import main; main()"
        os.execv(sys.executable, [sys.executable, "-I", "-c", boot])
    server.main()
    return 0


# --- the trusted side ----------------------------------------------------------------------------

class Launcher:
    """The zygote's child for one worker, held through a pidfd (it is not this process's
    child): ``pid``, ``poll()``, ``wait(timeout)`` and ``kill()`` as ``subprocess.Popen``'s,
    except that an exit status is not known (``poll`` answers 0 once it exited)."""

    def __init__(self, pid: int, pidfd: int):
        self.pid, self._fd = pid, pidfd
        self.lib = ""

    def poll(self) -> int | None:
        if self._fd is None:
            return 0
        if select.select([self._fd], [], [], 0)[0]:
            self._close()
            return 0
        return None

    def wait(self, timeout: float | None = None) -> int:
        if self._fd is not None and not select.select([self._fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("launcher", timeout)
        self._close()
        return 0

    def kill(self) -> None:
        if self._fd is not None:
            try:
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self._close()


_ZYGOTE: tuple[subprocess.Popen, str] | None = None  # this process's, or the one it was forked with
_LOCK = threading.Lock()


def start() -> None:
    """Start this process's zygote if it has none, and return when it is ready: a process forked
    after this (a run of the warm grader) uses the same one. Raises OSError when it cannot start."""
    global _ZYGOTE
    with _LOCK:
        if _ZYGOTE is not None:
            return
        home = tempfile.mkdtemp(prefix="labs-zygote-")  # 0700 until ready: only this user reaches the socket
        lib = isolation.stage_harness(home)
        path = os.path.join(home, "socket")
        boot = (f"import sys; sys.path.insert(0, {lib!r}); "
                f"from harness.sandbox.zygote import serve; serve({path!r})")
        proc = subprocess.Popen([sys.executable, "-I", "-c", boot], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                cwd=home, env=launcher_env(isolation.scrubbed_env(home)), close_fds=True,
                                start_new_session=True)
        if proc.stdout.readline() != b"ready\n":
            proc.kill()
            raise OSError(f"the sandbox's zygote did not start (exit {proc.wait()})")
        proc.stdout.close()
        os.chmod(home, 0o711)  # without namespaces the worker's user reads the staged harness (not the socket: 0600)
        _ZYGOTE = (proc, path)
        atexit.register(stop)


def stop() -> None:
    """End this process's zygote, if any, and wait for it: the CPU time of every worker it
    forked then counts in this process's children (``/usr/bin/time``, ``RUSAGE_CHILDREN``)."""
    global _ZYGOTE
    with _LOCK:
        if _ZYGOTE is None:
            return
        proc, _ = _ZYGOTE
        _ZYGOTE = None
    with contextlib.suppress(OSError):
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def spawn(*, workdir: str, env: dict, cgroup_procs: list[str], ctl: int, log: int) -> Launcher:
    """A launcher for one worker (steps 1-4 of the module docstring), the control socket ``ctl``
    as its stdin and stdout and ``log`` as its stderr. Raises OSError when the zygote cannot
    be reached or cannot fork. The launcher's ``lib``: the staged harness the zygote imported
    (the launcher's ``sys.path[0]``, to be part of its root)."""
    global _ZYGOTE
    start()
    prefix = isolation.isolation_prefix()
    mode = "" if not prefix else ("user" if "--user" in prefix else "root")
    request = json.dumps({"workdir": workdir, "env": env, "cgroup_procs": cgroup_procs, "namespaces": mode})
    for attempt in (1, 2):
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(30)
                s.connect(_ZYGOTE[1])
                socket.send_fds(s, [request.encode()], [ctl, log])
                msg, fds, _, _ = socket.recv_fds(s, 4096, 1)
            break
        except (ConnectionRefusedError, FileNotFoundError):  # it exited (its starter did): a new one
            if attempt == 2:
                raise
            _ZYGOTE = None
            start()
    if len(fds) != 1:
        raise OSError("the sandbox's zygote did not fork a launcher")
    launcher = Launcher(json.loads(msg)["pid"], fds[0])
    launcher.lib = os.path.join(os.path.dirname(_ZYGOTE[1]), "lib")
    return launcher
