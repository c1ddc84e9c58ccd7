"""The course server's API, intake and job queue, on SQLite and on PostgreSQL.

Every test that touches the database runs twice (``db_url``: a SQLite file, and a
fresh database on a throwaway PostgreSQL server started for the session). Real
services throughout: the FastAPI app under ``TestClient``, the service functions,
the embedded dispatcher grading the toy lab with grade-all's pipeline, and one load
test against a real uvicorn server on loopback.
"""
from __future__ import annotations

import contextlib
import glob
import io
import itertools
import json
import os
import pwd
import shutil
import socket
import statistics
import subprocess
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml

from harness import manifest
from tests.conftest import TOY_SOLUTION, TOY_STUB, TOY_YAML

# A grader whose perf ratio is the module's RATIO (the reference has none: 1.0, full
# credit), so runs of one lab rank differently; the markers must never reach a client.
GRADER_MARK = "GRADER-TEXT-7f3a"
SOLUTION_MARK = "SOLUTION-TEXT-91c2"
GRADER = f'''\
import pytest

# {GRADER_MARK}

@pytest.mark.part("A")
def test_adds(impl, seed):
    assert impl.add(seed, 2) == seed + 2, "add(x, 2) is not x + 2"

@pytest.mark.part("A")
@pytest.mark.points(2)
def test_default(impl):
    assert impl.add(3) == 4

@pytest.mark.part("B")
@pytest.mark.perf
def test_speed(impl, record_perf):
    assert impl.add(1) == 2
    record_perf("add_vs_torch", float(getattr(impl, "RATIO", 1.0)), note="toy")
'''
SOLUTION = f"# {SOLUTION_MARK}\n" + TOY_SOLUTION


# --- PostgreSQL: one throwaway server per test session --------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pg_bindir() -> Path | None:
    """The folder holding initdb and pg_ctl: on PATH, else Debian's newest
    /usr/lib/postgresql/N/bin."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(Path(d).parent.name)
                  if Path(d).parent.name.isdigit() else 0)
    for d in reversed(dirs):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


@dataclass
class Postgres:
    port: int
    admin: str  # libpq conninfo of the maintenance database
    names: itertools.count = field(default_factory=itertools.count)


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server on 127.0.0.1 (a free port, trust auth, data in a temporary
    folder owned by the ``postgres`` user when we are root: initdb refuses root),
    stopped at the end. Missing binaries skip, or fail under CI."""
    bindir = _pg_bindir()
    if bindir is None:
        why = "PostgreSQL binaries (initdb, pg_ctl) not found on PATH or in /usr/lib/postgresql/*/bin"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run the PostgreSQL tests (.ci/run installs postgresql)", pytrace=False)
        pytest.skip(f"{why} (apt-get install postgresql)")
    as_user: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="labs-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(tmp)
            pytest.fail("running as root and there is no 'postgres' user to run initdb as", pytrace=False)
        os.chown(tmp, user.pw_uid, user.pw_gid)
        as_user = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups", "--"]
    data, port = tmp / "data", _free_port()
    run = lambda *cmd: subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120, cwd=tmp)
    out = run(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
              "--locale=C", "--no-sync")
    assert out.returncode == 0, f"initdb failed:\n{out.stdout}\n{out.stderr}"
    opts = (f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={tmp} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
    out = run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(tmp / "server.log"), "-w", "-t", "60",
              "-o", opts, "start")
    assert out.returncode == 0, f"pg_ctl start failed:\n{out.stdout}\n{out.stderr}\n" + (
        (tmp / "server.log").read_text() if (tmp / "server.log").exists() else "")
    try:
        yield Postgres(port, f"host=127.0.0.1 port={port} user=postgres dbname=postgres")
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A fresh, empty database: a SQLite file, or a new database on the session's server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'server.db'}"
        return
    import psycopg

    pg: Postgres = request.getfixturevalue("postgres")
    name = f"labs_{os.getpid()}_{next(pg.names)}"
    with psycopg.connect(pg.admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/{name}"
    with psycopg.connect(pg.admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- a course, a server, its accounts --------------------------------------------------------

class Clock:
    """The server's injected clock: real time until a test moves it."""

    def __init__(self, t: float | None = None):
        self.t = time.time() if t is None else t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def write_course(root: Path, submissions: dict | None = None, deadline: datetime | None = None) -> manifest.Course:
    """The toy course with our grader and solution, ``submissions:`` settings and lab 07's deadline."""
    data = yaml.safe_load(TOY_YAML)
    if submissions:
        data["submissions"] = submissions
    if deadline is not None:
        data["labs"]["07"]["deadline"] = deadline.isoformat()
    (root / "labs.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (root / "graders/07/test_toy.py").write_text(GRADER)
    (root / "solutions/07/toy.py").write_text(SOLUTION)
    return manifest.load(root)


@dataclass
class Server:
    client: object
    app: object
    course: manifest.Course
    url: str
    clock: Clock
    tokens: dict
    mods: Path

    @property
    def sessions(self):
        return self.app.state.sessions

    def h(self, name: str) -> dict:
        return {"Authorization": f"Bearer {self.tokens[name]}"}

    def blob(self, text: str) -> bytes:
        """``text`` as lab 07's module, packed as `labs submit` packs it."""
        from harness.server import service

        folder = self.mods / f"m{len(list(self.mods.iterdir()))}"
        folder.mkdir()
        (folder / "toy.py").write_text(text)
        return service.pack_module(folder / "toy.py", self.course.lab("07"))

    def submit(self, who: str, data: bytes, lab: str = "07", filename: str = "07.tar.gz"):
        return self.client.post("/api/submissions", data={"lab": lab}, files={"file": (filename, data)},
                                headers=self.h(who))

    def account(self, s, name: str):
        from harness.server import service

        return service.authenticate(s, self.tokens[name])


ACCOUNTS = {"alice": "student", "bob": "student", "carol": "student", "dave": "student", "ta": "staff",
            "r1": "runner", "r2": "runner"}


@pytest.fixture
def server(db_url, toy_course, tmp_path):
    """``server(submissions=..., deadline=..., clock=...)``: the app over ``db_url`` for
    the toy course, with accounts alice, bob, carol, dave (students), ta (staff), r1 and
    r2 (runners). The reaper is effectively off (tests call ``reap`` with their own times)."""
    from fastapi.testclient import TestClient

    from harness.server import app as app_mod, service

    opened, tokens = [], {}

    def make(submissions: dict | None = None, deadline: datetime | None = None, clock: Clock | None = None):
        course = write_course(toy_course, submissions, deadline)
        clock = clock or Clock()
        app = app_mod.create_app(course, db_url, reap_every_s=3600, clock=clock)
        client = TestClient(app)
        client.__enter__()
        opened.append(client)
        if not tokens:  # a second server over the same database (other settings) reuses them
            with app.state.sessions() as s:
                tokens.update({n: service.add_account(s, n, role, b"test-secret", now=clock())
                               for n, role in ACCOUNTS.items()})
        mods = tmp_path / "modules"
        mods.mkdir(exist_ok=True)
        return Server(client, app, course, db_url, clock, tokens, mods)

    yield make
    for client in opened:
        client.__exit__(None, None, None)
        client.app.state.sessions.kw["bind"].dispose()


def variant(i: int, ratio: float | None = None) -> str:
    """A distinct correct module (a different fingerprint per ``i``)."""
    return TOY_SOLUTION + (f"RATIO = {ratio}\n" if ratio is not None else "") + f"# variant {i}\n"


def tar_of(*members: tuple[str, bytes | None, str | None]) -> bytes:
    """A .tar.gz of (name, data, symlink target) members, written with tarfile."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data, link in members:
            info = tarfile.TarInfo(name)
            if link is not None:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def outcome(score: float = 8.5, ratio: float | None = 1.0, duration_s: float = 4.0) -> dict:
    """A runner's outcome as a grading would send it: the typed record, as JSON."""
    from harness.records import GradeResult, Graded, TestResult
    test = TestResult(name="test_adds", nodeid="graders/07/test_toy.py::test_adds", part="A", max_score=8.5,
                      score=score, outcome="passed" if score == 8.5 else "failed",
                      perf=[] if ratio is None else [{"name": "add_vs_torch", "ratio": ratio}])
    record = Graded.of(GradeResult("07", "", 1, [test], duration_s), lab_points=10.0, duration_s=duration_s)
    return {"record": record.to_json(), "host": {"host": "test"}, "gpu_model": "cpu"}


def record(**kw):
    """``outcome(**kw)`` as ``service.complete`` takes it."""
    from harness.records import Graded
    from harness.server import service
    got = outcome(**kw)
    return service.Outcome(Graded.from_json(got["record"]), got["host"], got["gpu_model"])


# --- auth --------------------------------------------------------------------------------------

API_ROUTES = [  # (family, method, path, request kwargs)
    ("student", "POST", "/api/submissions", {"data": {"lab": "07"}, "files": {"file": ("07.tar.gz", b"x")}}),
    ("student", "GET", "/api/submissions", {}),
    ("student", "GET", "/api/submissions/0123abcd", {}),
    ("student", "GET", "/api/leaderboard/07", {}),
    ("runner", "POST", "/api/runner/jobs/1/claim", {}),
    ("runner", "POST", "/api/runner/jobs/next", {}),
    ("runner", "POST", "/api/runner/jobs/1/renew", {}),
    ("runner", "POST", "/api/runner/jobs/1/complete", {"json": outcome()}),
    ("runner", "POST", "/api/runner/jobs/1/fail", {"json": {"reason": "disk full"}}),
    ("staff", "GET", "/api/staff/overview", {}),
    ("staff", "GET", "/api/staff/grades.csv?lab=07", {}),
    ("staff", "POST", "/api/staff/results/1/invalid", {"json": {"reason": "copied"}}),
    ("staff", "POST", "/api/staff/regrade", {"data": {"lab": "07"}}),
]


def test_every_api_route_needs_a_valid_token(server):
    srv = server()
    for _, method, path, kw in API_ROUTES:
        for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic abc"}):
            r = srv.client.request(method, path, headers=headers, **kw)
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
            assert "no valid token" in r.json()["detail"]
    r = srv.client.get("/me", follow_redirects=False)  # a page without a token: to the login form
    assert r.status_code == 303 and r.headers["location"] == "/login"


def test_each_role_is_refused_the_other_roles_routes(server):
    srv = server()
    for family, method, path, kw in API_ROUTES:
        refused = {"student": ["r1"], "runner": ["alice", "ta"], "staff": ["alice", "r1"]}[family]
        for who in refused:
            r = srv.client.request(method, path, headers=srv.h(who), **kw)
            assert r.status_code == 403, (who, method, path, r.status_code, r.text)
            assert "this needs a" in r.json()["detail"]
    r = srv.client.get("/staff", headers=srv.h("alice"))
    assert r.status_code == 403 and "this needs a staff token" in r.text


def test_students_read_and_list_only_their_own_submissions(server):
    srv = server()
    r = srv.submit("alice", srv.blob(TOY_SOLUTION))
    assert r.status_code == 201, r.text
    sub = r.json()["id"]
    assert r.json()["student"] == "alice" and r.json()["state"] == "queued"
    for who in ("bob", "carol"):
        r = srv.client.get(f"/api/submissions/{sub}", headers=srv.h(who))
        assert r.status_code == 404 and r.json()["detail"] == f"no submission {sub!r} of yours"
        r = srv.client.get(f"/api/submissions/{sub[:3]}", headers=srv.h("alice"))
        assert r.status_code == 404 and "a prefix has at least 4 characters" in r.json()["detail"]
        assert srv.client.get("/api/submissions", headers=srv.h(who)).json() == []
        assert srv.client.get("/api/submissions?student=alice", headers=srv.h(who)).json() == []
        r = srv.client.get(f"/submissions/{sub}", headers=srv.h(who))
        assert r.status_code == 404 and "alice" not in r.text
    assert srv.client.get(f"/api/submissions/{sub}", headers=srv.h("alice")).json()["id"] == sub
    assert [x["id"] for x in srv.client.get("/api/submissions", headers=srv.h("alice")).json()] == [sub]
    assert [x["id"] for x in srv.client.get("/api/submissions?student=alice", headers=srv.h("ta")).json()] == [sub]
    assert srv.client.get("/api/submissions?student=bob", headers=srv.h("ta")).json() == []
    assert srv.client.get(f"/api/submissions/{sub}", headers=srv.h("ta")).json()["student"] == "alice"


def test_no_route_serves_graders_solutions_or_the_manifest(server):
    srv = server()
    paths = ["/graders/07/test_toy.py", "/solutions/07/toy.py", "/static/../graders/07/test_toy.py",
             "/static/graders/07/test_toy.py", "/labs.yaml", "/../graders/07/test_toy.py",
             "/api/../solutions/07/toy.py", "/api/graders/07/test_toy.py", "/api/solutions/07/toy.py",
             "/%2e%2e/graders/07/test_toy.py", "/api/%2e%2e/solutions/07/toy.py", "/graders", "/solutions/",
             "/.labs-staff/course-secret", "/labs/07/toy.py", "/api/labs.yaml", "/openapi.json", "/docs"]
    secrets_ = [GRADER_MARK, SOLUTION_MARK, "return x + y", "add(x, 2) is not x + 2"]
    for path in paths:
        for who in (None, "alice", "ta"):
            r = srv.client.get(path, headers=srv.h(who) if who else {}, follow_redirects=False)
            assert r.status_code == 404, (path, who, r.status_code)
            assert not any(s in r.text for s in secrets_), (path, who, r.text[:200])
    # a submission id made of a path: looked up, never read from disk
    r = srv.client.get("/submissions/..%2F..%2Fsolutions%2F07%2Ftoy.py", headers=srv.h("ta"))
    assert r.status_code == 404 and not any(s in r.text for s in secrets_)


# --- intake ------------------------------------------------------------------------------------

def test_upload_over_the_size_cap_is_413(server):
    srv = server(submissions={"max_kb": 1})
    r = srv.submit("alice", os.urandom(1025))
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == "upload is 1025 bytes, the limit is 1024 (submissions.max_kb)"
    r = srv.submit("alice", os.urandom(64 << 10))  # far over: refused from its Content-Length, unread
    assert r.status_code == 413 and r.json()["detail"] == \
        f"request body is {r.request.headers['content-length']} bytes, the limit is {(1 + 16) << 10}"
    assert srv.submit("alice", srv.blob(TOY_SOLUTION)).status_code == 201  # a packed module fits


def test_upload_that_is_not_an_archive_holding_the_module_is_422(server):
    srv = server()
    module = TOY_SOLUTION.encode()
    cases = {  # (filename, data) -> words the message must contain
        ("toy.py", module): ["'toy.py' is not an archive", "labs submit 07"],
        ("07.tar.gz", b"this is not gzip"): ["07.tar.gz", "not a readable archive"],
        ("07.zip", b"PK\x03\x04 broken"): ["07.zip", "not a readable archive"],
        ("07.tar.gz", tar_of(("07/other.py", module, None))): ["no toy.py"],
        ("07.tar.gz", tar_of(("07/toy.py", None, "/etc/passwd"))): ["link", "07/toy.py"],
        ("07.tar.gz", tar_of(("07/toy.py", module, None), ("07/x.py", None, "../../solutions/07/toy.py"))):
            ["link", "07/x.py"],
        ("07.tar.gz", tar_of(("../07/toy.py", module, None))): ["path traversal", "../07/toy.py"],
        ("07.tar.gz", tar_of(("/tmp/07/toy.py", module, None))): ["absolute path"],
    }
    for (filename, data), words in cases.items():
        r = srv.submit("alice", data, filename=filename)
        assert r.status_code == 422, (filename, r.status_code, r.text)
        detail = r.json()["detail"]
        assert all(w in detail for w in words), (words, detail)
    assert srv.client.get("/api/submissions", headers=srv.h("alice")).json() == []  # nothing stored
    r = srv.submit("alice", srv.blob(TOY_SOLUTION), lab="99")
    assert r.status_code == 404 and r.json()["detail"] == "no lab '99'"


def test_crafted_upload_file_names_are_stored_under_safe_ones(server):
    from harness.server import service

    srv = server()
    names = {"a" * 300 + ".tar.gz": "07.tar.gz", "\u00e9" * 130 + ".tgz": "07.tgz",
             "../../etc/x/mine.tar.gz": "mine.tar.gz", "C:\\Users\\me\\07.tar.gz": "07.tar.gz"}
    for i, (sent, stored) in enumerate(names.items()):
        r = srv.submit("ta", srv.blob(variant(i)), filename=sent)
        assert r.status_code == 201, (sent[:20], r.status_code, r.text)
        assert r.json()["filename"] == stored
    with srv.sessions() as s:  # a name no HTTP client would send
        got = service.submit(s, srv.course, srv.account(s, "ta"), "07", "a\x00b.tar.gz", srv.blob(variant(9)),
                             srv.clock())
        assert got.submission.filename == "07.tar.gz"


def test_after_the_deadline_a_lab_is_closed_without_late_days(server):
    deadline = datetime.now(timezone.utc) - timedelta(hours=1)
    srv = server(deadline=deadline)
    r = srv.submit("alice", srv.blob(TOY_SOLUTION))
    assert r.status_code == 403, r.text
    assert r.json()["detail"] == f"lab 07 closed at {deadline.isoformat()}"
    assert srv.submit("ta", srv.blob(TOY_SOLUTION)).status_code == 403  # the deadline is everyone's


def test_late_submission_within_max_days_is_accepted_with_its_late_days(server):
    deadline = datetime.now(timezone.utc) - timedelta(days=1, hours=1)  # 1 day 1 hour ago: 2 started days
    srv = server(deadline=deadline, submissions={"late": {"grace_minutes": 30, "max_days": 3,
                                                          "penalty_per_day": 0.1}})
    r = srv.submit("alice", srv.blob(TOY_SOLUTION))
    assert r.status_code == 201, r.text
    assert r.json()["late_days"] == 2
    srv.clock.advance(2 * 86400)  # 3 days 1 hour minus the grace: past max_days
    r = srv.submit("alice", srv.blob(variant(1)))
    assert r.status_code == 403 and "(late submissions accepted for 3 days)" in r.json()["detail"]


def test_duplicate_module_queues_nothing_and_spends_no_token(server):
    srv = server(submissions={"rate": {"burst": 2, "per_hour": 1}})
    first = srv.submit("alice", srv.blob(TOY_SOLUTION))
    assert first.status_code == 201 and first.json()["duplicate"] is False
    again = srv.submit("alice", srv.blob(TOY_SOLUTION))  # a fresh archive of the same module
    assert again.status_code == 201, again.text
    assert again.json()["duplicate"] is True and again.json()["id"] == first.json()["id"]
    from harness.server.db import Job, Submission
    with srv.sessions() as s:
        assert s.query(Submission).count() == 1 and s.query(Job).count() == 1
    assert srv.submit("alice", srv.blob(variant(1))).status_code == 201  # the second token
    r = srv.submit("alice", srv.blob(variant(2)))
    assert r.status_code == 429, r.text  # two tokens: the duplicate spent none


def test_newer_submission_cancels_the_older_queued_job(server):
    srv = server()
    old = srv.submit("alice", srv.blob(variant(1))).json()
    bobs = srv.submit("bob", srv.blob(variant(1))).json()
    new = srv.submit("alice", srv.blob(variant(2))).json()
    assert old["position"] == 1 and new["position"] == 2 and new["state"] == "queued"
    got = {x["id"]: x for x in srv.client.get("/api/submissions", headers=srv.h("alice")).json()}
    assert got[old["id"]]["state"] == "cancelled" and got[old["id"]]["position"] is None
    assert got[new["id"]]["state"] == "queued" and got[new["id"]]["position"] == 2
    bob = srv.client.get(f"/api/submissions/{bobs['id']}", headers=srv.h("bob")).json()
    assert bob["state"] == "queued" and bob["position"] == 1  # another student's job is untouched
    from harness.server.db import Job
    with srv.sessions() as s:
        cancelled = s.query(Job).filter(Job.state == "cancelled").one()
        assert cancelled.submission_id == old["id"] and cancelled.error == "a newer submission replaced it"
    # the cancelled module again is a new submission, not a duplicate of a given-up one
    r = srv.submit("alice", srv.blob(variant(1)))
    assert r.status_code == 201 and r.json()["duplicate"] is False and r.json()["id"] != old["id"]


# --- rate limit --------------------------------------------------------------------------------

def test_rate_limit_burst_then_429_with_retry_after_and_refill(server):
    srv = server(submissions={"rate": {"burst": 3, "per_hour": 60}})  # one token a minute
    for i in range(3):
        assert srv.submit("alice", srv.blob(variant(i))).status_code == 201
    r = srv.submit("alice", srv.blob(variant(3)))
    assert r.status_code == 429, r.text
    assert r.headers["Retry-After"] == "60"
    assert r.json()["detail"] == ("rate limit: 3 submissions of lab 07 at once, then 60 per hour; "
                                  "try again in 60 s")
    assert srv.submit("bob", srv.blob(variant(3))).status_code == 201  # per student
    for i in range(10, 16):
        assert srv.submit("ta", srv.blob(variant(i))).status_code == 201  # staff are not limited
    srv.clock.advance(20)  # a third of a token back
    r = srv.submit("alice", srv.blob(variant(3)))
    assert r.status_code == 429 and r.headers["Retry-After"] in ("40", "41")  # ceil of a float sum of times
    srv.clock.advance(41)
    assert srv.submit("alice", srv.blob(variant(3))).status_code == 201
    r = srv.submit("alice", srv.blob(variant(4)))
    assert r.status_code == 429 and r.headers["Retry-After"].isdigit() and 58 <= int(r.headers["Retry-After"]) <= 60
    srv.clock.advance(3 * 3600)  # refills to the burst, no further
    assert [srv.submit("alice", srv.blob(variant(20 + i))).status_code for i in range(4)] == [201, 201, 201, 429]


# --- the queue, through the service functions ----------------------------------------------

def _queued(srv: Server, who: str, i: int, now: float | None = None):
    from harness.server import service

    with srv.sessions() as s:
        got = service.submit(s, srv.course, srv.account(s, who), "07", "07.tar.gz", srv.blob(variant(i)),
                             srv.clock() if now is None else now)
        return got.job.id, got.submission.id


def test_claim_is_exclusive_even_concurrently(server):
    from harness.server import service
    from harness.server.db import Job

    srv = server()
    job_id, _ = _queued(srv, "alice", 1)
    now = srv.clock()
    with srv.sessions() as s1, srv.sessions() as s2:
        won = service.claim(s1, "r1", now, job_id=job_id)
        assert won is not None and won.lease_owner == "r1" and won.state == "running"
        assert service.claim(s2, "r2", now, job_id=job_id) is None
        assert service.claim(s2, "r2", now) is None  # nothing else queued
    # many runners at once, fewer jobs: each job goes to exactly one
    ids = [_queued(srv, who, i)[0] for i, who in enumerate(["alice", "bob", "carol"], 10)]
    barrier = threading.Barrier(8)

    def race(i):
        with srv.sessions() as s:
            barrier.wait()
            job = service.claim(s, f"runner{i}", now)
            return job.id if job else None

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(race, range(8)))
    assert sorted(j for j in got if j is not None) == sorted(ids)
    with srv.sessions() as s:
        owners = {j.id: j.lease_owner for j in s.query(Job).filter(Job.id.in_(ids))}
    assert len(set(owners.values())) == 3


def test_renew_only_by_the_lease_owner(server):
    from harness.server import service
    from harness.server.db import Job

    srv = server()
    job_id, _ = _queued(srv, "alice", 1)
    now = srv.clock()
    with srv.sessions() as s:
        service.claim(s, "r1", now, job_id=job_id, lease_s=30)
        assert service.renew(s, job_id, "r2", now + 10, 30) is False
        assert s.get(Job, job_id, populate_existing=True).lease_expires == now + 30
        assert service.renew(s, job_id, "r1", now + 10, 30) is True
        assert s.get(Job, job_id, populate_existing=True).lease_expires == now + 40
        assert service.reap(s, now + 35) == []  # renewed: not expired
    # over HTTP: a second runner is told who holds it and for how long
    r = srv.client.post(f"/api/runner/jobs/{job_id}/claim", headers=srv.h("r2"))
    assert r.status_code == 409 and r.json()["detail"] == f"job {job_id} is running"
    assert r.headers["Retry-After"].isdigit() and 0 < int(r.headers["Retry-After"]) <= 40
    assert srv.client.post(f"/api/runner/jobs/{job_id}/renew", headers=srv.h("r2")).json() == {"held": False}
    assert srv.client.post(f"/api/runner/jobs/{job_id}/renew", headers=srv.h("r1")).json() == {"held": True}


def test_expired_lease_is_reaped_and_infra_failure_never_scores_zero(server):
    from harness.server import service
    from harness.server.db import Job, Result

    srv = server()
    job_id, sub_id = _queued(srv, "alice", 1)
    t = srv.clock()
    with srv.sessions() as s:
        for attempt in range(1, service.MAX_ATTEMPTS + 1):
            assert service.claim(s, f"r{attempt}", t, lease_s=10).id == job_id
            assert service.reap(s, t + 5) == []
            back = service.reap(s, t + 11)
            job = s.get(Job, job_id, populate_existing=True)
            assert job.attempts == attempt and job.lease_owner is None
            assert job.error == f"the runner r{attempt} stopped renewing its lease"
            if attempt < service.MAX_ATTEMPTS:
                assert back == [job_id] and job.state == "queued"
            else:
                assert back == [] and job.state == "failed" and job.finished_at == t + 11
            t += 20
        assert service.claim(s, "r9", t) is None  # failed jobs are not handed out again
        assert s.query(Result).count() == 0
    view = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("alice")).json()
    assert view["state"] == "failed" and view["attempts"] == service.MAX_ATTEMPTS
    assert "stopped renewing its lease" in view["error"] and "result" not in view
    csv_text = srv.client.get("/api/staff/grades.csv?lab=07", headers=srv.h("ta")).text
    assert "alice" not in csv_text  # no row: never a 0
    lab = srv.client.get("/api/staff/overview", headers=srv.h("ta")).json()["labs"][0]
    assert lab["graded"] == 0 and lab["median_score"] is None
    # a runner's own failure report counts the same way, over HTTP
    job2, _ = _queued(srv, "bob", 2)
    assert srv.client.post(f"/api/runner/jobs/{job2}/claim", headers=srv.h("r1")).status_code == 200
    r = srv.client.post(f"/api/runner/jobs/{job2}/fail", json={"reason": "sandbox: no engine"}, headers=srv.h("r2"))
    assert r.json() == {"state": "running"}  # not r2's attempt to fail
    r = srv.client.post(f"/api/runner/jobs/{job2}/fail", json={"reason": "sandbox: no engine"}, headers=srv.h("r1"))
    assert r.json() == {"state": "queued"}


def test_concurrent_reapers_count_one_attempt_and_one_reports_it(server):
    from harness.server import service
    from harness.server.db import Job

    srv = server()
    jobs = [_queued(srv, who, i)[0] for i, who in enumerate(["alice", "bob", "carol"])]
    t = srv.clock()
    with srv.sessions() as s:
        for j in jobs:
            service.claim(s, "r1", t, job_id=j, lease_s=10)
    barrier = threading.Barrier(6)

    def reaper(_):
        with srv.sessions() as s:
            barrier.wait()
            return service.reap(s, t + 11)

    with ThreadPoolExecutor(6) as pool:
        reported = [j for back in pool.map(reaper, range(6)) for j in back]
    assert sorted(reported) == sorted(jobs)  # each expiry put back (and republished) once
    with srv.sessions() as s:
        assert {(j.state, j.attempts) for j in s.query(Job)} == {("queued", 1)}


def test_one_job_loop_completes_a_record_and_fails_an_infrastructure_failure(monkeypatch):
    """``jobs.work``, the frame the embedded dispatcher and a pool worker both run: a
    record is completed with where it was graded, under a lease renewed while it grades
    (a renewal refused: the lease was lost, the record is sent anyway); an
    infrastructure failure is failed with why, never completed."""
    from harness.errors import InfraFailure
    from harness.records import GradeResult, Graded
    from harness.server import jobs

    class Fake:  # the server's side of the jobs, as the database or the runner API answers
        def __init__(self, lease_s):
            self.lease_s, self.calls = lease_s, []

        def renew(self, job_id):
            self.calls.append(("renew", job_id))
            return False

        def complete(self, job_id, outcome):
            self.calls.append(("complete", job_id, outcome.record.status, outcome.gpu_model))
            return True

        def fail(self, job_id, reason):
            self.calls.append(("fail", job_id, reason))
            return "queued"

    graded = Graded.of(GradeResult("07", "", 1, [], 0.0), lab_points=10.0)
    monkeypatch.setattr(jobs, "grade_job", lambda *a, **kw: (time.sleep(0.2), graded)[1])
    job = jobs.Claimed(7, "07", b"x = 1\n")
    fake = Fake(lease_s=0.04)
    done = jobs.work(fake, job, None, {"gpu_model": "h100"})
    assert done.graded is graded and done.stored is True and done.lease_lost
    assert fake.calls[0] == ("renew", 7) and fake.calls[-1] == ("complete", 7, "ok", "h100")

    def broken(*a, **kw):
        raise InfraFailure("the sandbox could not start")

    monkeypatch.setattr(jobs, "grade_job", broken)
    fake = Fake(lease_s=3600)
    done = jobs.work(fake, job, None, {"gpu_model": "cpu"})
    assert done.graded is None and done.state == "queued" and "the sandbox could not start" in done.failure
    assert fake.calls == [("fail", 7, done.failure)]


def test_complete_twice_stores_one_result(server):
    from harness.server import service
    from harness.server.db import Job, Result

    srv = server()
    job_id, _ = _queued(srv, "alice", 1)
    now = srv.clock()
    with srv.sessions() as s:
        service.claim(s, "r1", now, job_id=job_id)
        assert service.complete(s, job_id, "r1", record(), now + 1, srv.course) is True
        assert service.complete(s, job_id, "r1", record(score=0.0), now + 2, srv.course) is False
        assert service.complete(s, job_id, "r2", record(score=0.0), now + 2, srv.course) is False
        res = s.query(Result).one()
        assert res.score == 8.5 and res.runner == "r1" and s.get(Job, job_id).state == "done"
    # over HTTP: the runner API is idempotent too
    job2, _ = _queued(srv, "bob", 2)
    claimed = srv.client.post("/api/runner/jobs/next", headers=srv.h("r1"))
    assert claimed.status_code == 200 and claimed.json()["job_id"] == job2 and claimed.json()["student"] == "bob"
    assert srv.client.post("/api/runner/jobs/next", headers=srv.h("r2")).status_code == 204
    for stored in (True, False):
        r = srv.client.post(f"/api/runner/jobs/{job2}/complete", json=outcome(), headers=srv.h("r1"))
        assert r.json() == {"stored": stored}
    with srv.sessions() as s:
        assert s.query(Result).count() == 2


def test_only_the_lease_holder_of_a_running_job_completes_it(server):
    """A result from a runner that never claimed the job, for a queued job, or after its
    lease was reaped and the job given to another is dropped: no score for any job from
    anyone but the runner grading it now (over HTTP too)."""
    from harness.server import service
    from harness.server.db import Job, Result

    srv = server()
    job_id, _ = _queued(srv, "alice", 1)
    now = srv.clock()
    with srv.sessions() as s:
        assert service.complete(s, job_id, "r1", record(score=10.0), now, srv.course) is False  # queued: no holder
        service.claim(s, "r1", now, job_id=job_id, lease_s=10)
        assert service.complete(s, job_id, "r2", record(score=10.0), now + 1, srv.course) is False  # not r2's
        assert service.reap(s, now + 11) == [job_id]
        service.claim(s, "r2", now + 12, job_id=job_id, lease_s=10)
        assert service.complete(s, job_id, "r1", record(score=10.0), now + 13, srv.course) is False  # r1 reaped
        assert s.query(Result).count() == 0 and s.get(Job, job_id, populate_existing=True).state == "running"
    r = srv.client.post(f"/api/runner/jobs/{job_id}/complete", json=outcome(score=10.0), headers=srv.h("r1"))
    assert r.json() == {"stored": False}
    with srv.sessions() as s:
        assert service.complete(s, job_id, "r2", record(), now + 14, srv.course) is True
        assert s.query(Result).one().runner == "r2"


def test_concurrent_completes_of_one_job_store_one_result(server):
    from harness.server import service
    from harness.server.db import Result

    srv = server()
    jobs = [_queued(srv, who, i)[0] for i, who in enumerate(["alice", "bob", "carol"])]
    now = srv.clock()
    with srv.sessions() as s:
        for j in jobs:
            service.claim(s, "r1", now, job_id=j)

    def deliver(job_id, barrier, k):
        with srv.sessions() as s:
            barrier.wait()
            return service.complete(s, job_id, "r1", record(score=float(k)), now + 1, srv.course)

    for j in jobs:
        barrier = threading.Barrier(4)
        with ThreadPoolExecutor(4) as pool:
            stored = list(pool.map(lambda k: deliver(j, barrier, k), range(4)))
        assert stored.count(True) == 1, stored
    with srv.sessions() as s:
        assert sorted(r.job_id for r in s.query(Result)) == sorted(jobs)


def test_interactive_jobs_go_before_regrades_with_position_and_eta(server):
    from harness.server import service

    srv = server()
    first, sub = _queued(srv, "alice", 1)
    now = srv.clock()
    with srv.sessions() as s:
        service.claim(s, "r1", now, job_id=first)
        service.complete(s, first, "r1", record(duration_s=4.0), now + 4, srv.course)
    srv.clock.advance(10)
    r = srv.client.post("/api/staff/regrade", data={"lab": "07"}, headers=srv.h("ta"))
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1
    regrade_job = r.json()["jobs"][0]
    srv.clock.advance(10)
    bob = srv.submit("bob", srv.blob(variant(2))).json()  # after the regrade, ahead of it
    assert bob["position"] == 1 and bob["eta_s"] == 4.0
    alice = srv.client.get(f"/api/submissions/{sub}", headers=srv.h("alice")).json()
    assert alice["queue"] == "regrade" and alice["position"] == 2 and alice["eta_s"] == 8.0
    assert alice["result"]["score"] == 8.5  # the earlier result stays visible while regraded
    with srv.sessions() as s:
        assert service.claim(s, "r1", srv.clock()).submission_id == bob["id"]
        assert service.claim(s, "r2", srv.clock()).id == regrade_job
    bob = srv.client.get(f"/api/submissions/{bob['id']}", headers=srv.h("bob")).json()
    assert bob["state"] == "running" and bob["position"] is None and bob["eta_s"] == 4.0


def test_staff_marking_a_run_invalid_needs_a_reason(server):
    from harness.server import service

    srv = server()
    job_id, _ = _queued(srv, "alice", 1)
    with srv.sessions() as s:
        service.claim(s, "r1", srv.clock(), job_id=job_id)
        service.complete(s, job_id, "r1", record(), srv.clock(), srv.course)
    r = srv.client.post("/api/staff/results/1/invalid", json={"reason": "  "}, headers=srv.h("ta"))
    assert r.status_code == 422 and r.json()["detail"] == "a reason is required to mark a run invalid"
    r = srv.client.post("/api/staff/results/999/invalid", json={"reason": "x"}, headers=srv.h("ta"))
    assert r.status_code == 404 and r.json()["detail"] == "no result 999"


def test_hidden_tests_are_shown_to_students_only_as_the_policy_says(server):
    from harness.server import service

    now = datetime.now(timezone.utc)
    srv = server()
    job_id, sub_id = _queued(srv, "alice", 1)
    with srv.sessions() as s:
        service.claim(s, "r1", srv.clock(), job_id=job_id)
        service.complete(s, job_id, "r1", record(), srv.clock(), srv.course)
    cases = [("after_deadline", now + timedelta(days=1), False), ("after_deadline", now - timedelta(hours=1), True),
             ("after_deadline", None, False), ("always", now + timedelta(days=1), True),
             ("never", now - timedelta(days=30), False)]
    for policy, deadline, shown in cases:
        srv = server(submissions={"hidden_results": policy}, deadline=deadline)
        student = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("alice")).json()["result"]
        staff = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("ta")).json()["result"]
        assert ("tests" in student) is shown, (policy, deadline)
        assert student["score"] == 8.5 and student["parts"] == {"A": 8.5}  # the score and parts always
        assert staff["tests"][0]["name"] == "A: test_adds"


# --- end to end: real grading of toy submissions -------------------------------------------

def test_graded_end_to_end_scores_leaderboard_invalid_runs_and_hidden_tests(server):
    from harness.server import runner, service
    from harness.server.db import Result

    deadline = datetime.now(timezone.utc) + timedelta(days=1)
    srv = server(deadline=deadline, submissions={"late": {"max_days": 2, "penalty_per_day": 0.25},
                                                 "hidden_results": "after_deadline"})
    subs = {}
    broken = "import no_such_module_7f3a\n" + TOY_SOLUTION
    for who, text in [("alice", variant(1, ratio=1.5)), ("carol", SOLUTION), ("bob", TOY_STUB), ("dave", broken)]:
        r = srv.submit(who, srv.blob(text))
        assert r.status_code == 201, r.text
        subs[who] = r.json()["id"]
    # two embedded runners drain the queue side by side: each job graded once
    dispatchers = [runner.Dispatcher(srv.url, srv.course, owner) for owner in ("host-gpu0", "host-gpu1")]

    def drain(d):
        n = 0
        while d.once():
            n += 1
        return n

    with ThreadPoolExecutor(2) as pool:
        assert sum(pool.map(drain, dispatchers)) == 4
    dispatcher = dispatchers[0]
    assert dispatcher.once() is False  # the queue is empty

    def view(sub_id, who):
        r = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h(who))
        assert r.status_code == 200, r.text
        return r.json()

    carol = view(subs["carol"], "carol")
    assert carol["state"] == "done" and carol["late_days"] == 0
    res = carol["result"]
    assert res["kind"] == "ok" and res["score"] == res["max_score_runnable"] == res["max_score"] == 10
    assert res["perf_ratio"] == 1.0 and res["parts"] == {"A": 6.0, "B": 4.0}
    bob = view(subs["bob"], "bob")["result"]  # the stub: graded normally, every test failed
    assert (bob["score"], bob["kind"], bob["status"], bob["perf_ratio"]) == (0, "ok", "ok", None)
    assert bob["parts"] == {"A": 0.0, "B": 0.0}
    dave = view(subs["dave"], "dave")["result"]  # a module that cannot load: the status says why
    assert dave["score"] == 0 and dave["kind"] == "student_error"
    assert dave["status"].startswith("import error:") and "no_such_module_7f3a" in dave["status"]
    alice = view(subs["alice"], "alice")["result"]
    assert alice["perf_ratio"] == 1.5 and 6 < alice["score"] < 10
    # before the deadline, after_deadline: students see the score and parts, not the hidden tests
    assert not any("tests" in r for r in (carol["result"], alice, bob, dave))
    staff_view = view(subs["carol"], "ta")["result"]
    assert [t["name"] for t in staff_view["tests"]] == ["A: test_adds", "A: test_default", "B: test_speed"]
    assert "B: test_speed" not in srv.client.get(f"/submissions/{subs['carol']}", headers=srv.h("carol")).text

    # a late, faster run of alice: accepted with a late day, graded, penalised
    srv.clock.advance(86400 + 3600)
    r = srv.submit("alice", srv.blob(variant(2, ratio=1.2)))
    assert r.status_code == 201 and r.json()["late_days"] == 1
    subs["alice-late"] = r.json()["id"]
    assert dispatcher.once() is True
    late = view(subs["alice-late"], "alice")
    assert late["late_days"] == 1 and late["result"]["late_days"] == 1
    with srv.sessions() as s:
        stored = s.query(Result).filter(Result.submission_id == subs["alice-late"]).one()
        extra = service.results_json(srv.course, stored)["extra_data"]  # the record's export
    assert extra["late_factor"] == 0.75 and 6 < extra["raw_score"] < 10
    assert stored.score == late["result"]["score"] == round(extra["raw_score"] * 0.75, 4)
    assert "tests" in late["result"]  # after the deadline the hidden tests are shown
    assert "A: test_adds" in srv.client.get(f"/submissions/{subs['alice-late']}", headers=srv.h("alice")).text

    # the leaderboard: one row per student, their best (lowest) median perf ratio; pseudonyms only
    r = srv.client.get("/api/leaderboard/07", headers=srv.h("bob"))
    board = r.json()
    assert [(row["rank"], row["perf_ratio"], row["submission"]) for row in board] == [
        (1, 1.0, subs["carol"]), (2, 1.2, subs["alice-late"])]
    assert all(row["student"] is None for row in board) and "alice" not in r.text and "carol" not in r.text
    staff_board = srv.client.get("/api/leaderboard/07", headers=srv.h("ta")).json()
    assert [row["student"] for row in staff_board] == ["carol", "alice"]

    # staff mark carol's run invalid: gone from the students' board, listed for staff with the reason
    carol_result = board[0]["result_id"]
    r = srv.client.post(f"/api/staff/results/{carol_result}/invalid", json={"reason": "timed the baseline"},
                        headers=srv.h("ta"))
    assert r.status_code == 200 and r.json() == {"ok": True}
    board = srv.client.get("/api/leaderboard/07", headers=srv.h("carol")).json()
    assert [(row["rank"], row["submission"]) for row in board] == [(1, subs["alice-late"])]
    staff_board = srv.client.get("/api/leaderboard/07", headers=srv.h("ta")).json()
    assert [(row["rank"], row["student"], row["invalid"]) for row in staff_board] == [
        (1, "alice", None), (None, "carol", "timed the baseline")]
    page = srv.client.get("/leaderboard/07", headers=srv.h("ta")).text
    assert "timed the baseline" in page
    assert "timed the baseline" not in srv.client.get("/leaderboard/07", headers=srv.h("carol")).text
    with srv.sessions() as s:
        assert s.query(Result).count() == 5  # never deleted
    # carol still sees her own result
    assert view(subs["carol"], "carol")["result"]["score"] == 10
    csv_rows = srv.client.get("/api/staff/grades.csv?lab=07", headers=srv.h("ta")).text.splitlines()
    assert [row.split(",")[0] for row in csv_rows] == ["student", "alice", "bob", "carol", "dave"]
    assert csv_rows[1].split(",")[6] == "1"  # alice's newest: late by a day
    assert srv.client.get("/api/staff/grades.csv?lab=7", headers=srv.h("ta")).text.splitlines() == csv_rows
    r = srv.client.get("/api/staff/grades.csv?lab=99", headers=srv.h("ta"))
    assert r.status_code == 404 and "no lab '99'" in r.json()["detail"]  # never an empty file


# --- a real server on loopback ---------------------------------------------------------------

@contextlib.contextmanager
def live(app):
    """``app`` served by uvicorn in a thread on a free loopback port; yields the port."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def test_oversized_or_unsized_upload_is_refused_before_its_body_is_read(toy_course, tmp_path):
    from harness.server import app as app_mod

    course = write_course(toy_course, {"max_kb": 1})
    app = app_mod.create_app(course, f"sqlite:///{tmp_path / 'cap.db'}", reap_every_s=3600)
    head = (b"POST /api/submissions HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=B\r\n")
    part = b'--B\r\nContent-Disposition: form-data; name="file"; filename="07.tar.gz"\r\n\r\n' + b"x" * 4096
    bridge = head.replace(b"/api/submissions", b"/api/bridge/submissions")
    runner = (b"POST /api/runner/jobs/1/complete HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    with live(app) as port:
        for start, header, chunk, status in [
                (head, b"Content-Length: 1000000000\r\n", b"", b"413"),
                (head, b"Transfer-Encoding: chunked\r\n", b"%x\r\n" % len(part), b"411"),
                (bridge, b"Content-Length: 1000000000\r\n", b"", b"413"),
                (runner, b"Content-Length: 1000000000\r\n", b"", b"413")]:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                # no token, and far less body than declared: answered at once, nothing read
                sock.sendall(start + header + b"\r\n" + chunk + part)
                answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 " + status), (start[:40], header, answer[:200])
        # a body that declares no length (chunked) or less than it sends is cut at the cap by the bytes
        # read, before any route (and its token check) sees it: 12 MiB of JSON or form, no token, answered 413
        big = b"x" * (1 << 20)
        form = [b"&t=" + b"x" * (512 << 10)] * 24  # fields under the form parser's own 1 MiB per field
        for start, header, body in [
                (runner, b"Transfer-Encoding: chunked\r\n", b"".join(b"%x\r\n%s\r\n" % (len(big), big)
                                                                       for _ in range(12)) + b"0\r\n\r\n"),
                (b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n",
                 b"Transfer-Encoding: chunked\r\n", b"".join(b"%x\r\n%s\r\n" % (len(f), f) for f in form) + b"0\r\n\r\n")]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                try:
                    sock.sendall(start + header + b"\r\n" + body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the server answered and closed before taking it all
                answer = sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 413"), (start[:40], answer[:200])


# --- load: a burst of submissions against a real server ---------------------------------------

def test_burst_of_submissions_over_loopback_is_201_or_429_never_5xx(toy_course, tmp_path):
    import httpx

    from harness.server import app as app_mod, service
    from harness.server.db import Job

    course = write_course(toy_course)  # default rate: burst 5
    url = f"sqlite:///{tmp_path / 'load.db'}"
    app = app_mod.create_app(course, url, reap_every_s=3600)
    students = [f"s{i:02d}" for i in range(20)]
    with app.state.sessions() as s:
        tokens = {n: service.add_account(s, n, "student", b"k", now=time.time()) for n in students}
    blobs = []
    for i in range(200):
        folder = tmp_path / "load" / str(i)
        folder.mkdir(parents=True)
        (folder / "toy.py").write_text(variant(i))
        blobs.append((students[i % 20], service.pack_module(folder / "toy.py", course.lab("07"))))

    with live(app) as port:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          limits=httpx.Limits(max_connections=20)) as client:
            def send(item):
                who, blob = item
                t0 = time.perf_counter()
                r = client.post("/api/submissions", data={"lab": "07"}, files={"file": ("07.tar.gz", blob)},
                                headers={"Authorization": f"Bearer {tokens[who]}"})
                return r.status_code, r.headers.get("Retry-After"), time.perf_counter() - t0

            t0 = time.perf_counter()
            with ThreadPoolExecutor(20) as pool:
                got = list(pool.map(send, blobs))
            wall = time.perf_counter() - t0
    codes = [c for c, _, _ in got]
    assert set(codes) <= {201, 429}, sorted(set(codes))
    assert codes.count(201) == 20 * 5  # each student's burst, no more (the test is far shorter than a refill)
    assert all(ra is not None and ra.isdigit() and int(ra) > 0 for c, ra, _ in got if c == 429)
    with app.state.sessions() as s:  # each student: the newest queued, the 4 before it cancelled
        assert s.query(Job).filter(Job.state == "queued").count() == 20
        assert s.query(Job).filter(Job.state == "cancelled").count() == 80
    accepted = sorted(dt for c, _, dt in got if c == 201)
    p50, p95 = statistics.median(accepted), accepted[int(0.95 * (len(accepted) - 1))]
    report = {"requests": len(got), "accepted": len(accepted), "rejected_429": codes.count(429),
              "wall_s": round(wall, 3), "accept_p50_ms": round(p50 * 1000, 1), "accept_p95_ms": round(p95 * 1000, 1)}
    (tmp_path / "load.json").write_text(json.dumps(report, indent=2))
    print(f"\nserver load: {json.dumps(report)} -> {tmp_path / 'load.json'}")
    assert wall < 30, report
