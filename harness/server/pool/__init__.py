"""The runner pool: Celery workers on GPU hosts grading the course server's jobs
(``labs serve --runner pool`` publishes, ``labs runner`` consumes).

The broker (Redis) carries **only job ids**: what a job is, who holds it and until when,
and its result are rows of the server's database, read and written through the
server's runner API (``/api/runner/jobs/{id}/claim|renew|complete|fail``) with the
host's runner token. A lost or repeated message therefore loses or doubles nothing:

* **Queues per GPU model**: ``interactive.<gpu_model>``, ``regrade.<gpu_model>`` and
  ``trial.<gpu_model>`` (``queue_names``). A worker consumes all three, interactive first: Redis' transport polls
  its queues with one ``BRPOP`` over the keys in the order the cycle gives, and the
  ``sorted`` ``queue_order_strategy`` gives them sorted by name (``interactive.*`` <
  ``regrade.*`` < ``trial.*``), every time, instead of the default round robin. So a worker takes a
  regrade only when no interactive job is waiting, and a trial only when neither waits; with ``prefetch_multiplier=1`` and
  late acks it holds no second message while it grades, so a regrade never sits in
  front of a submission in a worker's buffer either.
* **Trial runs** (``labs submit NN --trial``) go through the same broker: ``trial(id)``
  (``TRIAL_TASK``, a trial id on ``trial.<gpu_model>``) claims the trial from the server
  (``/api/runner/trials/{id}/claim``), runs its visible and perf tests (``trialrun``) and
  sends what ran (``.../finish``). The server hands a trial out only while no graded job
  is queued (409 with ``Retry-After`` otherwise): the task then waits that long and asks
  again, for as long as graded work is queued, so trials come after every graded
  submission. A trial is never a submission: nothing that counts reads it.
* **Acks**: ``task_acks_late`` (the message is acknowledged after the task returns)
  and ``task_reject_on_worker_lost`` (a pool child killed mid-task puts its message
  back), one task at a time per worker process (``concurrency 1``, one process per GPU
  or CPU slot, ``CUDA_VISIBLE_DEVICES=i``).
* **Time limits**: from the course's longest ``limits.timeout_s`` (``limits``): the soft
  limit is that plus ``MARGIN_S`` (the grader run has its own limit and stops first; the
  soft limit only catches a hung harness, an infrastructure failure), the hard limit
  ``MARGIN_S`` later, and Redis' ``visibility_timeout`` (after which an unacknowledged
  message is delivered again) twice the hard limit, so a message is never redelivered
  while its first delivery may still be running or waiting for a retry countdown.
* **Leases, not the broker, recover a killed worker**: a claimed job is leased; the
  task works it with the runners' one job loop (``jobs.work``, through ``ApiJobs``: a
  ``Heartbeat`` renews the lease while it grades, then complete or fail). A SIGKILLed
  worker stops renewing; the server's reaper puts the job back in the queue and publishes its id
  again; its unacknowledged message comes back only after the visibility timeout and
  finds the job done (a quiet duplicate).
* **Retries**: an infrastructure failure (``InfraFailure``, the soft time limit,
  a harness bug) is POSTed as ``fail`` (the server re-queues the job, or marks it
  failed after ``service.MAX_ATTEMPTS``) and retried with exponential backoff, at most
  ``INFRA_RETRIES`` (2) times. A student's timeout, crash or wrong answer is a result:
  completed, final, never retried. A 409 on claim without ``Retry-After`` (the job is
  done, cancelled or failed: a duplicate delivery) returns quietly; with
  ``Retry-After`` (held by a live lease) the task retries after that many seconds, at
  most ``HELD_RETRIES`` times (the reaper re-publishes a job whose holder dies). A
  server that does not answer (a restart) is waited for, then retried later (the
  server re-publishes every queued job when it starts). Retries of one message are
  counted together (Celery's ``request.retries``): each kind retries only while fewer
  than its own cap were made.

Configuration of a worker: ``python -m harness.server.pool --broker URL --server URL
--course ROOT --gpu-model NAME --slot NAME [--lease S] [--sandbox S]`` with the runner
token in ``LABS_RUNNER_TOKEN`` (never on a command line); ``start_workers`` starts one
per slot. ``celery -A harness.server.pool worker`` works too, configured by the same
names as environment variables (``LABS_BROKER``, ``LABS_SERVER``, ``LABS_COURSE``,
``LABS_GPU_MODEL``, ``LABS_LEASE``, ``LABS_SANDBOX``, ``LABS_RUNNER_TOKEN``).
"""
from __future__ import annotations

import argparse
import base64
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import httpx
from celery import Celery, signals
from celery.exceptions import SoftTimeLimitExceeded
from kombu import Exchange, Queue

from ... import forkserver, grading, manifest
from ...errors import LabsError
from ...manifest import Course
from .. import jobs, runner, service, trialrun
from ..db import QUEUES

TASK = "labs.grade"
TRIAL_TASK = "labs.trial"
TRIAL_QUEUE = "trial"     # after interactive.* and regrade.* in the sorted queue order
MARGIN_S = 120.0          # soft limit = the course's longest grader limit + this; hard = soft + this
DEFAULT_TIMEOUT_S = 1200.0  # labs.yaml's default limits.timeout_s, when no course is at hand (the publisher)
INFRA_RETRIES = 2         # infrastructure retries of one delivery (the server allows MAX_ATTEMPTS in all)
HELD_RETRIES = 3          # waits for another runner's live lease before giving the job to the reaper
UNREACHABLE_RETRIES = 10  # later tries of a claim while the server does not answer
BACKOFF_S = float(os.environ.get("LABS_POOL_BACKOFF_S", "10"))  # infra retry n waits BACKOFF_S * 2**n
PATIENCE_S = 60.0         # how long one call waits for an unreachable server (a restart) before giving up
HTTP_TIMEOUT_S = 30.0

log = logging.getLogger("labs.pool")


def queue_names(gpu_model: str) -> list[str]:
    """The queues of a GPU model, in the order a worker takes from them."""
    return [f"{q}.{gpu_model}" for q in (*QUEUES, TRIAL_QUEUE)]  # interactive.<m>, regrade.<m>, trial.<m>


def limits(timeout_s: float) -> dict[str, float]:
    """Soft and hard task time limits and the broker's visibility timeout for a grader
    limit of ``timeout_s``, all derived from it (see the module doc)."""
    soft = float(timeout_s) + MARGIN_S
    hard = soft + MARGIN_S
    return {"soft_time_limit": soft, "time_limit": hard, "visibility_timeout": 2 * hard}


def course_timeout_s(course: Course) -> float:
    """The longest grader limit of the course's labs."""
    return float(max((lab.limits.timeout_s for lab in course.labs.values()), default=DEFAULT_TIMEOUT_S))


def configure(app: Celery, broker_url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
              gpu_model: str | None = None) -> Celery:
    """Apply the pool's settings to ``app`` (the worker's and the publisher's alike)."""
    lim = limits(timeout_s)
    conf = dict(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": lim["visibility_timeout"],
                                  "queue_order_strategy": "sorted"},  # interactive.* before regrade.*
        task_serializer="json", accept_content=["json"], result_serializer="json",
        task_ignore_result=True, result_backend=None,
        task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1, worker_concurrency=1,
        task_soft_time_limit=lim["soft_time_limit"], task_time_limit=lim["time_limit"],
        worker_hijack_root_logger=False,
        task_create_missing_queues=True,
    )
    if gpu_model is not None:
        conf["task_queues"] = [Queue(n, Exchange(n, type="direct"), routing_key=n) for n in queue_names(gpu_model)]
    app.conf.update(conf)
    return app


# --- the publisher (labs serve --runner pool) ---------------------------------------------

def publisher(broker_url: str, gpu_model: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Callable[[int, str], None]:
    """``publish(job_id, queue)`` for ``create_app``: sends ``grade(job_id)`` to
    ``<queue>.<gpu_model>``; ``publish(trial_id, "trial")`` sends ``trial(trial_id)`` to
    ``trial.<gpu_model>``. Declares the queues first, so a message published before
    any worker started is kept, not dropped; raises LabsError when the broker does
    not answer."""
    if not gpu_model or any(c.isspace() for c in gpu_model):
        raise LabsError(f"--gpu-model {gpu_model!r}: give a name without spaces (it names the queues)",
                        hint="e.g. --gpu-model h100; the runners use the same --gpu-model")
    app = configure(Celery("labs-publisher", set_as_current=False), broker_url, timeout_s, gpu_model)
    queues = {q.name: q for q in app.conf.task_queues}
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=2, timeout=5)
            for q in queues.values():
                q.bind(conn.default_channel).declare()
    except Exception as e:  # noqa: BLE001 - kombu raises the transport's own errors
        raise LabsError(f"cannot reach the broker {broker_url}: {type(e).__name__}: {e}",
                        hint="start Redis (redis-server) or pass the right --broker redis://HOST:PORT/0") from None

    def publish(job_id: int | str, queue: str) -> None:
        name = f"{queue}.{gpu_model}"
        if name not in queues:
            raise ValueError(f"no queue {queue!r} (queues: {', '.join((*QUEUES, TRIAL_QUEUE))})")
        task, arg = (TRIAL_TASK, str(job_id)) if queue == TRIAL_QUEUE else (TASK, int(job_id))
        app.send_task(task, args=[arg], queue=queues[name], routing_key=name,
                      retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5})

    publish.app = app  # for tests and shutdown
    return publish


# --- the worker ------------------------------------------------------------------------------

app = Celery("labs-pool", set_as_current=False)
configure(app, os.environ.get("LABS_BROKER", "redis://127.0.0.1:6379/0"),
          float(os.environ.get("LABS_TIMEOUT_S", DEFAULT_TIMEOUT_S)), os.environ.get("LABS_GPU_MODEL") or None)

SETTINGS: dict = {}  # set by main() in the worker's main process, inherited by its pool child


def _settings() -> dict:
    """The worker's configuration: what main() set, else the environment (celery -A)."""
    if not SETTINGS.get("server"):
        SETTINGS.update(server=os.environ.get("LABS_SERVER", ""), token=os.environ.get("LABS_RUNNER_TOKEN", ""),
                        course=os.environ.get("LABS_COURSE", "."), lease_s=float(os.environ.get("LABS_LEASE",
                                                                                               service.LEASE_S)),
                        sandbox=os.environ.get("LABS_SANDBOX") or None)
    return SETTINGS


class _Host:
    """Per pool process: the course, the doctor info, an HTTP client (made after the fork)."""

    course: Course | None = None
    info: dict | None = None
    client: httpx.Client | None = None
    pid: int | None = None

    @classmethod
    def get(cls) -> type["_Host"]:
        cfg = _settings()
        if cls.pid != os.getpid():
            if not cfg["server"] or not cfg["token"]:
                raise LabsError("the pool worker has no server or runner token (LABS_SERVER, LABS_RUNNER_TOKEN)")
            cls.course = manifest.load(cfg["course"])
            cls.info = runner.doctor(cls.course)
            cls.client = httpx.Client(base_url=cfg["server"].rstrip("/"), timeout=HTTP_TIMEOUT_S,
                                      headers={"Authorization": f"Bearer {cfg['token']}"})
            cls.pid = os.getpid()
        return cls


def _call(method: str, path: str, *, patience_s: float = PATIENCE_S, **kw) -> httpx.Response | None:
    """One runner-API request; waits out a server that does not answer or answers 5xx
    (a restart) for ``patience_s``, then returns None."""
    host = _Host.get()
    deadline, wait = time.monotonic() + patience_s, 0.5
    while True:
        try:
            r = host.client.request(method, path, **kw)
            if r.status_code < 500:
                return r
            why = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            why = f"{type(e).__name__}: {e}"
        if time.monotonic() + wait > deadline:
            log.warning("labs: %s %s: the server did not answer (%s)", method, path, why)
            return None
        time.sleep(wait)
        wait = min(wait * 2, 5.0)


def _refused(r: httpx.Response) -> LabsError:
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text[:300]
    return LabsError(f"the server refused {r.request.method} {r.request.url.path}: {r.status_code} {detail}",
                     hint="check the runner token (labs account add NAME --role runner)")


@signals.worker_process_init.connect
def _pool_child_init(**_kw):
    """A pool child dies with its worker (a SIGKILLed worker leaves no grading child)."""
    forkserver.die_with_parent()


def _unreachable(task, retries: int, what: str, max_retries: int | None) -> str:
    """The server did not answer a claim: retry with backoff (2, 4, 8 ... up to 30 s) for
    ``UNREACHABLE_RETRIES`` tries, then give it up to the server's republish at its start."""
    if retries < UNREACHABLE_RETRIES:
        raise task.retry(countdown=min(30.0, 2.0 * 2 ** retries), max_retries=max_retries)
    return f"{what}: server unreachable; left to the server's republish at its start"


@app.task(name=TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
          max_retries=INFRA_RETRIES)
def grade(self, job_id: int) -> str:
    """Claim job ``job_id`` from the server, grade it, send the result (see the module
    doc for what is retried). Returns what happened, for the worker's log."""
    job_id = int(job_id)
    cfg, host = _settings(), _Host.get()
    lease_s = float(cfg["lease_s"])
    retries = self.request.retries or 0
    r = _call("POST", f"/api/runner/jobs/{job_id}/claim", params={"lease_s": lease_s})
    if r is None:
        return _unreachable(self, retries, f"job {job_id}", max_retries=UNREACHABLE_RETRIES)
    if r.status_code == 409:
        wait = r.headers.get("retry-after")
        if wait is None:
            log.info("labs: job %s: %s (a duplicate delivery)", job_id, r.json().get("detail"))
            return f"job {job_id}: not queued"
        if retries >= HELD_RETRIES:
            return f"job {job_id}: still held by another lease; the reaper re-queues it if its holder dies"
        raise self.retry(countdown=max(1.0, float(wait)), max_retries=HELD_RETRIES)
    if r.status_code != 200:
        raise _refused(r)
    job = r.json()
    log.info("labs: job %s claimed (lab %s, %s), lease %.0f s", job_id, job["lab"], job["student"], lease_s)
    claimed = jobs.Claimed(job_id, job["lab"], base64.b64decode(job["blob"]), job.get("timeout_s"))
    done = jobs.work(ApiJobs(host.client, lease_s), claimed, host.course, host.info, sandbox=cfg.get("sandbox"),
                     describe=_describe)
    if done.lease_lost:
        log.warning("labs: job %s: the lease was lost while grading (reaped); the result was sent anyway", job_id)
    if done.graded is None:
        log.warning("labs: job %s: infrastructure failure (%s); the job is %s", job_id, done.failure, done.state)
        if done.state == "queued" and retries < INFRA_RETRIES:
            raise self.retry(countdown=BACKOFF_S * 2 ** retries, max_retries=INFRA_RETRIES)
        return f"job {job_id}: infrastructure failure, job {done.state}"
    if done.stored is None:
        return f"job {job_id}: graded, but the server did not take the result; the reaper re-queues it"
    graded = done.graded
    log.info("labs: job %s: %s (%s, %.1f s)%s", job_id, graded.kind.value, graded.status, graded.duration_s,
             "" if done.stored else "; a result was already stored (dropped)")
    return f"job {job_id}: {'stored' if done.stored else 'duplicate result dropped'}"


@app.task(name=TRIAL_TASK, bind=True, shared=False, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
          max_retries=None)
def trial(self, trial_id: str) -> str:
    """Claim trial ``trial_id`` from the server, run its visible and perf tests, send what
    ran (or why it could not run: the trial fails and does not count against the quota).
    While graded jobs are queued the server answers 409 with ``Retry-After``: the task
    waits that long and asks again, as long as it takes. Returns what happened."""
    host, retries = _Host.get(), self.request.retries or 0
    r = _call("POST", f"/api/runner/trials/{trial_id}/claim")
    if r is None:
        return _unreachable(self, retries, f"trial {trial_id}", max_retries=None)  # its 409 waits are unbounded
    if r.status_code == 409:
        wait = r.headers.get("retry-after")
        if wait is None:
            return f"trial {trial_id}: not queued"
        raise self.retry(countdown=max(1.0, float(wait)), max_retries=None)  # graded work first
    if r.status_code != 200:
        raise _refused(r)
    got = r.json()
    log.info("labs: trial %s claimed (lab %s, %s)", trial_id, got["lab"], got["student"])
    try:
        result, error = trialrun.run(host.course, got["lab"], base64.b64decode(got["blob"]), host.info), ""
    except Exception as e:  # noqa: BLE001 - the trial fails; it does not count against the quota
        result, error = None, _describe(e)
    done = _call("POST", f"/api/runner/trials/{trial_id}/finish", json={"result": result, "error": error},
                 patience_s=2 * PATIENCE_S)
    if done is None or done.status_code != 200:
        return f"trial {trial_id}: ran, but the server did not take what ran"
    return f"trial {trial_id}: {'done' if result is not None else 'failed: ' + error}"


class ApiJobs:
    """A pool worker's jobs: the server's runner API (``/api/runner/jobs/{id}/renew|complete|fail``)
    with the host's runner token; a server that does not answer is waited for (``_call``)."""

    def __init__(self, client: httpx.Client, lease_s: float):
        self.client, self.lease_s = client, lease_s

    def renew(self, job_id: int) -> bool:
        got = self.client.post(f"/api/runner/jobs/{job_id}/renew", params={"lease_s": self.lease_s}, timeout=10)
        got.raise_for_status()
        return bool(got.json().get("held"))

    def complete(self, job_id: int, outcome: service.Outcome) -> bool | None:
        """True stored, False a duplicate (dropped), None the server did not take it.
        Raises LabsError when the server refuses the runner."""
        got = _call("POST", f"/api/runner/jobs/{job_id}/complete", json=outcome.to_json(), patience_s=2 * PATIENCE_S)
        if got is not None and got.status_code != 200:
            raise _refused(got)
        return None if got is None else bool(got.json().get("stored"))

    def fail(self, job_id: int, reason: str) -> str:
        got = _call("POST", f"/api/runner/jobs/{job_id}/fail", json={"reason": f"{socket.gethostname()}: {reason}"})
        return got.json().get("state") if got is not None and got.status_code == 200 else "unknown"


def _describe(e: Exception) -> str:
    """Why a grading task gave no grade, for ``fail``."""
    if isinstance(e, SoftTimeLimitExceeded):
        return f"the grading task exceeded its soft time limit ({app.conf.task_soft_time_limit:.0f} s)"
    return f"{type(e).__name__}: {e}"


def check_server(server: str, token: str) -> None:
    """Raise LabsError unless ``server`` answers and takes ``token`` as a runner's
    (claims job 0, which never exists: 409 means the token is good)."""
    try:
        r = httpx.post(f"{server.rstrip('/')}/api/runner/jobs/0/claim", params={"lease_s": 1},
                       headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_TIMEOUT_S)
    except httpx.HTTPError as e:
        raise LabsError(f"cannot reach the course server {server}: {type(e).__name__}: {e}",
                        hint="is `labs serve --runner pool` running there? (--server URL)") from None
    if r.status_code in (401, 403):
        raise LabsError(f"the course server {server} refused the runner token ({r.status_code})",
                        hint="staff: `labs account add HOSTNAME --role runner` prints a runner token")
    if r.status_code != 409:
        raise LabsError(f"{server} does not look like a course server (claim answered {r.status_code})",
                        hint="--server is the URL of `labs serve`")


def worker_command(broker: str, server: str, course_root: Path | str, gpu_model: str, slot: str, *,
                   lease_s: float = service.LEASE_S, sandbox: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "harness.server.pool", "--broker", broker, "--server", server,
           "--course", str(course_root), "--gpu-model", gpu_model, "--slot", slot, "--lease", str(lease_s)]
    return cmd + (["--sandbox", sandbox] if sandbox else [])


def start_worker(broker: str, server: str, token: str, slot: tuple[str, dict], gpu_model: str,
                 course_root: Path | str, *, lease_s: float = service.LEASE_S, sandbox: str | None = None,
                 **popen) -> subprocess.Popen:
    """One worker process for ``slot`` (a ``runner.slots`` entry), in its own process
    group (a signal to it reaches its pool child and graders), dying with its parent."""
    name, env = slot
    return subprocess.Popen(worker_command(broker, server, course_root, gpu_model, name, lease_s=lease_s,
                                           sandbox=sandbox),
                            env={**os.environ, **env, "LABS_RUNNER_TOKEN": token}, start_new_session=True,
                            preexec_fn=forkserver.die_with_parent, **popen)


def start_workers(broker: str, server: str, token: str, gpus_spec: str, gpu_model: str,
                  course_root: Path | str, *, lease_s: float = service.LEASE_S, sandbox: str | None = None,
                  **popen) -> list[subprocess.Popen]:
    """One worker process per slot of ``gpus_spec`` (``0,1``: CUDA_VISIBLE_DEVICES=i
    each; ``cpu:N``: N workers, no GPU visible). Raises ValueError for a bad spec."""
    return [start_worker(broker, server, token, slot, gpu_model, course_root, lease_s=lease_s, sandbox=sandbox,
                         **popen)
            for slot in runner.slots(gpus_spec)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.server.pool", description="one Celery worker of the pool")
    p.add_argument("--broker", required=True)
    p.add_argument("--server", required=True)
    p.add_argument("--course", required=True)
    p.add_argument("--gpu-model", required=True)
    p.add_argument("--slot", default="cpu0")
    p.add_argument("--lease", type=float, default=service.LEASE_S)
    p.add_argument("--sandbox", default=None, choices=grading.SANDBOXES)
    p.add_argument("--loglevel", default="INFO")
    a = p.parse_args(argv)
    token = os.environ.get("LABS_RUNNER_TOKEN")
    if not token:
        p.error("the runner token goes in LABS_RUNNER_TOKEN")
    course = manifest.load(a.course)
    configure(app, a.broker, course_timeout_s(course), a.gpu_model)
    SETTINGS.update(server=a.server, token=token, course=str(course.root), lease_s=a.lease, sandbox=a.sandbox)
    logging.basicConfig(level=a.loglevel, format="%(asctime)s %(levelname)s %(processName)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per renewal otherwise
    app.worker_main(["worker", "-Q", ",".join(queue_names(a.gpu_model)), "--concurrency", "1",
                     "--prefetch-multiplier", "1", "--pool", "prefork", "--loglevel", a.loglevel,
                     "--hostname", f"labs-{a.slot}-{os.getpid()}@{socket.gethostname()}",
                     "--without-gossip", "--without-mingle", "--without-heartbeat"])
    return 0

