"""End-to-end scenarios of the course server with real services and real failures.

Each scenario runs ``labs serve`` as a subprocess over a SQLite file, 10 students
submit 5 labs each (50 submissions through the HTTP API), the toy grader grades them
with grade-all's pipeline, and in the middle of it a runner is SIGKILLed while it
holds a job and the server itself is SIGKILLed and started again on the same database
and port. In the end every submission has exactly one result (counted in the
database): none lost, none duplicated.

* **pool**: ``labs serve --runner pool`` publishing job ids to a real Redis (started
  here on a free loopback port), ``labs runner --gpus cpu:2`` with two Celery workers;
  one worker's whole process group is SIGKILLed mid-job (``labs runner`` starts it
  again).
* **local**: ``labs serve --runner local --gpus cpu:2``, one dispatcher SIGKILLed
  mid-job; the server's SIGKILL takes its dispatchers with it (PR_SET_PDEATHSIG).

Wall time and submissions per hour of each are printed and written to
``figures-<scenario>.json`` under the test's tmp_path. On a failure the server's and
the runners' logs are printed. Without ``redis-server`` the pool scenario skips,
under CI it fails.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import func, select

from harness import grading, manifest
from harness.server import db
from tests.conftest import TOY_GRADER, TOY_SOLUTION, TOY_STUB, TOY_YAML

LABS = ("01", "02", "03", "04", "05")
STUDENTS = tuple(f"student{i:02d}" for i in range(10))
LEASE_S = 10
DEADLINE_S = 600.0    # the whole scenario, as a bound: it takes about 3 minutes on 2 idle cores, 5+ when shared
LABS_CMD = [sys.executable, "-m", "harness"]
WRONG = "def add(x, y=1):\n    return x + y + 1  # off by one\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- processes --------------------------------------------------------------------------------

def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(pid: int) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(int(p.name)) == pid]


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        out += kids
        todo += kids
    return out


def _grader_of(pid: int) -> int | None:
    """The grader run below ``pid``, if it is grading now: a run the warm grader forked (a
    child of ``harness.forkserver`` with its command line), or pytest on the graders
    (``LABS_FORKSERVER=0``)."""
    for d in _descendants(pid):
        cmd = _cmdline(d)
        forked = "harness.forkserver" in cmd and "harness.forkserver" in _cmdline(_ppid(d))
        if _alive(d) and (forked or ("-m pytest" in cmd and "--labs-results" in cmd)):
            return d
    return None


@dataclass
class Procs:
    """Every process a scenario starts, with its log file; all killed at the end."""

    logs: Path
    started: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict | None = None) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("ab")
        log.write(f"\n=== {time.strftime('%H:%M:%S')} {' '.join(cmd)}\n".encode())
        log.flush()
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                             start_new_session=True, stdin=subprocess.DEVNULL)
        log.close()
        self.started.append((name, p))
        return p

    def kill_all(self) -> None:
        for _name, p in reversed(self.started):
            for d in _descendants(p.pid) if p.poll() is None else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(d, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                p.wait(timeout=10)

    def dump(self) -> None:
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace")
            print(f"\n----- {log.name} (last 12000 characters) -----\n{text[-12000:]}")


# --- Redis --------------------------------------------------------------------------------------

@pytest.fixture
def redis_url(tmp_path):
    exe = shutil.which("redis-server") or ("/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None)
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (.ci/run installs Debian's redis-server)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    log = (tmp_path / "redis.log").open("wb")
    p = subprocess.Popen([exe, "--save", "", "--appendonly", "no", "--port", str(port), "--bind", "127.0.0.1"],
                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    break
            if p.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server did not start: {(tmp_path / 'redis.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        p.kill()
        p.wait()
        log.close()


# --- the course: 5 labs of the toy, so one student's 5 submissions never cancel each other -------

def write_course(root: Path) -> manifest.Course:
    toy = yaml.safe_load(TOY_YAML)["labs"]["07"]
    toy["perf"]["add_vs_torch"] = {"baseline": "torch.add", "full_credit": 2.5, "zero_credit": 5.0}  # toy's 2.0: full
    toy["limits"] = {"timeout_s": 120}
    data = {"name": "Scenario course", "submissions": {"rate": {"burst": 10, "per_hour": 60}},
            "labs": {n: {**toy, "title": f"Toy lab {n}"} for n in LABS}}
    files = {"labs.yaml": yaml.safe_dump(data, sort_keys=False)}
    for n in LABS:
        files |= {f"labs/{n}/toy.py": TOY_STUB, f"solutions/{n}/toy.py": TOY_SOLUTION,
                  f"graders/{n}/test_toy.py": TOY_GRADER}
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return manifest.load(root)


def module_of(student: int, lab: int) -> tuple[str, bool]:
    """Student ``student``'s module for lab ``lab`` (distinct per student: own fingerprint),
    and whether it is the reference (else off by one: a wrong answer, a result)."""
    reference = (student + lab) % 4 != 0
    body = TOY_SOLUTION if reference else WRONG
    return f"# {STUDENTS[student]}, lab {LABS[lab]}\n{body}", reference


@dataclass
class Scenario:
    mode: str
    tmp: Path
    redis: str | None = None
    figures: dict = field(default_factory=dict)

    def __post_init__(self):
        self.course = write_course(self.tmp / "course")
        self.url = f"sqlite:///{self.tmp / 'server.db'}"
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        (self.tmp / "logs").mkdir()
        self.procs = Procs(self.tmp / "logs")
        self.sessions = db.sessions(self.url)
        self.serves = 0

    def labs(self, *args: str, name: str = "cli") -> str:
        out = subprocess.run([*LABS_CMD, "--course", str(self.course.root), *args], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, f"labs {' '.join(args)}: {out.stdout}{out.stderr}"
        return out.stdout

    def accounts(self) -> None:
        roster = self.tmp / "roster.csv"
        roster.write_text("name,email\n" + "".join(f"{s},{s}@example.edu\n" for s in STUDENTS))
        self.labs("roster", "import", str(roster), "--db", self.url, "--tokens", str(self.tmp / "tokens.csv"))
        with (self.tmp / "tokens.csv").open() as f:
            self.tokens = {row["name"]: row["token"] for row in csv.DictReader(f)}
        assert set(self.tokens) == set(STUDENTS)
        self.runner_token = self.labs("account", "add", "host-a", "--role", "runner", "--db", self.url).strip()

    def serve(self) -> subprocess.Popen:
        self.serves += 1
        cmd = [*LABS_CMD, "--course", str(self.course.root), "serve", "--db", self.url, "--host", "127.0.0.1",
               "--port", str(self.port), "--lease", str(LEASE_S)]
        if self.mode == "pool":
            cmd += ["--runner", "pool", "--broker", self.redis, "--gpu-model", "cpu-ci"]
        elif self.mode == "none":
            cmd += ["--runner", "none"]
        else:
            cmd += ["--runner", "local", "--gpus", "cpu:2"]
        self.server = self.procs.start("server", cmd, {"TRITON_INTERPRET": "1"})
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    return self.server
            assert self.server.poll() is None, f"labs serve exited with {self.server.returncode}"
            assert time.monotonic() < deadline, "labs serve did not answer /healthz in 60 s"
            time.sleep(0.2)

    def start_runner(self) -> subprocess.Popen:
        token_file = self.tmp / "runner-token"
        token_file.write_text(self.runner_token + "\n")
        token_file.chmod(0o600)
        self.runner = self.procs.start("runner", [
            *LABS_CMD, "--course", str(self.course.root), "runner", "--broker", self.redis, "--server", self.base,
            "--token-file", str(token_file), "--gpus", "cpu:2", "--gpu-model", "cpu-ci", "--lease", str(LEASE_S)],
            {"TRITON_INTERPRET": "1", "LABS_POOL_BACKOFF_S": "1"})
        return self.runner

    def slots(self) -> list[int]:
        """The grading processes now: Celery workers (pool) or dispatchers (local)."""
        parent, what = (self.runner.pid, "harness.server.pool") if self.mode == "pool" else \
            (self.server.pid, "harness.server.runner")
        return [p for p in _children(parent) if what in _cmdline(p) and _alive(p)]

    def submit_all(self) -> dict[str, bool]:
        """50 submissions, each student each lab once; {submission id: is the reference}."""
        folder = self.tmp / "modules"
        out = {}
        with httpx.Client(base_url=self.base, timeout=30) as client:
            for lab_i, lab in enumerate(LABS):
                for st_i, student in enumerate(STUDENTS):
                    text, reference = module_of(st_i, lab_i)
                    path = folder / student / lab / "toy.py"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    blob = grading.pack_module(path, self.course.lab(lab))
                    r = client.post("/api/submissions", data={"lab": lab},
                                    files={"file": (f"{lab}.tar.gz", blob, "application/gzip")},
                                    headers={"Authorization": f"Bearer {self.tokens[student]}"})
                    assert r.status_code == 201, r.text
                    assert not r.json()["duplicate"]
                    out[r.json()["id"]] = reference
        return out

    def counts(self) -> dict[str, int]:
        with self.sessions() as s:
            rows = s.execute(select(db.Job.state, func.count(db.Job.id)).group_by(db.Job.state)).all()
            return {state: n for state, n in rows} | {"results": s.scalar(select(func.count(db.Result.id)))}

    def wait_until(self, what: str, cond, timeout_s: float) -> None:
        deadline = min(time.monotonic() + timeout_s, self.t0 + DEADLINE_S)
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.counts()}"
            time.sleep(0.25)

    def kill_a_grading_slot(self) -> dict:
        """SIGKILL a slot while it grades (pool: the worker's whole process group); returns what."""
        found = {}

        def grading_now():
            for pid in self.slots():
                grader = _grader_of(pid)
                if grader:
                    found.update(pid=pid, grader=grader)
                    return True
            return False

        self.wait_until("a slot grading a job", grading_now, 120)
        with self.sessions() as s:
            running = s.scalars(select(db.Job.id).where(db.Job.state == "running")).all()
        if self.mode == "pool":
            os.killpg(found["pid"], signal.SIGKILL)  # the worker, its pool child
        else:
            os.kill(found["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        self.wait_until("the killed slot's grader to die with it", lambda: not _alive(found["grader"]), 15)
        return {"killed_pid": found["pid"], "grader_pid": found["grader"], "jobs_running_then": running,
                "at_s": round(killed_at - self.t0, 1), "grader_died_after_s": round(time.monotonic() - killed_at, 1)}

    def restart_server(self) -> dict:
        old, slots = self.server, (self.slots() if self.mode == "local" else [])
        before = self.counts()
        old.send_signal(signal.SIGKILL)  # the server process alone: its dispatchers must follow it
        old.wait(timeout=10)
        t = time.monotonic()
        self.wait_until("the old dispatchers to die with the server", lambda: not any(_alive(p) for p in slots), 15)
        orphans_gone_s = round(time.monotonic() - t, 1)
        self.serve()
        return {"at_s": round(t - self.t0, 1), "counts_before": before, "down_s": round(time.monotonic() - t, 1),
                "old_dispatchers": slots, "orphans_gone_after_s": orphans_gone_s if slots else None}

    def verify(self, subs: dict[str, bool]) -> dict:
        with self.sessions() as s:
            assert s.scalar(select(func.count(db.Submission.id))) == 50
            per_sub = dict(s.execute(select(db.Result.submission_id, func.count(db.Result.id))
                                     .group_by(db.Result.submission_id)).all())
            missing = [x for x in subs if x not in per_sub]
            doubled = {x: n for x, n in per_sub.items() if n != 1}
            assert not missing, f"{len(missing)} submission(s) without a result: {missing}"
            assert not doubled, f"submissions with more than one result: {doubled}"
            jobs = s.scalars(select(db.Job)).all()
            assert len(jobs) == 50 and all(j.state == "done" for j in jobs), \
                [(j.id, j.state, j.attempts, j.error) for j in jobs if j.state != "done"]
            wrong_full = []
            for res in s.scalars(select(db.Result)):
                host = json.loads(res.host)
                assert res.gpu_model == "cpu" and host.get("gpu_model") == "cpu", (res.gpu_model, host)
                assert res.kind == "ok", (res.kind, res.status)
                if subs[res.submission_id]:
                    assert res.max_runnable > 0 and res.score == pytest.approx(res.max_runnable), \
                        f"a reference scored {res.score} / {res.max_runnable} runnable: {res.status}"
                elif res.score >= res.max_runnable:
                    wrong_full.append(res.submission_id)
            assert not wrong_full, f"wrong answers scored full marks: {wrong_full}"
            requeued = [{"job": j.id, "attempts": j.attempts, "error": j.error} for j in jobs if j.attempts]
            owners = sorted({r.runner for r in s.scalars(select(db.Result))})
        return {"requeued_jobs": requeued, "jobs_requeued": len(requeued),
                "attempts_total": sum(j["attempts"] for j in requeued),
                "references": sum(subs.values()), "wrong_answers": len(subs) - sum(subs.values()), "owners": owners}


def run_scenario(mode: str, tmp_path: Path, redis: str | None = None) -> dict:
    sc = Scenario(mode, tmp_path, redis)
    try:
        sc.accounts()
        sc.t0 = time.monotonic()
        sc.serve()
        if mode == "pool":
            sc.start_runner()
        subs = sc.submit_all()
        submitted_s = time.monotonic() - sc.t0
        killed = sc.kill_a_grading_slot()
        if mode == "pool":  # the runner token is on no command line of the runner's processes
            assert not [p for p in [sc.runner.pid, *_descendants(sc.runner.pid)] if sc.runner_token in _cmdline(p)]
        sc.wait_until("10 results", lambda: sc.counts()["results"] >= 10, 240)
        restart = sc.restart_server()
        sc.wait_until("every job done", lambda: sc.counts().get("done", 0) == 50, DEADLINE_S)
        wall = time.monotonic() - sc.t0
        figures = {"scenario": mode, "submissions": 50, "students": len(STUDENTS), "labs": len(LABS),
                   "slots": 2, "lease_s": LEASE_S, "wall_s": round(wall, 1), "submitted_in_s": round(submitted_s, 1),
                   "submissions_per_hour": round(50 * 3600 / wall), "killed": killed, "server_restart": restart,
                   "server_starts": sc.serves}
        figures |= sc.verify(subs)
        if mode == "pool":
            text = (sc.procs.logs / "runner.log").read_text(errors="replace")
            figures |= {"duplicate_deliveries": text.count("(a duplicate delivery)"),
                        "duplicate_results_dropped": text.count("duplicate result dropped"),
                        "worker_restarts": text.count("starting it again"),
                        "held_retries": text.count("Retry in")}
            assert figures["worker_restarts"] >= 1, "labs runner did not start the killed worker again"
        assert figures["jobs_requeued"] >= 1, "the job of the killed slot was not re-queued by the reaper"
        out = tmp_path / f"figures-{mode}.json"
        out.write_text(json.dumps(figures, indent=2))
        print(f"\n{mode} scenario figures ({out}):\n{json.dumps(figures, indent=2)}")
        return figures
    except BaseException:
        print(f"\n{mode} scenario failed; the database says {sc.counts()}")
        sc.procs.dump()
        raise
    finally:
        sc.procs.kill_all()


def test_pool_scenario_celery_workers_redis_kills_and_a_server_restart(tmp_path, redis_url):
    """50 submissions through Redis and two Celery workers: a worker SIGKILLed mid-job and
    the server SIGKILLed and restarted lose nothing and store nothing twice."""
    run_scenario("pool", tmp_path, redis_url)


def test_local_scenario_dispatchers_kills_and_a_server_restart(tmp_path):
    """The same with the embedded dispatchers: one SIGKILLed mid-job; the server's SIGKILL
    takes the others with it (no orphans) and its restart starts fresh ones."""
    run_scenario("local", tmp_path)


# --- the pool's task and queues, against a real server and a real Redis ---------------------------

def test_interactive_queue_is_consumed_before_regrades_and_messages_carry_only_the_job_id(redis_url):
    """Published in the order trial, regrade, interactive, regrade, interactive: a consumer
    set up as the workers are (queues listed in reverse, even) takes both interactive
    first, then the regrades, the trial last."""
    from celery import Celery

    from harness.server import pool

    publish = pool.publisher(redis_url, "m1")
    publish("trial-1", "trial")  # a trial run, published first: taken last
    for job_id, queue in ((101, "regrade"), (102, "interactive"), (103, "regrade"), (104, "interactive")):
        publish(job_id, queue)
    with pytest.raises(ValueError):
        publish(105, "nightly")
    app = pool.configure(Celery("t", set_as_current=False), redis_url, 60, "m1")
    assert app.conf.broker_transport_options["visibility_timeout"] > app.conf.task_time_limit \
        > app.conf.task_soft_time_limit > 60
    got = []

    def on(body, message):
        got.append((message.delivery_info["routing_key"], body, message.content_type))
        message.ack()

    with app.connection_for_read() as conn:
        with conn.Consumer(list(reversed(app.conf.task_queues)), callbacks=[on], accept=["json"]) as consumer:
            consumer.qos(prefetch_count=1)
            deadline = time.monotonic() + 20
            while len(got) < 5 and time.monotonic() < deadline:
                with contextlib.suppress(socket.timeout, TimeoutError):
                    conn.drain_events(timeout=1)
    assert [b[0][0] for _, b, _ in got] == [102, 104, 101, 103, "trial-1"], got
    assert [q for q, _, _ in got] == ["interactive.m1", "interactive.m1", "regrade.m1", "regrade.m1", "trial.m1"]
    assert all(ct == "application/json" and b[0] == [b[0][0]] and b[1] == {} for _, b, ct in got)


@pytest.fixture
def plain_server(tmp_path):
    sc = Scenario("none", tmp_path)
    try:
        sc.accounts()
        sc.t0 = time.monotonic()
        sc.serve()
        yield sc
    except BaseException:
        sc.procs.dump()
        raise
    finally:
        sc.procs.kill_all()


def _submit(sc: Scenario, student: int, lab: int, text: str) -> int:
    path = sc.tmp / "modules" / f"{student}-{lab}" / "toy.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {STUDENTS[student]}\n{text}")
    r = httpx.post(f"{sc.base}/api/submissions", data={"lab": LABS[lab]},
                   files={"file": (f"{LABS[lab]}.tar.gz", grading.pack_module(path, sc.course.lab(LABS[lab])))},
                   headers={"Authorization": f"Bearer {sc.tokens[STUDENTS[student]]}"}, timeout=30)
    assert r.status_code == 201, r.text
    with sc.sessions() as s:
        return s.scalar(select(db.Job.id).where(db.Job.submission_id == r.json()["id"]))


def test_grade_task_retries_infrastructure_failures_twice_and_never_a_students_result(plain_server, monkeypatch):
    """The task itself (run eagerly, so its retries run at once) against `labs serve`:
    an infrastructure failure is POSTed and retried at most twice, after which the
    server marks the job failed; a wrong answer is one result, final; a second
    delivery of a done job, or of one held by a live lease, stores nothing."""
    from harness.errors import InfraFailure
    from harness.server import jobs, pool

    sc = plain_server
    monkeypatch.setattr(pool, "SETTINGS", {"server": sc.base, "token": sc.runner_token, "course": str(sc.course.root),
                                           "lease_s": LEASE_S, "sandbox": "process"})
    monkeypatch.setattr(pool._Host, "pid", None)
    real, calls = jobs.grade_job, []

    def broken(*a, **kw):
        calls.append(a[1])
        raise InfraFailure("the sandbox could not start")

    monkeypatch.setattr(jobs, "grade_job", broken)
    job = _submit(sc, 0, 0, TOY_SOLUTION)
    assert "infrastructure failure, job failed" in pool.grade.apply(args=[job]).get()
    assert len(calls) == 3  # the first attempt and 2 retries
    with sc.sessions() as s:
        j = s.get(db.Job, job)
        assert (j.state, j.attempts, j.result) == ("failed", 3, None) and "sandbox could not start" in j.error

    monkeypatch.setattr(jobs, "grade_job", lambda *a, **kw: (calls.append(a[1]), real(*a, **kw))[1])
    calls.clear()
    job = _submit(sc, 1, 0, WRONG)
    assert pool.grade.apply(args=[job]).get() == f"job {job}: stored"
    assert pool.grade.apply(args=[job]).get() == f"job {job}: not queued"  # a duplicate delivery: quiet
    assert len(calls) == 1
    with sc.sessions() as s:
        j = s.get(db.Job, job)
        assert (j.state, j.attempts) == ("done", 0)
        assert j.result.kind == "ok" and j.result.score < j.result.max_runnable
        assert j.result.gpu_model == "cpu" and json.loads(j.result.host)["gpu_model"] == "cpu"

    job = _submit(sc, 2, 0, TOY_SOLUTION)
    held = httpx.post(f"{sc.base}/api/runner/jobs/{job}/claim", params={"lease_s": 600},
                      headers={"Authorization": f"Bearer {sc.runner_token}"})
    assert held.status_code == 200
    again = httpx.post(f"{sc.base}/api/runner/jobs/{job}/claim", headers={"Authorization": f"Bearer {sc.runner_token}"})
    assert again.status_code == 409 and int(again.headers["retry-after"]) > 500
    assert "still held by another lease" in pool.grade.apply(args=[job]).get()
    assert len(calls) == 1
