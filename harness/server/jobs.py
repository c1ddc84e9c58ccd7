"""One job of the course server, graded the same way wherever it runs: the runners' job loop.

A runner holds a job (``Claimed``: the module the server validated and stored at
intake, and its lab) that it took from a ``Jobs``: the database itself for an
embedded dispatcher (``runner.DatabaseJobs``), the runner API for a pool worker
(``pool.ApiJobs``). ``work`` is the one frame both run: grade the module with
grade-all's pipeline (``grade_job``: ``grading.grade_one``) under a lease a
``Heartbeat`` renews every quarter lease, then ``complete`` the job with its typed
record, or ``fail`` it for an infrastructure failure (the server retries it, and
never scores it). A runner never imports or runs a submission itself.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from .. import grading
from ..errors import InfraFailure
from ..manifest import Course, LabPaths
from ..plugin import GPU_SKIP_REASON
from ..records import NOT_RUN, Graded
from . import service


@dataclass(frozen=True)
class Claimed:
    """A job a runner holds under a lease: what it grades."""
    job_id: int
    lab: str
    module: bytes
    timeout_s: float | None = None  # the lab's grader limit (None: labs.yaml's)


class Jobs(Protocol):
    """The server's side of a runner's jobs: the database, or the runner API."""
    lease_s: float

    def renew(self, job_id: int) -> bool:
        """Extend the lease; False when the job is no longer this runner's."""

    def complete(self, job_id: int, outcome: service.Outcome) -> bool | None:
        """Store the record; False: one was stored before (dropped); None: not taken."""

    def fail(self, job_id: int, reason: str) -> str:
        """An infrastructure failure: the job's new state (``queued``: retried, ``failed``)."""


@dataclass
class Done:
    """What became of a job a runner worked on."""
    graded: Graded | None     # None: an infrastructure failure
    failure: str = ""         # why, then
    state: str = ""           # the job's state after ``fail``
    stored: bool | None = None  # ``complete``'s answer
    lease_lost: bool = False  # reaped while grading (the record is sent anyway: stored only while still ours)


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


def gpu_tests_skipped(graded: Graded) -> int:
    """How many GPU tests of ``graded`` were skipped because no CUDA device was visible at
    all (``plugin.GPU_SKIP_REASON``; a test skipped for another reason, such as needing more
    GPUs than the host has, does not count)."""
    tests = graded.result.tests if graded.result else []
    return sum(t.outcome == NOT_RUN and "gpu" in t.tags and GPU_SKIP_REASON in t.output for t in tests)


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
            except Exception:  # noqa: BLE001 - a database or network hiccup: try again next period
                continue

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {e}"


def work(jobs: Jobs, job: Claimed, course: Course, host: dict, *, sandbox: str | None = None,
         describe: Callable[[Exception], str] = _why) -> Done:
    """Grade ``job`` under a lease ``jobs`` renews, then complete it with its record and
    ``host`` (``runner.doctor``: where it was graded), or fail it with ``describe(e)``
    for whatever kept it from a grade (``InfraFailure``, a harness bug: never the
    student's 0)."""
    with Heartbeat(lambda: jobs.renew(job.job_id), jobs.lease_s / 4) as beat:
        try:
            graded = grade_job(course, job.lab, job.module, sandbox=sandbox, timeout_s=job.timeout_s)
        except Exception as e:  # noqa: BLE001 - see the docstring
            graded, failure = None, describe(e)
    lost = beat.lost.is_set()
    if graded is not None and host.get("gpu_model", "cpu") != "cpu" and gpu_tests_skipped(graded):
        # a GPU runner whose GPU disappeared: an infrastructure failure, never a score without the GPU points
        graded, failure = None, (f"the GPU of {host.get('host', 'this runner')} ({host['gpu_model']}) disappeared: "
                                 f"{gpu_tests_skipped(graded)} GPU test(s) could not run")
    if graded is None:
        return Done(None, failure, state=jobs.fail(job.job_id, failure), lease_lost=lost)
    stored = jobs.complete(job.job_id, service.Outcome(graded, host, host["gpu_model"]))
    return Done(graded, stored=stored, lease_lost=lost)
