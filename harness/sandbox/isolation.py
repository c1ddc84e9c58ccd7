"""Isolation of the sandboxed worker: namespaces, the file-system view, limits, the user.

Two halves. The trusted side (:func:`isolation_prefix`, :func:`worker_uid`,
:func:`scrubbed_env`, :func:`kill_all_of_uid`) decides how the worker is started:
behind ``unshare --net --pid --mount`` where the host allows, with a fixed
environment (never the seed or ``LABS_*`` settings). The worker side
(:func:`isolate`, run by ``harness.sandbox.server`` before the submission is
imported, while the process may still be root in its namespaces):

1. brings up the private network namespace's loopback (ranks of a multi-rank lab
   talk gloo over it; nothing else is reachable);
2. hides paths: an empty tmpfs over the course's ``graders/``, ``solutions/``,
   ``tests/`` and the grading work directory, and fresh tmpfs over ``/tmp``,
   ``/var/tmp`` and ``/dev/shm``;
3. sets resource limits: address space (CPU-only runs), CPU seconds, processes,
   file size, core dumps;
4. drops to an unprivileged user when started as root (groups cleared,
   ``no_new_privs``), then asks for SIGKILL when its parent dies.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys

def isolation_prefix() -> list[str]:
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


def worker_uid() -> tuple[int, int, str] | None:
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


def scrubbed_env(home: str) -> dict:
    """The worker's whole environment: a fixed allow-list, never the seed or LABS_* settings."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": os.path.join(home, ".triton"),
           "TORCHINDUCTOR_CACHE_DIR": os.path.join(home, ".inductor"), "MPLCONFIGDIR": home}
    for key in ("TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NVIDIA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def kill_all_of_uid(uid: int) -> None:
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


MS_NOSUID, MS_NODEV, MS_RDONLY = 2, 4, 1
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def _mount_tmpfs(path: str, mode: str = "0755", size: str = "512m") -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if not os.path.isdir(path):
        return False
    rc = libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV,
                    f"mode={mode},size={size}".encode())
    return rc == 0


def _untraversable(path: str) -> tuple[str, str] | None:
    """(A, child): the first ancestor A of ``path`` that others cannot traverse (e.g. a
    0700 /root holding pyenv's Python), and the next component on the way to ``path``."""
    import stat
    parts = os.path.abspath(path).split(os.sep)[1:]
    cur = "/"
    for name in parts:
        st = os.stat(cur)
        if not st.st_mode & stat.S_IXOTH:
            return cur, name
        cur = os.path.join(cur, name)
    return None


def _expose_through(path: str) -> bool:
    """In the mount namespace, replace an untraversable ancestor of ``path`` by an empty
    tmpfs that holds only the way to ``path`` (bind-mounted), so an unprivileged user
    reaches the interpreter and nothing else that was there."""
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC = 4096, 16384
    while True:
        found = _untraversable(path)
        if found is None:
            return True
        parent, child = found
        fd = os.open(os.path.join(parent, child), os.O_PATH)
        if not _mount_tmpfs(parent, "0755", "1m"):
            return False
        target = os.path.join(parent, child)
        os.mkdir(target)
        if libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
            return False
        os.close(fd)


def _fresh_tmpfs_keeping(path: str, keep: list[str]) -> bool:
    """Mount an empty, world-writable tmpfs over ``path`` but bind-mount back the
    directories of ``keep`` that lie under it (with their own submounts, so hidden
    paths stay hidden): a course checked out under /tmp keeps its interpreter,
    packages and harness, and loses everything else there."""
    libc = ctypes.CDLL(None, use_errno=True)
    MS_BIND, MS_REC = 4096, 16384
    under = sorted({k for k in keep if os.path.commonpath([path, os.path.abspath(k)]) == path and k != path},
                   key=len)
    under = [k for i, k in enumerate(under) if not any(k.startswith(u + os.sep) for u in under[:i])]
    fds = [(k, os.open(k, os.O_PATH)) for k in under if os.path.isdir(k)]
    if not _mount_tmpfs(path, "1777"):
        return False
    ok = True
    for k, fd in fds:
        os.makedirs(k, exist_ok=True)
        ok &= libc.mount(f"/proc/self/fd/{fd}".encode(), k.encode(), None, MS_BIND | MS_REC, None) == 0
        os.close(fd)
    return ok


def isolate(cfg: dict) -> list[str]:
    """Steps 1-4 of the module docstring for this process; returns notes on what could not be done."""
    notes = []
    import torch
    needed = [sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(torch.__file__)),
              cfg.get("harness_parent", "/")]
    if cfg.get("namespaces") and cfg.get("uid") is not None:
        for p in set(needed):
            if not _expose_through(p):
                notes.append(f"could not expose {p}")
    if cfg.get("namespaces"):
        if not loopback_up():
            notes.append("could not bring up the private loopback")
        for p in cfg.get("hide", []):
            if not _mount_tmpfs(p, "0555", "1m"):
                notes.append(f"could not hide {p}")
        for p in ("/tmp", "/var/tmp", "/dev/shm"):
            if not _fresh_tmpfs_keeping(p, [os.path.realpath(n) for n in needed]):
                notes.append(f"could not replace {p}")
        work = "/tmp/work"
        os.makedirs(work, exist_ok=True)
        if cfg.get("uid") is not None:
            os.chown(work, cfg["uid"], cfg["gid"])
        os.chdir(work)
        os.environ.update(HOME=work, TMPDIR=work, TRITON_CACHE_DIR=os.path.join(work, ".triton"),
                          TORCHINDUCTOR_CACHE_DIR=os.path.join(work, ".inductor"), MPLCONFIGDIR=work)
    mem = int(cfg.get("memory_mb", 0)) << 20
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, 256 << 20),
              (resource.RLIMIT_CPU, int(cfg.get("cpu_s", 3600))), (resource.RLIMIT_NPROC, int(cfg.get("nproc", 512)))]
    if mem and not cfg.get("cuda"):  # CUDA reserves huge virtual ranges: RLIMIT_AS would break it
        limits.append((resource.RLIMIT_AS, mem + (2 << 30)))  # + the interpreter's and libraries' mappings
    for what, value in limits:
        try:
            soft, hard = resource.getrlimit(what)
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(what, (value, value))
        except (ValueError, OSError):
            notes.append(f"rlimit {what} not set")
    libc = ctypes.CDLL(None, use_errno=True)
    if cfg.get("uid") is not None and not cfg.get("namespaces") and _untraversable(sys.base_prefix):
        notes.append(f"not dropping to {cfg.get('user')}: it cannot reach {sys.base_prefix}")
        cfg["uid"] = None
    if cfg.get("uid") is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
        os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() == 1 and not cfg.get("namespaces"):
        os._exit(3)  # the grader is already gone
    return notes


def loopback_up() -> bool:
    """Set ``lo`` up in this (new, private) network namespace: SIOCGIFFLAGS / SIOCSIFFLAGS."""
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    import fcntl
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("16sh", b"lo", 0)
            flags = struct.unpack("16sh", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
            if not flags & IFF_UP:
                fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))
        return True
    except OSError:
        return False
