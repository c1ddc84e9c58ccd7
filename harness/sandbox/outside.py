"""Figures about the worker read from outside it, where no code in the worker can change them.

The trusted side reads these around a request (``harness.sandbox.calls.run_probe``,
``harness.sandbox.timing.timed``, ``harness.sandbox.ranks.run``): the worker's processes
(``/proc/<pid>/task/*/children``, ``NSpid``), a server's memory (``VmHWM``, ``VmRSS``,
``RssAnon + RssShmem``) and CPU seconds, and the bytes its private network namespace's
loopback carried. A submission sees none of them and cannot write them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def descendants(pid: int) -> list[int]:
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


def ns_pid(pid: int) -> int | None:
    """The innermost pid of ``pid`` (its pid inside the sandbox's pid namespace)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_reset(pid) -> int | None:
    """Reset ``pid``'s peak resident memory to its current value; return that value
    (bytes), or None where /proc cannot be written or read."""
    if not pid:
        return None
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return None
    return status_bytes(pid, "VmHWM")


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


def status_bytes(pid, key: str) -> int | None:
    """``key`` (VmHWM, VmRSS, ...) of /proc/<pid>/status in bytes, None if unreadable."""
    fields = proc_fields(pid, "status", key)
    try:
        return int(fields[0]) * 1024 if fields else None
    except ValueError:
        return None


def anon_shmem_bytes(pid) -> int | None:
    """Anonymous plus shared resident bytes of ``pid`` (RssAnon + RssShmem): the memory it
    made, without the pages of files it maps (libraries), which a fork does not copy."""
    anon, shmem = status_bytes(pid, "RssAnon"), status_bytes(pid, "RssShmem")
    return None if anon is None or shmem is None else anon + shmem


def rss_peak(pid) -> int | None:
    return status_bytes(pid, "VmHWM")


def cpu_seconds(pid) -> float | None:
    """utime + stime of ``pid`` (all its threads) from /proc/<pid>/stat."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def loopback_tx_bytes(pid: int | None) -> int | None:
    """Bytes sent on ``lo`` in the network namespace of ``pid`` (/proc/<pid>/net/dev), or
    None where unreadable. These are IP packet bytes: TCP/IP headers and ACKs add about
    0.2% to the payload on loopback (64 KiB segments), which a bound's slack covers."""
    fields = proc_fields(pid, "net/dev", "lo")
    try:
        return int(fields[8]) if fields else None
    except (ValueError, IndexError):
        return None


def tcp_retransmits(pid: int | None) -> int | None:
    """TCP segments retransmitted in the network namespace of ``pid`` (``RetransSegs`` of
    /proc/<pid>/net/snmp, RFC 4022's tcpRetransSegs), or None where unreadable. On a loaded
    machine the kernel drops loopback segments a busy receiver cannot queue and sends them
    again, so the loopback's byte count then includes them twice."""
    rows = [line.split()[1:] for line in proc_text(pid, "net/snmp").splitlines()
            if line.startswith("Tcp:")]
    try:
        return int(dict(zip(*rows))["RetransSegs"])
    except (ValueError, KeyError, TypeError):
        return None


def subtree(pid: int, launcher: int | None = None, servers=()) -> list[int]:
    """``pid`` and its descendants; with ``launcher`` (which adopts every orphan of the worker)
    also what it adopted, i.e. its children that are none of ``servers``, and theirs: a daemon a
    server started counts for that server (and for every other one: it cannot be told apart)."""
    own = [pid] + descendants(pid)
    if launcher is None:
        return own
    adopted = []
    with contextlib.suppress(OSError, ValueError):
        for tid in os.listdir(f"/proc/{launcher}/task"):
            adopted += [int(k) for k in Path(f"/proc/{launcher}/task/{tid}/children").read_text().split()
                        if int(k) not in servers]
    return own + [p for k in adopted for p in [k] + descendants(k) if p not in own]


def _sum(pids, fn) -> int | None:
    vals = [fn(p) for p in pids]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


class AllServers:
    """The CPU seconds of every server of a worker together (its ranks: one waiting in a
    collective while a peer computes is progress, not a hang)."""

    def __init__(self, figures: list):
        self.figures = list(figures)

    def cpu(self) -> float | None:
        vals = [f.cpu() for f in self.figures]
        return None if not vals or any(v is None for v in vals) else sum(vals)


class Figures:
    """What the trusted side reads about one server from outside: its memory now, at its peak
    during a request and held (anonymous + shmem, tmpfs included), its CPU seconds. From the
    server's cgroup where the worker has them (every process it started, exited ones' CPU
    included, every page charged to it: ``harness.sandbox.cgroups``); else from ``/proc`` of
    every process of its subtree (:func:`subtree`), summed. ``start_held``: its held memory when
    it started, before the submission was imported (so a buffer made at import counts later)."""

    def __init__(self, pid: int, group=None, launcher: int | None = None, servers=()):
        self.pid, self.group, self.launcher, self.servers = pid, group, launcher, set(servers)
        self.start_held = self.held()

    def _pids(self) -> list[int]:
        return subtree(self.pid, self.launcher, self.servers)

    def memory(self) -> int | None:
        if self.group is not None:
            return self.group.memory_bytes()
        return _sum(self._pids(), lambda p: status_bytes(p, "VmRSS"))

    def held(self) -> int | None:
        if self.group is not None:
            return self.group.held_bytes()
        return _sum(self._pids(), anon_shmem_bytes)

    def cpu(self) -> float | None:
        if self.group is not None:
            return self.group.cpu_seconds()
        return _sum(self._pids(), cpu_seconds)

    def begin(self) -> dict:
        """Before a request: the peak starts afresh; ``memory``, ``held``, ``cpu`` now."""
        if self.group is not None:
            self.group.reset_peak()
        else:
            for p in self._pids():
                rss_reset(p)
        return {"memory": self.memory(), "held": self.held(), "cpu": self.cpu()}

    def end(self, begun: dict) -> dict:
        """After it: ``peak`` memory during it and its ``cpu_s``."""
        peak = self.group.peak_bytes() if self.group is not None else _sum(self._pids(), rss_peak)
        cpu = self.cpu()
        return {"peak": peak if begun["memory"] is not None else None,
                "cpu_s": None if cpu is None or begun["cpu"] is None else cpu - begun["cpu"]}
