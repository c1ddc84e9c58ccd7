"""Issue 34.4: regrade requests and every run kept. A student asks (API, then the
page's form is offered no more while one is open), staff answer on the page and
regrade after fixing the grader; the regrade is a new run graded for real by the
embedded dispatcher, the old result stays, and the student and staff see both (old
score, new score, why) on the pages (headless Chromium) and in `labs status`."""
from __future__ import annotations

import os

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from sqlalchemy import select  # noqa: E402

from harness import manifest  # noqa: E402
from harness.cli import submit as submit_cli  # noqa: E402
from harness.server import app as app_mod, db, runner, service  # noqa: E402
from tests.conftest import TOY_GRADER, TOY_SOLUTION  # noqa: E402
from tests.test_server_api import db_url, postgres  # noqa: E402,F401  (fixtures)
from tests.test_server_cli import labs  # noqa: E402
from tests.test_server_pages import Browser, Dom, self_contained  # noqa: E402

BUGGY = TOY_GRADER.replace("impl.add(3) == 4", "impl.add(3) == 5")  # a grader bug: a right answer fails
REASON = "test_default expects add(3) == 5, but 3 + 1 is 4"


def _page(client, path: str, folder, name: str) -> Dom:
    r = client.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text[:300])
    self_contained(r.text)
    f = folder / f"{name}.html"
    f.write_text(r.text, encoding="utf-8")
    return Browser(folder / "chromium").dom(f.as_uri())


def test_a_regrade_after_a_grader_change_keeps_both_results(toy_course, tmp_path, capsys, db_url):
    grader = toy_course / "graders/07/test_toy.py"
    grader.write_text(BUGGY)
    course = manifest.load(toy_course)
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=3600)
    student, staff = TestClient(app), TestClient(app)
    with app.state.sessions() as s:
        tokens = {n: service.add_account(s, n, role, b"k", now=service.clock())
                  for n, role in (("alice", "student"), ("bob", "student"), ("prof", "staff"))}
    h = {n: {"Authorization": f"Bearer {t}"} for n, t in tokens.items()}
    (tmp_path / "m").mkdir()
    (tmp_path / "m/toy.py").write_text(TOY_SOLUTION)
    r = student.post("/api/submissions", data={"lab": "07"}, headers=h["alice"],
                     files={"file": ("07.tar.gz", service.pack_module(tmp_path / "m/toy.py", course.lab("07")))})
    sub = r.json()["id"]
    ask = f"/api/submissions/{sub}/regrade-requests"
    assert student.post(ask, json={"reason": REASON}, headers=h["alice"]).status_code == 409  # not graded yet
    assert runner.Dispatcher(url, course, "runner-cpu-0").once()
    old = student.get(f"/api/submissions/{sub}", headers=h["alice"]).json()["result"]["score"]

    assert student.post(ask, json={"reason": "  "}, headers=h["alice"]).status_code == 422
    assert student.post(ask, json={"reason": REASON}, headers=h["bob"]).status_code == 404  # not bob's
    r = student.post(ask, json={"reason": REASON}, headers=h["alice"])
    assert r.status_code == 201 and r.json()["state"] == "open", r.text
    assert student.post(ask, json={"reason": "again"}, headers=h["alice"]).status_code == 409  # one open at a time
    assert staff.get("/api/staff/regrade-requests", headers=h["alice"]).status_code == 403
    queue = staff.get("/api/staff/regrade-requests", headers=h["prof"]).json()
    assert [(q["student"], q["reason"], q["state"]) for q in queue] == [("alice", REASON, "open")]

    grader.write_text(TOY_GRADER)  # staff fix the grader, answer on the page, and regrade
    staff.post("/login", data={"token": tokens["prof"]})
    dom = _page(staff, "/staff/regrades", tmp_path, "queue-open")
    assert [f.get("action") for f in dom.tags("form")] == [f"/staff/regrade-requests/{queue[0]['id']}"]
    r = staff.post(f"/staff/regrade-requests/{queue[0]['id']}", data={"answer": "right: the grader is fixed",
                                                                      "regrade": "1"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/staff/regrades"
    assert runner.Dispatcher(url, course, "runner-cpu-0").once()

    with app.state.sessions() as s:
        results = s.scalars(select(db.Result).where(db.Result.submission_id == sub).order_by(db.Result.id)).all()
        assert len(results) == 2 and results[0].score == old < results[1].score  # the old one is still there
    view = student.get(f"/api/submissions/{sub}", headers=h["alice"]).json()
    new = view["result"]["score"]
    assert [(x["score"], x["reason"]) for x in view["runs"]] == [
        (old, "graded on submission"), (new, f"regrade request {queue[0]['id']}: {REASON}")]
    assert view["regrade_requests"][0]["state"] == "regraded"
    submit_cli._print(view)
    out = capsys.readouterr().out
    assert "Every run" in out and f"regrade request {queue[0]['id']} (regraded)" in out

    student.post("/login", data={"token": tokens["alice"]})
    for who, client in (("alice", student), ("prof", staff)):
        dom = _page(client, f"/submissions/{sub}", tmp_path, f"sub-{who}")
        runs = next(t for t in dom.tables if t[0][:3] == ["Run", "Graded", "Score"])
        assert [(r[0], r[2], r[4]) for r in runs[1:]] == [
            ("1", f"{old:g} / 10", "graded on submission"),
            ("2", f"{new:g} / 10", f"regrade request {queue[0]['id']}: {REASON}")], runs
        assert "right: the grader is fixed" in dom.text
        asks = [f.get("action") for f in dom.tags("form")]  # only the student may ask again (none is open)
        assert asks == ([f"/submissions/{sub}/regrade-request"] if who == "alice" else []), asks
    dom = _page(staff, "/staff/regrades", tmp_path, "queue-answered")
    assert not dom.tags("form") and "regraded" in dom.text

    # `labs regrade` after a grader change keeps its reason with the new run too
    p = labs(toy_course, "regrade", "--lab", "07", "--reason", "grader v3", "--db", url)
    assert p.returncode == 0 and "1 regrade job(s) queued" in p.stdout, p.stderr
    with app.state.sessions() as s:
        assert s.scalars(select(db.Job.reason).where(db.Job.submission_id == sub)).all()[-1] == "grader v3"
    p = labs(toy_course, "regrade-requests", "--all", "--db", url)
    assert p.returncode == 0 and "regraded" in p.stdout and "alice" in p.stdout, p.stdout
    p = labs(toy_course, "regrade-answer", "99", "--answer", "x", "--db", url)
    assert p.returncode == 2 and "no regrade request 99" in p.stderr, p.stderr
