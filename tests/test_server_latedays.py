"""Issue 34.3: a course-wide late-day budget (`late_days: {budget: N}`) spent across
labs in lab order, per-student extensions (`labs extend`), the budget left on `/me`
(headless Chromium) and in `labs status`, and the exported grades applying it."""
from __future__ import annotations

import csv
import os
from datetime import datetime, timedelta, timezone

import pytest
import yaml

if not os.environ.get("CI"):
    pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from harness import manifest  # noqa: E402
from harness.cli import submit as submit_cli  # noqa: E402
from harness.server import app as app_mod, latedays, service  # noqa: E402
from tests.conftest import TOY_SOLUTION, TOY_STUB, TOY_YAML  # noqa: E402
from tests.test_server_api import Clock, db_url, postgres, record  # noqa: E402,F401  (fixtures)
from tests.test_server_cli import labs  # noqa: E402
from tests.test_server_pages import Browser, self_contained  # noqa: E402

DAY = 86400.0


@pytest.fixture
def course_server(tmp_path, db_url):
    """Labs 07 and 08 (10 points each): 07 due 2 days minus an hour ago, 08 due 3 days
    minus an hour ago (a submission now is 2 and 3 started days late); a budget of 3
    late days, 10% off per charged day, late submissions accepted for 4 days."""
    root = tmp_path / "course"
    clock = Clock()
    data = yaml.safe_load(TOY_YAML)
    data["labs"]["08"] = {**data["labs"]["07"], "title": "Toy lab two"}
    for lab, days in (("07", 2), ("08", 3)):
        data["labs"][lab]["deadline"] = datetime.fromtimestamp(clock.t - days * DAY + 3600, timezone.utc).isoformat()
        for rel, text in ((f"labs/{lab}/toy.py", TOY_STUB), (f"solutions/{lab}/toy.py", TOY_SOLUTION)):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
    data["submissions"] = {"late": {"max_days": 4, "penalty_per_day": 0.1}}
    data["late_days"] = {"budget": 3}
    (root / "labs.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    course = manifest.load(root)
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=3600, clock=clock)
    client = TestClient(app)
    with app.state.sessions() as s:
        tokens = {n: service.add_account(s, n, "student", b"k", now=clock()) for n in ("alice", "bob", "carol")}
        tokens["ta"] = service.add_account(s, "ta", "staff", b"k", now=clock())

    def submit(who: str, lab: str, graded: bool = True):
        folder = tmp_path / "mods" / f"{who}{lab}{clock.t}"
        folder.mkdir(parents=True)
        (folder / "toy.py").write_text(TOY_SOLUTION + f"# {who} {lab} {clock.t}\n")
        r = client.post("/api/submissions", data={"lab": lab}, headers={"Authorization": f"Bearer {tokens[who]}"},
                        files={"file": ("m.tar.gz", service.pack_module(folder / "toy.py", course.lab(lab)))})
        if r.status_code == 201 and graded:
            with app.state.sessions() as s:
                job = service.claim(s, "r1", clock())
                assert service.complete(s, job.id, "r1", record(score=8.5), clock(), course)
        return r

    return root, course, url, app, client, tokens, submit, clock


def _export(root, url, lab, tmp_path) -> dict[str, str]:
    out = tmp_path / f"lab{lab}.csv"
    p = labs(root, "grades", "export", "--format", "csv", "--lab", lab, "--db", url, "--out", str(out))
    assert p.returncode == 0, p.stderr
    return {r["student"]: (r["score"], r["late_days"], r["charged_days"]) for r in csv.DictReader(out.open())}


def test_late_days_are_spent_across_labs_extended_and_exported(course_server, tmp_path):
    root, course, url, app, client, tokens, submit, clock = course_server
    for lab in ("07", "08"):
        assert submit("alice", lab).status_code == 201
    assert submit("bob", "08").status_code == 201
    # alice: lab 07's 2 days from the budget, lab 08's 3 days: 1 from what is left, 2 charged (8.5 x 0.8)
    assert _export(root, url, "07", tmp_path) == {"alice": ("8.5", "2", "0")}
    assert _export(root, url, "08", tmp_path) == {"alice": ("6.8", "3", "2"), "bob": ("8.5", "3", "0")}
    with app.state.sessions() as s:
        acc = service.authenticate(s, tokens["alice"])
        assert latedays.standing(s, course, acc).as_dict()["left"] == 0
    p = labs(root, "extend", "alice", "08", "--days", "3", "--reason", "illness", "--db", url)
    assert p.returncode == 0, p.stderr
    assert "alice: lab 08 deadline extended by 3 day(s); late days left: 1 of 3" in p.stdout
    assert _export(root, url, "08", tmp_path) == {"alice": ("8.5", "0", "0"), "bob": ("8.5", "3", "0")}
    staff_csv = client.get("/api/staff/grades.csv?lab=08", headers={"Authorization": f"Bearer {tokens['ta']}"})
    assert {r["student"]: r["score"] for r in csv.DictReader(staff_csv.text.splitlines())} == \
        {"alice": "8.5", "bob": "8.5"}  # the staff page's CSV applies the extension too
    # the extension also keeps lab 08 open longer for alice alone
    clock.advance(2 * DAY)  # lab 08 is 5 days past its deadline now: closed (max_days 4)
    assert submit("bob", "08", graded=False).status_code == 403
    r = submit("alice", "08", graded=False)
    assert r.status_code == 201 and r.json()["late_days"] == 2, r.text


def test_bad_extension_arguments_are_named(course_server):
    root, course, url, *_ = course_server
    p = labs(root, "extend", "alice", "08", "--days", "-1", "--db", url)
    assert p.returncode == 2 and "--days -1.0 must be between 0 and 365" in p.stderr, p.stderr
    p = labs(root, "extend", "zed", "08", "--days", "1", "--db", url)
    assert p.returncode == 2 and "no student account 'zed'" in p.stderr, p.stderr


def test_budget_left_on_me_and_in_labs_status(course_server, tmp_path, capsys):
    root, course, url, app, client, tokens, submit, clock = course_server
    sub = submit("alice", "07").json()
    view = client.get(f"/api/submissions/{sub['id']}", headers={"Authorization": f"Bearer {tokens['alice']}"}).json()
    assert view["late_budget"]["left"] == 1 and view["late_budget"]["spent"] == 2
    submit_cli._print(view)
    assert "late days: 1 of 3 left (2 spent)" in capsys.readouterr().out
    client.post("/login", data={"token": tokens["alice"]})
    r = client.get("/me")
    assert r.status_code == 200
    self_contained(r.text)
    page = tmp_path / "me.html"
    page.write_text(r.text, encoding="utf-8")
    dom = Browser(tmp_path / "chromium").dom(page.as_uri())
    assert "Late days: 1 of 3 left" in dom.text and "2 spent" in dom.text
    late = next(t for t in dom.tables if t[0][0] == "Lab" and "Days late" in t[0])
    assert late[1:] == [["07", "2", "0", "2", "0"]]
