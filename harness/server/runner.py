"""Grading one job of the course server, and the embedded dispatchers.

A job is graded by exactly the pipeline of ``labs grade-all`` (``grading.grade_one``:
staging, hidden graders in the sandbox, scores) on the module the server validated and
stored at intake; the runner never imports or runs a submission itself. ``grade_job``
returns the typed record (``records.Graded``), or raises ``InfraFailure`` when the
infrastructure failed (the job is retried, never scored 0).

``Dispatcher`` is one embedded runner (``labs serve --runner local``): a process per
GPU (``CUDA_VISIBLE_DEVICES``) or CPU slot that claims jobs from the database under a
lease, renews it while it grades, and stores the result. Celery workers
(``harness.server.pool``) call the same ``grade_job`` through the server's runner API.
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
from typing import Callable

import torch

from .. import grading, manifest
from ..errors import InfraFailure
from ..manifest import Course, LabPaths
from ..records import Graded
from . import db, service


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


def grade_job(course: Course, lab_number: str, module: bytes, *, sandbox: str | None = None,
              timeout_s: float | None = None) -> Graded:
    """Grade one stored module with grade-all's pipeline (``grading.grade_one``); returns
    its record. Raises InfraFailure for an infrastructure failure (the sandbox could not
    start, the graders crashed): the job is retried, never scored."""
    lab = course.lab(lab_number)
    stored = grading.Module(module, LabPaths.of(lab).in_impl("").as_posix())
    graded = grading.grade_one(stored, lab, course, timeout_s=timeout_s, sandbox=sandbox)
    if graded.retry:
        raise InfraFailure(graded.status)
    return graded


class Heartbeat(threading.Thread):
    """Calls ``renew()`` every ``period_s`` while a job is graded; ``lost`` is set when a
    renewal says the lease is no longer ours (the job was reaped and given to another)."""

    def __init__(self, renew: Callable[[], bool], period_s: float):
        super().__init__(daemon=True, name="labs-lease")
        self.renew, self.period_s = renew, period_s
        self.stopped, self.lost = threading.Event(), threading.Event()

    def run(self):
        while not self.stopped.wait(self.period_s):
            try:
                if not self.renew():
                    self.lost.set()
                    return
            except Exception:  # noqa: BLE001 - a database hiccup: try again next period
                continue

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()


class Dispatcher:
    """One embedded runner slot: claim, grade, store, repeat, until ``stop`` is set."""

    def __init__(self, url: str, course: Course, owner: str, *, lease_s: float = service.LEASE_S,
                 poll_s: float = 0.5, sandbox: str | None = None):
        self.sessions = db.sessions(url, course)
        self.course, self.owner, self.lease_s, self.poll_s, self.sandbox = course, owner, lease_s, poll_s, sandbox
        self.host = doctor(course)
        self.stop = threading.Event()

    def once(self) -> bool:
        """Grade one job if there is one; False when the queue was empty."""
        with self.sessions() as s:
            service.reap(s, service.clock())
            job = service.claim(s, self.owner, service.clock(), lease_s=self.lease_s)
            if job is None:
                return False
            args = (job.submission.lab, job.submission.blob)
            job_id = job.id

        def renew():
            with self.sessions() as s2:
                return service.renew(s2, job_id, self.owner, service.clock(), self.lease_s)

        with Heartbeat(renew, self.lease_s / 4):
            try:
                outcome = grade_job(self.course, *args, sandbox=self.sandbox)
            except Exception as e:  # noqa: BLE001 - InfraFailure or a harness bug: never the student's 0
                with self.sessions() as s:
                    service.fail(s, job_id, self.owner, f"{type(e).__name__}: {e}", service.clock())
                return True
        with self.sessions() as s:
            service.complete(s, job_id, self.owner, service.Outcome(outcome, self.host, self.host["gpu_model"]),
                             service.clock(), self.course)
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


def start_dispatchers(url: str, course_root: Path, spec: str, *, lease_s: float = service.LEASE_S,
                      sandbox: str | None = None) -> list[subprocess.Popen]:
    """Start one dispatcher process per slot of ``spec`` (see ``slots``)."""
    procs = []
    for name, env in slots(spec):
        cmd = [os.sys.executable, "-m", "harness.server.runner", "--db", url, "--course", str(course_root),
               "--owner", f"{socket.gethostname()}-{os.getpid()}-{name}", "--lease", str(lease_s)]
        if sandbox:
            cmd += ["--sandbox", sandbox]
        # PR_SET_PDEATHSIG between fork and exec: the dispatcher dies with the thread starting it (call this
        # from the server's main thread), even before its main() runs
        procs.append(subprocess.Popen(cmd, env={**os.environ, **env}, preexec_fn=grading._die_with_parent))
    return procs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.server.runner", description="one embedded runner slot")
    p.add_argument("--db", required=True)
    p.add_argument("--course", required=True)
    p.add_argument("--owner", required=True)
    p.add_argument("--lease", type=float, default=service.LEASE_S)
    p.add_argument("--sandbox", default=None)
    a = p.parse_args(argv)
    grading._die_with_parent()  # a killed `labs serve` leaves no dispatcher grading on (start_dispatchers
    # also sets it between fork and exec, so a server killed while this one still imports leaves none either)
    d = Dispatcher(a.db, manifest.load(a.course), a.owner, lease_s=a.lease, sandbox=a.sandbox)
    signal.signal(signal.SIGTERM, lambda *_: d.stop.set())
    signal.signal(signal.SIGINT, lambda *_: d.stop.set())  # Ctrl-C reaches the server's group: finish the job
    d.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
