"""A cgroup for each worker and each of its servers: every process a submission starts stays inside.

The trusted side makes, for one worker, ``labs-<grader pid>-<n>/`` with a child per process
group it holds: ``launcher`` (the launcher, placed before it runs any code) and ``s0 ..
s{W-1}`` (each server, moved there by the grader before it imports the submission). A
process cannot leave its cgroup (the cgroup's files are root's), and forks, threads,
daemons that reparent, tmpfs and System V shared memory are all charged to it, so the
figures read here cover every process and every page of a server, however the submission
hides its work: memory now and at its peak (anonymous, shmem and tmpfs pages), CPU seconds
(processes that already exited included), processes. After the worker, everything still in
it is killed and the cgroups are removed.

cgroup v2 where its memory controller is available to us, else v1's ``memory``,
``cpuacct`` and ``pids`` controllers (the development and CI machines mount v1); made under
the grader's own cgroup of each controller (so limits above it still apply). Where neither
can be written (not root, a read-only ``/sys/fs/cgroup`` in a container), :func:`hierarchy`
is None and the worker falls back to reading ``/proc`` (``harness.sandbox.outside``).
Sources: the kernel's cgroup-v1 ``memory.rst``, ``cpuacct.rst``, ``pids.rst`` and
``cgroup-v2.rst``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import itertools
import os
import signal
import time
from pathlib import Path

V1_CONTROLLERS = ("memory", "cpuacct", "pids")
_SEQ = itertools.count()


@dataclasses.dataclass(frozen=True)
class Hierarchy:
    """Where our cgroups live: ``version`` 1 or 2; ``bases``: controller (``""`` for v2) to the
    directory of the grader's own cgroup in that hierarchy."""

    version: int
    bases: dict


def _mounts() -> list[tuple[str, str, set]]:
    """(fstype, mount point, super options) of the cgroup file systems this process sees."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
                out.append((rfields[0], fields[4], set(rfields[2].split(","))))
    return out


def _own(version: int, controller: str) -> str | None:
    """This process's cgroup path in the hierarchy of ``controller`` (v1) or the unified one (v2)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hid, ctrls, path = line.split(":", 2)
            if (version == 2 and hid == "0") or (version == 1 and controller in ctrls.split(",")):
                return path
    return None


def _writable(d: Path) -> bool:
    probe = d / f"labs-probe-{os.getpid()}-{next(_SEQ)}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


@functools.lru_cache(maxsize=None)
def hierarchy() -> Hierarchy | None:
    """The cgroup hierarchy our workers' cgroups go in, or None where none can be written
    (``LABS_SANDBOX_NO_CGROUPS=1`` forces None, for tests of the /proc fallback)."""
    if os.environ.get("LABS_SANDBOX_NO_CGROUPS") == "1" or os.geteuid() != 0:
        return None
    mounts = _mounts()
    for fstype, mp, _ in mounts:
        if fstype != "cgroup2":
            continue
        own = _own(2, "")
        base = Path(mp) / (own or "/").lstrip("/")
        try:
            available = set((base / "cgroup.controllers").read_text().split())
            enabled = set((base / "cgroup.subtree_control").read_text().split())
        except OSError:
            continue
        if {"memory", "pids"} <= available:
            for c in sorted({"memory", "pids", "cpu"} & available - enabled):
                with contextlib.suppress(OSError):  # refused where this cgroup holds processes (not the root)
                    (base / "cgroup.subtree_control").write_text(f"+{c}")
            enabled = set((base / "cgroup.subtree_control").read_text().split())
            if {"memory", "pids"} <= enabled and _writable(base):
                return Hierarchy(2, {"": base})
    bases = {}
    for c in V1_CONTROLLERS:
        mp = next((mp for fstype, mp, opts in mounts if fstype == "cgroup" and c in opts), None)
        own = _own(1, c)
        if mp is None or own is None:
            return None
        bases[c] = Path(mp) / own.lstrip("/")
    if all(_writable(b) for b in bases.values()):
        return Hierarchy(1, bases)
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stat(path: Path) -> dict:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.count(" ") == 1)}
    except (OSError, ValueError):
        return {}


class Group:
    """One cgroup (``rel``: its path under each base), its figures and its processes."""

    def __init__(self, hier: Hierarchy, rel: str):
        self.hier, self.rel = hier, rel
        self._peak_fd: int | None = None

    def dirs(self) -> list[Path]:
        return [base / self.rel for base in self.hier.bases.values()]

    def _file(self, controller: str, name: str) -> Path:
        base = self.hier.bases["" if self.hier.version == 2 else controller]
        return base / self.rel / name

    def create(self) -> None:
        for d in self.dirs():
            d.mkdir()

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a pid is written into to join (one per hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs()]

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this cgroup (root only)."""
        for f in self.procs_files():
            Path(f).write_text(str(pid))

    def set_limits(self, *, pids: int | None = None, memory_bytes: int | None = None) -> None:
        """``pids.max`` and a hard memory limit (``memory.max`` / ``memory.limit_in_bytes``)."""
        if pids is not None:
            self._file("pids", "pids.max").write_text(str(int(pids)))
        if memory_bytes is not None:
            name = "memory.max" if self.hier.version == 2 else "memory.limit_in_bytes"
            self._file("memory", name).write_text(str(int(memory_bytes)))

    # figures
    def memory_bytes(self) -> int | None:
        """Memory charged now (anonymous, shmem and tmpfs, page cache), bytes."""
        return _read_int(self._file("memory", "memory.current" if self.hier.version == 2 else "memory.usage_in_bytes"))

    def reset_peak(self) -> None:
        """Start a new peak at the current value (v1: write 0 to ``memory.max_usage_in_bytes``; v2:
        write to ``memory.peak``, which resets what this file descriptor reads, kernel 6.12+)."""
        if self.hier.version == 1:
            with contextlib.suppress(OSError):
                self._file("memory", "memory.max_usage_in_bytes").write_text("0")
            return
        self.close()
        with contextlib.suppress(OSError):
            self._peak_fd = os.open(self._file("memory", "memory.peak"), os.O_RDWR)
            os.write(self._peak_fd, b"reset\n")

    def peak_bytes(self) -> int | None:
        """The highest ``memory_bytes`` since :meth:`reset_peak`."""
        if self.hier.version == 1:
            return _read_int(self._file("memory", "memory.max_usage_in_bytes"))
        if self._peak_fd is not None:
            with contextlib.suppress(OSError, ValueError):
                return int(os.pread(self._peak_fd, 64, 0).split()[0])
        return _read_int(self._file("memory", "memory.peak"))

    def held_bytes(self) -> int | None:
        """Anonymous plus shmem bytes (tmpfs files and System V / POSIX shared memory
        included), without the page cache: the memory the processes made."""
        st = _stat(self._file("memory", "memory.stat"))
        if self.hier.version == 2:
            keys = ("anon", "shmem")
        else:
            keys = ("total_rss", "total_shmem")
        return sum(st[k] for k in keys) if all(k in st for k in keys) else None

    def shmem_bytes(self) -> int | None:
        st = _stat(self._file("memory", "memory.stat"))
        return st.get("shmem" if self.hier.version == 2 else "total_shmem")

    def cpu_seconds(self) -> float | None:
        """CPU seconds of every process that ran in it, exited ones included."""
        if self.hier.version == 2:
            us = _stat(self._file("cpu", "cpu.stat")).get("usage_usec")
            return None if us is None else us / 1e6
        ns = _read_int(self._file("cpuacct", "cpuacct.usage"))
        return None if ns is None else ns / 1e9

    def pids(self) -> list[int]:
        """Every process in this cgroup and the ones below it."""
        out: set[int] = set()
        for d in self.dirs():
            for procs in d.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    out.update(int(x) for x in procs.read_text().split())
        return sorted(out)

    # end of life
    def kill(self, timeout_s: float = 10.0) -> list[int]:
        """SIGKILL every process in it (and below), until none is left or ``timeout_s`` passed;
        returns the pids still there (none, normally)."""
        if self.hier.version == 2:
            with contextlib.suppress(OSError):
                self._file("", "cgroup.kill").write_text("1")
        end = time.monotonic() + timeout_s
        while True:
            left = self.pids()
            if not left or time.monotonic() > end:
                return left
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def close(self) -> None:
        if self._peak_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._peak_fd)
            self._peak_fd = None

    def remove(self, timeout_s: float = 10.0) -> bool:
        """Kill what is left, then remove the cgroup and its children (deepest first)."""
        self.close()
        self.kill(timeout_s)
        ok = True
        for d in self.dirs():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [d]:
                end = time.monotonic() + timeout_s
                while True:
                    try:
                        sub.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError as e:
                        if e.errno != errno.EBUSY or time.monotonic() > end:
                            ok = False
                            break
                        time.sleep(0.02)
        return ok


class WorkerGroups:
    """The cgroups of one worker: ``worker`` (the parent: totals and limits), ``launcher`` and
    one per server."""

    def __init__(self, hier: Hierarchy, servers: int):
        name = f"labs-{os.getpid()}-{next(_SEQ)}"
        self.worker = Group(hier, name)
        self.launcher = Group(hier, f"{name}/launcher")
        self.servers = [Group(hier, f"{name}/s{i}") for i in range(servers)]

    @classmethod
    def make(cls, servers: int, *, pids: int, memory_bytes: int | None) -> "WorkerGroups | None":
        """The cgroups of a new worker, or None where no hierarchy can be written."""
        hier = hierarchy()
        if hier is None:
            return None
        groups = cls(hier, servers)
        try:
            groups.worker.create()
            if hier.version == 2:  # its children get the controllers (it holds no process itself)
                (hier.bases[""] / groups.worker.rel / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            groups.worker.set_limits(pids=pids, memory_bytes=memory_bytes)
            for g in [groups.launcher, *groups.servers]:
                g.create()
        except OSError:
            groups.remove()
            return None
        return groups

    def join_prefix(self) -> list[str]:
        """A command prefix that puts itself into the launcher's cgroup, then execs the rest:
        the launcher is inside before it runs a line of its own."""
        files = self.launcher.procs_files()
        script = 'n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"'
        return ["/bin/sh", "-c", script, "labs-cgroup", str(len(files)), *files]

    def remove(self) -> bool:
        for g in self.servers:
            g.close()
        return self.worker.remove()
