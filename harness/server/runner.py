"""The embedded runners: a dispatcher per GPU or CPU slot on the server's machine, and what
a runner host grades on.

``Dispatcher`` is one embedded runner (``labs serve --runner local``): a process per
GPU (``CUDA_VISIBLE_DEVICES``) or CPU slot that claims the oldest job from the database
itself (``DatabaseJobs``) and works it with the runners' one job loop (``jobs.work``:
grade under a renewed lease, then complete or fail), as Celery workers
(``harness.server.pool``) do through the server's runner API. ``doctor`` says what a
host grades on (recorded into every result); ``slots`` reads ``--gpus``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import torch

from .. import forkserver, manifest
from ..manifest import Course
from . import db, jobs, service, trialrun, trials


def _smi(*fields: str) -> list[str] | None:
    """One GPU's ``nvidia-smi --query-gpu`` fields (the first visible GPU), None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    line = out.stdout.strip().splitlines()[:1]
    return [x.strip() for x in line[0].split(",")] if out.returncode == 0 and line else None


def doctor(course: Course | None = None) -> dict:
    """What this runner host grades on, recorded into every result: GPU model, driver,
    CUDA, clocks (locked or not), persistence and compute mode, MIG, and whether the
    course's grading image is present. On a host without a GPU ``gpu_model`` is "cpu"
    and ``gpu`` says "no GPU"."""
    info = {"host": socket.gethostname(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cpus": os.cpu_count(), "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if not torch.cuda.is_available():
        info.update(gpu="no GPU (torch.cuda.is_available() is False)", gpu_model="cpu")
    else:
        info.update(gpu_model=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                    capability=".".join(map(str, torch.cuda.get_device_capability(0))))
        smi = _smi("driver_version", "persistence_mode", "compute_mode", "mig.mode.current", "clocks.sm",
                   "clocks.max.sm", "clocks.applications.graphics", "clocks_event_reasons.active")
        if smi:
            keys = ("driver", "persistence_mode", "compute_mode", "mig_mode", "sm_clock", "sm_clock_max",
                    "application_clock", "clock_event_reasons")
            info.update(dict(zip(keys, smi)))
            info["clocks_locked"] = smi[6] == smi[5]
    if course is not None:
        info["image"] = _image_state(course.images.gpu if info["gpu_model"] != "cpu" else course.images.cpu)
    return info


def _image_state(tag: str) -> str:
    try:
        import docker
        client = docker.from_env(timeout=5)
        client.images.get(tag)
        return f"{tag}: present"
    except Exception as e:  # noqa: BLE001 - a diagnosis, never an error
        return f"{tag}: not available ({type(e).__name__})"


class DatabaseJobs:
    """An embedded dispatcher's jobs: the course database itself (``service``), each call
    in a session of its own."""

    def __init__(self, sessions, course: Course, owner: str, lease_s: float):
        self.sessions, self.course, self.owner, self.lease_s = sessions, course, owner, lease_s

    def claim(self) -> jobs.Claimed | None:
        """The oldest queued job, under a lease (expired leases reaped first); None when
        the queue is empty."""
        with self.sessions() as s:
            service.reap(s, service.clock())
            job = service.claim(s, self.owner, service.clock(), lease_s=self.lease_s)
            return None if job is None else jobs.Claimed(job.id, job.submission.lab, job.submission.blob)

    def renew(self, job_id: int) -> bool:
        with self.sessions() as s:
            return service.renew(s, job_id, self.owner, service.clock(), self.lease_s)

    def complete(self, job_id: int, outcome: service.Outcome) -> bool:
        with self.sessions() as s:
            return service.complete(s, job_id, self.owner, outcome, service.clock(), self.course)

    def fail(self, job_id: int, reason: str) -> str:
        with self.sessions() as s:
            return service.fail(s, job_id, self.owner, reason, service.clock())


class Dispatcher:
    """One embedded runner slot: claim, grade, store, repeat, until ``stop`` is set."""

    def __init__(self, url: str, course: Course, owner: str, *, lease_s: float = service.LEASE_S,
                 poll_s: float = 0.5, sandbox: str | None = None):
        self.jobs = DatabaseJobs(db.sessions(url, course), course, owner, lease_s)
        self.course, self.owner, self.poll_s, self.sandbox = course, owner, poll_s, sandbox
        self.host = doctor(course)
        self.stop = threading.Event()

    def once(self) -> bool:
        """Grade one job if there is one, else run one trial (``trials``: only when no
        job waits); False when both queues were empty."""
        job = self.jobs.claim()
        if job is None:
            return self.trial()
        jobs.work(self.jobs, job, self.course, self.host, sandbox=self.sandbox)
        return True

    def trial(self) -> bool:
        """Run the oldest queued trial (visible and perf tests only); False when there is none."""
        with self.jobs.sessions() as s:
            got = trials.claim(s, self.owner, service.clock())
            if got is None:
                return False
            trial_id, lab, blob = got.id, got.lab, got.blob
        try:
            result, error = trialrun.run(self.course, lab, blob, self.host), ""
        except Exception as e:  # noqa: BLE001 - the trial fails (it does not count against the quota)
            result, error = None, f"{type(e).__name__}: {e}"
        with self.jobs.sessions() as s:
            trials.finish(s, trial_id, result, error, service.clock())
        return True

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                busy = self.once()
            except Exception as e:  # noqa: BLE001 - a database hiccup must not end the slot: try again
                print(f"labs: dispatcher {self.owner}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                busy = False
            if not busy:
                self.stop.wait(self.poll_s)


def slots(spec: str) -> list[tuple[str, dict]]:
    """``--gpus 0,1`` -> one slot per GPU (``CUDA_VISIBLE_DEVICES=i``); ``cpu:2`` -> two
    CPU slots (no GPU visible). Raises ValueError naming the spec."""
    spec = spec.strip()
    if spec.startswith("cpu:"):
        n = spec[4:]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"--gpus {spec!r}: cpu:N needs N >= 1")
        return [(f"cpu{i}", {"CUDA_VISIBLE_DEVICES": ""}) for i in range(int(n))]
    ids = [x.strip() for x in spec.split(",") if x.strip()]
    if not ids or not all(x.isdigit() for x in ids):
        raise ValueError(f"--gpus {spec!r}: give GPU indices (0,1) or cpu:N")
    return [(f"gpu{i}", {"CUDA_VISIBLE_DEVICES": i}) for i in ids]


def check_gpus(spec: str) -> list[tuple[str, dict]]:
    """``slots(spec)``, after checking that every GPU it names is on this host: a server
    or runner never grades on a device it does not have. Raises ValueError naming the
    device and what ``torch.cuda.device_count()`` says."""
    got = slots(spec)
    have = torch.cuda.device_count()
    missing = [env["CUDA_VISIBLE_DEVICES"] for _, env in got
               if env["CUDA_VISIBLE_DEVICES"] and int(env["CUDA_VISIBLE_DEVICES"]) >= have]
    if missing:
        raise ValueError(f"--gpus {spec}: no GPU {', '.join(missing)} on this host "
                         f"(torch.cuda.device_count() is {have}); --gpus cpu:N grades without a GPU")
    return got


def start_dispatchers(url: str, course_root: Path, spec: str, *, lease_s: float = service.LEASE_S,
                      sandbox: str | None = None) -> list[subprocess.Popen]:
    """Start one dispatcher process per slot of ``spec`` (see ``slots``)."""
    procs = []
    for name, env in check_gpus(spec):
        cmd = [os.sys.executable, "-m", "harness.server.runner", "--db", url, "--course", str(course_root),
               "--owner", f"{socket.gethostname()}-{os.getpid()}-{name}", "--lease", str(lease_s)]
        if sandbox:
            cmd += ["--sandbox", sandbox]
        # PR_SET_PDEATHSIG between fork and exec: the dispatcher dies with the thread starting it (call this
        # from the server's main thread), even before its main() runs
        procs.append(subprocess.Popen(cmd, env={**os.environ, **env}, preexec_fn=forkserver.die_with_parent))
    return procs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.server.runner", description="one embedded runner slot")
    p.add_argument("--db", required=True)
    p.add_argument("--course", required=True)
    p.add_argument("--owner", required=True)
    p.add_argument("--lease", type=float, default=service.LEASE_S)
    p.add_argument("--sandbox", default=None)
    a = p.parse_args(argv)
    forkserver.die_with_parent()  # a killed `labs serve` leaves no dispatcher grading on (start_dispatchers
    # also sets it between fork and exec, so a server killed while this one still imports leaves none either)
    d = Dispatcher(a.db, manifest.load(a.course), a.owner, lease_s=a.lease, sandbox=a.sandbox)
    signal.signal(signal.SIGTERM, lambda *_: d.stop.set())
    signal.signal(signal.SIGINT, lambda *_: d.stop.set())  # Ctrl-C reaches the server's group: finish the job
    d.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
