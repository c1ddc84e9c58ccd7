"""A course server and class grading that hold a real class (issue 33): a server or
runner never grades on a device it does not have and a CPU-only grade says which GPU
points are still to come; a roster import is all or nothing and a lost token can be
re-issued; the student reads the course's actual policy; ids are whole and a unique
prefix is enough; staff drill into a lab; the progress plots show what a run measured."""
from __future__ import annotations

import html
import json
import time

import pytest
from click.testing import CliRunner

from harness.cli import main
from tests.conftest import TOY_SOLUTION
from tests.test_server_api import (  # noqa: F401  (fixtures)
    _queued, db_url, outcome, postgres, record, server, variant,
)

pytest.importorskip("fastapi")


def labs(course, *args, env=None, input=None):
    return CliRunner().invoke(main, ["--course", str(course), *args], env=env, input=input,
                              catch_exceptions=False)


def _error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.strip()]


# --- 1. no grading on a device that is not there; CPU-only GPU points are "not run yet" ----------

@pytest.mark.parametrize("count", [0, 1])
def test_serve_and_runner_refuse_a_gpu_that_is_not_there(toy_course, tmp_path, monkeypatch, count):
    import torch
    import uvicorn
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self: pytest.fail("it started serving"))
    db = f"sqlite:///{tmp_path / 's.db'}"
    r = labs(toy_course, "serve", "--db", db, "--runner", "local", "--gpus", "0,1" if count else "0")
    missing = "1" if count else "0"
    assert r.exit_code == 2, r.output
    (line,) = _error_lines(r.output)
    assert f"no GPU {missing} " in line and f"torch.cuda.device_count() is {count}" in line, line
    r = labs(toy_course, "runner", "--broker", "redis://127.0.0.1:1/0", "--server", "http://127.0.0.1:1",
             "--gpus", "0,1" if count else "0", env={"LABS_RUNNER_TOKEN": "t" * 20})
    assert r.exit_code == 2, r.output
    (line,) = _error_lines(r.output)
    assert f"no GPU {missing} " in line and f"torch.cuda.device_count() is {count}" in line, line


def _graded_with_gpu_test_skipped():
    """A grade whose GPU test was skipped for want of any CUDA device, beside one skipped
    because the host has too few GPUs (which alone is no infrastructure failure)."""
    from harness.plugin import GPU_SKIP_REASON
    from harness.records import GradeResult, Graded, TestResult
    tests = [TestResult("test_adds", "g::test_adds", "A", 4.0, 4.0, "passed"),
             TestResult("test_on_gpu", "g::test_on_gpu", "A", 2.0, 0.0, "skipped", f"skipped: {GPU_SKIP_REASON}",
                        tags=["skipped", "gpu"]),
             TestResult("test_on_4_gpus", "g::test_on_4_gpus", "A", 2.0, 0.0, "skipped",
                        "skipped: needs 4 GPUs, this host has 1", tags=["skipped", "gpu"])]
    return Graded.of(GradeResult("07", "", 1, tests, 1.0), lab_points=10.0)


def test_a_gpu_runner_whose_gpu_disappeared_fails_the_job_never_scores_it(monkeypatch):
    from harness.server import jobs

    class Fake:
        lease_s = 3600

        def __init__(self):
            self.calls = []

        def renew(self, job_id):
            return True

        def complete(self, job_id, outcome):
            self.calls.append("complete")
            return True

        def fail(self, job_id, reason):
            self.calls.append(("fail", reason))
            return "queued"

    monkeypatch.setattr(jobs, "grade_job", lambda *a, **kw: _graded_with_gpu_test_skipped())
    fake = Fake()
    done = jobs.work(fake, jobs.Claimed(1, "07", b""), None, {"gpu_model": "NVIDIA H100", "host": "h1"})
    assert done.graded is None and fake.calls == [("fail", done.failure)]
    assert "disappeared" in done.failure and "1 GPU test(s)" in done.failure
    fake = Fake()  # a CPU-only runner stores it: the GPU points are "not run yet", not a failure
    done = jobs.work(fake, jobs.Claimed(1, "07", b""), None, {"gpu_model": "cpu"})
    assert fake.calls == ["complete"]


def test_a_cpu_only_grade_shows_the_gpu_points_as_not_run_yet(server, monkeypatch, capsys):
    from harness.cli import submit
    from harness.server import service

    srv = server()
    job_id, sub_id = _queued(srv, "alice", 1)
    with srv.sessions() as s:
        service.claim(s, "r1", srv.clock(), job_id=job_id)
        service.complete(s, job_id, "r1", service.Outcome(_graded_with_gpu_test_skipped(), {}, "cpu"), srv.clock(),
                         srv.course)
    view = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("alice")).json()
    assert view["result"]["not_run_points"] == 4.0 and view["result"]["score"] == 4.0  # both GPU tests
    submit._print(view)
    out = capsys.readouterr().out
    assert "GPU tests not run yet: 4 points" in out
    page = srv.client.get(f"/submissions/{sub_id}", headers=srv.h("alice")).text
    assert "GPU tests not run yet: 4 points" in page


# --- 2. the roster: all or nothing, Excel's CSV, new tokens, a pasted token -----------------------

def test_roster_import_is_all_or_nothing_reads_excel_csv_and_tokens_are_reissued(toy_course, tmp_path):
    from harness.server import db as _db, service

    url = f"sqlite:///{tmp_path / 's.db'}"
    bad = tmp_path / "bad.csv"
    bad.write_text("name,email,role\nann,ann@x.org,student\nben,ben@x.org,student\n,nobody@x.org,student\n")
    r = labs(toy_course, "roster", "import", str(bad), "--db", url, "--tokens", str(tmp_path / "t0.csv"))
    assert r.exit_code == 2 and "row 4" in r.output and "no name" in r.output, r.output
    bad.write_text("name,role\nann,student\nben,teacher\n")
    r = labs(toy_course, "roster", "import", str(bad), "--db", url, "--tokens", str(tmp_path / "t0.csv"))
    assert r.exit_code == 2 and "row 3" in r.output and "'teacher'" in r.output, r.output
    sessions = _db.sessions(url)
    with sessions() as s:
        assert s.query(_db.Account).count() == 0  # nothing was written
    assert not (tmp_path / "t0.csv").exists()
    good = tmp_path / "excel.csv"  # what Excel writes: a BOM and CRLF line ends
    good.write_bytes("\ufeffname,email,role\r\nann,ann@x.org,student\r\nbén,ben@x.org,student\r\n".encode())
    r = labs(toy_course, "roster", "import", str(good), "--db", url, "--tokens", str(tmp_path / "t1.csv"))
    assert r.exit_code == 0 and "2 new account(s)" in r.output, r.output
    tokens = dict(line.split(",") for line in (tmp_path / "t1.csv").read_text().split()[1:])
    assert set(tokens) == {"ann", "bén"}
    r = labs(toy_course, "account", "token", "ann", "--db", url)
    assert r.exit_code == 0
    new = r.output.strip()
    with sessions() as s:
        assert service.authenticate(s, new).name == "ann"
        with pytest.raises(service.Rejected):
            service.authenticate(s, tokens["ann"])  # the old one stops working
    r = labs(toy_course, "account", "token", "zed", "--db", url)
    assert r.exit_code == 2 and "no account 'zed'" in r.output
    r = labs(toy_course, "account", "add", "gradescope", "--role", "bridge", "--db", url)
    assert r.exit_code == 0, r.output


def test_login_strips_a_pasted_token_and_never_prints_it(monkeypatch, tmp_path):
    from harness.cli import submit

    seen = []
    monkeypatch.setattr(submit, "CONFIG", tmp_path / "server.json")
    monkeypatch.setattr(submit, "_request", lambda m, server, token, path, **kw: seen.append((server, token)))
    token = "abcDEF123_-xyz" * 3
    r = CliRunner().invoke(main, ["login", "--server", "http://h:8000/ ", "--token", f"  {token}\r\n"])
    assert r.exit_code == 0, r.output
    assert seen == [("http://h:8000", token)] and token not in r.output
    assert json.loads((tmp_path / "server.json").read_text()) == {"server": "http://h:8000", "token": token}


# --- 4. the policy, in one line ---------------------------------------------------------------

def test_the_student_reads_the_courses_actual_policy(server, capsys):
    from datetime import datetime, timedelta, timezone

    from harness.cli import submit
    from harness.server import service

    srv = server()
    job_id, sub_id = _queued(srv, "alice", 1)
    with srv.sessions() as s:
        service.claim(s, "r1", srv.clock(), job_id=job_id)
        service.complete(s, job_id, "r1", record(score=4.0), srv.clock(), srv.course)
    soon = datetime.now(timezone.utc) + timedelta(days=1)
    for policy, deadline, says in [("after_deadline", None, "has none set yet"),
                                   ("after_deadline", soon, f"after lab 07's deadline, {soon.isoformat()}"),
                                   ("never", None, "never shown in this course")]:
        srv = server(submissions={"hidden_results": policy}, deadline=deadline)
        view = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("alice")).json()
        assert "tests" not in view["result"] and says in view["policy"], view["policy"]
        submit._print(view)
        out = capsys.readouterr().out
        assert says in " ".join(out.split()) and "or never" not in out
        page = srv.client.get(f"/submissions/{sub_id}", headers=srv.h("alice")).text
        assert says in html.unescape(page)
    srv = server(submissions={"hidden_results": "always"})
    view = srv.client.get(f"/api/submissions/{sub_id}", headers=srv.h("alice")).json()
    (t,) = view["result"]["tests"]
    assert t["name"] == "A: test_adds" and t["status"] == "failed"
    submit._print(view)
    assert "A: test_adds" in capsys.readouterr().out


# --- 5. whole ids, a unique prefix, a sign-in error, the staff drill-down ------------------------

def test_a_unique_prefix_names_a_submission_and_ids_are_printed_whole(server, monkeypatch):
    from harness.cli import submit

    srv = server()
    ids = [_queued(srv, "alice", i)[1] for i in range(3)]
    for sub_id in ids:
        r = srv.client.get(f"/api/submissions/{sub_id[:8]}", headers=srv.h("alice"))
        assert r.status_code == 200 and r.json()["id"] == sub_id
    r = srv.client.get(f"/api/submissions/{ids[0][:8]}", headers=srv.h("bob"))
    assert r.status_code == 404  # another's id, whole or a prefix: 404
    r = srv.client.get(f"/submissions/{ids[0][:8]}", headers=srv.h("alice"))
    assert r.status_code == 200 and ids[0] in r.text
    views = srv.client.get("/api/submissions", headers=srv.h("alice")).json()

    class R:
        def json(self):
            return views

    monkeypatch.setattr(submit, "_request", lambda *a, **kw: R())
    r = CliRunner().invoke(main, ["status", "--server", "http://h", "--token", "t"], terminal_width=80)
    assert r.exit_code == 0, r.output
    for sub_id in ids:
        assert sub_id in r.output, r.output


def test_an_ambiguous_prefix_is_409(server, monkeypatch):
    from harness.server import service

    n = iter(range(1, 100))
    monkeypatch.setattr(service.secrets, "token_hex", lambda size: f"abcdef{next(n):02d}".ljust(2 * size, "0"))
    srv = server()
    a, b = _queued(srv, "alice", 1)[1], _queued(srv, "alice", 2)[1]
    r = srv.client.get("/api/submissions/abcdef", headers=srv.h("alice"))
    assert r.status_code == 409 and "more than one" in r.json()["detail"]
    assert a[:6] == b[:6] == "abcdef"
    assert srv.client.get(f"/api/submissions/{b[:8]}", headers=srv.h("alice")).json()["id"] == b


def test_sign_in_with_a_wrong_token_shows_the_error(server):
    srv = server()
    r = srv.client.post("/login", data={"token": "not-a-token"}, follow_redirects=False)
    assert r.status_code == 401 and "not valid" in r.text and 'name="token"' in r.text
    assert "labs_token" not in r.cookies
    r = srv.client.post("/login", data={"token": f" {srv.tokens['alice']}\n"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/me"  # a pasted token, stripped


def test_staff_drill_into_a_lab_each_students_newest_result(server):
    from harness.server import service

    srv = server()
    old = _queued(srv, "alice", 1)
    new = _queued(srv, "alice", 2, now=srv.clock() + 5)
    bob = _queued(srv, "bob", 3)
    with srv.sessions() as s:
        service.claim(s, "r1", srv.clock(), job_id=bob[0])
        service.complete(s, bob[0], "r1", record(score=4.0), srv.clock(), srv.course)
    r = srv.client.get("/staff/labs/07", headers=srv.h("ta"))
    assert r.status_code == 200
    assert new[1] in r.text and old[1] not in r.text and bob[1] in r.text
    assert "alice" in r.text and "bob" in r.text and "4 / 8.5" in r.text
    assert srv.client.get("/staff/labs/07", headers=srv.h("alice")).status_code == 403
    assert srv.client.get("/staff/labs/99", headers=srv.h("ta")).status_code == 404
    assert 'href="/staff/labs/07"' in srv.client.get("/staff", headers=srv.h("ta")).text


# --- 6. a lab with no timed test has no leaderboard ----------------------------------------------

def test_a_lab_without_a_timed_test_says_it_has_no_leaderboard(server):
    from harness.server import pages

    srv = server()
    lab = srv.course.lab("07").model_copy(update={"perf": {}})
    page = pages.leaderboard(srv.course, lab, [], staff=False)
    assert "has no timed test: it has no leaderboard" in page and "No graded runs" not in page
    assert "No graded runs with performance figures yet" in pages.leaderboard(srv.course, srv.course.lab("07"), [],
                                                                               staff=False)
