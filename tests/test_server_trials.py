"""Issue 34.5: trial runs (`labs submit NN --trial`). A trial runs the lab's visible tests
and its performance tests (never the hidden correctness graders) on the runner,
after every queued submission, does not count as a submission, is refused past the
per-lab quota in labs.yaml, and shows each perf ratio beside its thresholds (API,
`labs submit --trial --wait`'s table, /me in headless Chromium)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time

import httpx
import pytest

if not os.environ.get("CI"):
    pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from harness import manifest  # noqa: E402
from harness.cli import submit as submit_cli  # noqa: E402
from harness.server import app as app_mod, db, runner, service  # noqa: E402
from tests.conftest import TOY_GRADER, TOY_SOLUTION  # noqa: E402
from tests.test_server_api import db_url, postgres  # noqa: E402,F401  (fixtures)
from tests.test_server_pages import Browser, self_contained  # noqa: E402
from tests.test_server_scenarios import LEASE_S, STUDENTS, Scenario, _submit, redis_url  # noqa: E402,F401

HIDDEN = "test_hidden_correctness_7d1e"


def test_a_trial_runs_visible_and_perf_tests_after_submissions_and_counts_for_nothing(toy_course, tmp_path,
                                                                                     monkeypatch, capsys, db_url):
    (toy_course / "graders/07/test_toy.py").write_text(
        TOY_GRADER + f'\n@pytest.mark.part("A")\ndef {HIDDEN}(impl):\n    assert impl.add(2) == 3\n')
    yaml_path = toy_course / "labs.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("labs:\n", "trials: {per_lab: 2}\nlabs:\n", 1))
    course = manifest.load(toy_course)
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=3600)
    client = TestClient(app)
    with app.state.sessions() as s:
        token = service.add_account(s, "alice", "student", b"k", now=service.clock())
    h = {"Authorization": f"Bearer {token}"}

    def upload(path: str, i: int):
        (tmp_path / f"m{i}").mkdir()
        (tmp_path / f"m{i}/toy.py").write_text(TOY_SOLUTION + f"# {i}\n")
        return client.post(path, data={"lab": "07"}, headers=h, files={
            "file": ("07.tar.gz", service.pack_module(tmp_path / f"m{i}/toy.py", course.lab("07")))})

    r = upload("/api/trials", 0)
    assert r.status_code == 201 and r.json()["state"] == "queued" and r.json()["quota_left"] == 1, r.text
    trial = r.json()["id"]
    assert upload("/api/submissions", 1).status_code == 201  # submitted after the trial: graded before it
    assert client.get(f"/api/trials/{trial}", headers=h).json()["ahead"] == 1
    slot = runner.Dispatcher(url, course, "runner-cpu-0")
    assert slot.once()
    assert client.get(f"/api/trials/{trial}", headers=h).json()["state"] == "queued"  # the submission went first
    assert slot.once()
    got = client.get(f"/api/trials/{trial}", headers=h).json()
    assert got["state"] == "done", got
    visible = {t["name"]: t["outcome"] for t in got["result"]["visible"]}
    assert visible == {"test_adds": "passed", "test_default": "passed", "test_on_gpu": "not_run",
                       "test_speed": "passed"}
    (perf,) = got["result"]["perf"]
    assert (perf["test"], perf["key"], perf["ratio"], perf["full_credit"], perf["zero_credit"], perf["credit"]) == \
        ("test_speed", "add_vs_torch", 2.0, 1.0, 3.0, 0.5)
    assert HIDDEN not in json.dumps(got)  # the hidden correctness graders never ran
    assert not slot.once()

    # not a submission: one graded submission, one result; the quota refuses a third trial
    assert len(client.get("/api/submissions", headers=h).json()) == 1
    with app.state.sessions() as s:
        assert s.scalar(select(func.count(db.Result.id))) == 1
    assert upload("/api/trials", 2).status_code == 201
    r = upload("/api/trials", 3)
    assert r.status_code == 429 and "your 2 trial run(s) of lab 07 are used" in r.json()["detail"], r.text

    monkeypatch.setenv("COLUMNS", "300")
    submit_cli.print_trial(got)
    out = capsys.readouterr().out
    assert "test_on_gpu" in out and "add_vs_torch" in out and "2.000" in out and "<= 1" in out and ">= 3" in out

    client.post("/login", data={"token": token})
    r = client.get("/me")
    self_contained(r.text)
    page = tmp_path / "me.html"
    page.write_text(r.text, encoding="utf-8")
    dom = Browser(tmp_path / "chromium").dom(page.as_uri())
    table = next(t for t in dom.tables if "Visible tests" in t[0])
    done = next(row for row in table[1:] if row[2] == "done")
    assert done[3] == "3 of 4 passed" and "add_vs_torch: 2 (1 / 3), credit 0.5 on cpu" in done[4], done


# --- pool mode: trials through the broker, after graded submissions ---------------------------

def _drain(redis_url: str, gpu_model: str, n: int) -> list[tuple[str, object]]:
    """Take ``n`` messages off the pool's queues as a worker does (queues in the sorted
    order, one at a time): ``(queue, the id it carries)``, in the order taken."""
    from celery import Celery

    from harness.server import pool

    app = pool.configure(Celery("t", set_as_current=False), redis_url, 60, gpu_model)
    got = []

    def on(body, message):
        got.append((message.delivery_info["routing_key"], body[0][0]))
        message.ack()

    with app.connection_for_read() as conn:
        with conn.Consumer(list(reversed(app.conf.task_queues)), callbacks=[on], accept=["json"]) as consumer:
            consumer.qos(prefetch_count=1)
            deadline = time.monotonic() + 20
            while len(got) < n and time.monotonic() < deadline:
                with contextlib.suppress(socket.timeout, TimeoutError):
                    conn.drain_events(timeout=1)
    return got


def test_pool_mode_trials_go_through_the_broker_after_graded_submissions(tmp_path, redis_url, monkeypatch):
    """`labs serve --runner pool` on a real Redis: a trial is published on the trial queue,
    which a worker takes after the interactive and regrade queues; the server hands it to
    a runner only when no graded job is queued (409, Retry-After); the pool's trial task
    runs it (visible and perf tests), it counts as no submission, and the quota holds."""
    from harness.server import pool

    sc = Scenario("pool", tmp_path, redis_url)
    try:
        sc.accounts()
        sc.serve()
        student = STUDENTS[0]
        h = {"Authorization": f"Bearer {sc.tokens[student]}"}

        def trial(i: int) -> httpx.Response:
            path = tmp_path / "trials" / str(i) / "toy.py"
            path.parent.mkdir(parents=True)
            path.write_text(TOY_SOLUTION + f"# trial {i}\n")
            return httpx.post(f"{sc.base}/api/trials", data={"lab": "01"}, headers=h, timeout=30,
                              files={"file": ("01.tar.gz", service.pack_module(path, sc.course.lab("01")))})

        r = trial(0)
        assert r.status_code == 201 and r.json()["state"] == "queued", r.text
        tid = r.json()["id"]
        job = _submit(sc, 1, 0, TOY_SOLUTION)  # submitted after the trial
        assert _drain(redis_url, "cpu-ci", 2) == [("interactive.cpu-ci", job), ("trial.cpu-ci", tid)]

        runner_h = {"Authorization": f"Bearer {sc.runner_token}"}
        held = httpx.post(f"{sc.base}/api/runner/trials/{tid}/claim", headers=runner_h, timeout=30)
        assert held.status_code == 409 and held.headers["retry-after"] == "5", held.text  # the submission first

        monkeypatch.setattr(pool, "SETTINGS", {"server": sc.base, "token": sc.runner_token,
                                               "course": str(sc.course.root), "lease_s": LEASE_S,
                                               "sandbox": "process"})
        monkeypatch.setattr(pool._Host, "pid", None)
        assert pool.grade.apply(args=[job]).get() == f"job {job}: stored"
        assert pool.trial.apply(args=[tid]).get() == f"trial {tid}: done"
        assert pool.trial.apply(args=[tid]).get() == f"trial {tid}: not queued"  # a second delivery: quiet

        got = httpx.get(f"{sc.base}/api/trials/{tid}", headers=h, timeout=30).json()
        assert got["state"] == "done" and got["quota_left"] == 2, got
        (perf,) = got["result"]["perf"]
        assert (perf["test"], perf["key"], perf["ratio"]) == ("test_speed", "add_vs_torch", 2.0), perf
        assert httpx.get(f"{sc.base}/api/submissions", headers=h, timeout=30).json() == []  # never a submission
        with sc.sessions() as s:
            assert s.scalar(select(func.count(db.Result.id))) == 1  # the graded submission's alone
        assert trial(1).status_code == 201 and trial(2).status_code == 201
        r = trial(3)
        assert r.status_code == 429 and "your 3 trial run(s) of lab 01 are used" in r.json()["detail"], r.text
    except BaseException:
        sc.procs.dump()
        raise
    finally:
        sc.procs.kill_all()
