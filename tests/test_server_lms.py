"""Issue 34.1a: `labs grades export --format canvas|moodle|csv --lab NN` writes the file
each LMS imports, from the course server's newest grades (the late penalty applied) or
from a `labs grade-all` folder; each test parses the written file back."""
from __future__ import annotations

import csv
import os
from datetime import datetime, timedelta, timezone

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from harness.server import app as app_mod, service  # noqa: E402
from tests.conftest import TOY_SOLUTION  # noqa: E402
from tests.test_server_api import Clock, db_url, postgres, record, write_course  # noqa: E402,F401  (fixtures)
from tests.test_server_cli import labs  # noqa: E402

DAY = 86400.0


@pytest.fixture
def graded(toy_course, tmp_path, db_url):
    """Lab 07 (10 points) due now - 2 days, 10% off per late day: bob graded on time,
    alice (with an e-mail) 2 started days late, carol graded twice (the newest counts),
    dave submitted but not graded. Each graded run scores 8.5 before the penalty."""
    clock = Clock(datetime.now(timezone.utc).timestamp() - 3 * DAY)
    deadline = datetime.fromtimestamp(clock.t + DAY, timezone.utc)
    course = write_course(toy_course, {"late": {"grace_minutes": 0, "max_days": 5, "penalty_per_day": 0.1}},
                          deadline)
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=3600, clock=clock)
    client = TestClient(app)
    with app.state.sessions() as s:
        tokens = {n: service.add_account(s, n, "student", b"k", now=clock(), email=e)
                  for n, e in (("alice", "alice@uni.edu"), ("bob", ""), ("carol", ""), ("dave", ""))}
    mods = tmp_path / "mods"

    def submit(who: str, i: int, score: float | None = 8.5):
        folder = mods / f"{who}{i}"
        folder.mkdir(parents=True)
        (folder / "toy.py").write_text(TOY_SOLUTION + f"# {who} {i}\n")
        r = client.post("/api/submissions", data={"lab": "07"},
                        files={"file": ("07.tar.gz", service.pack_module(folder / "toy.py", course.lab("07")))},
                        headers={"Authorization": f"Bearer {tokens[who]}"})
        assert r.status_code == 201, r.text
        if score is not None:
            with app.state.sessions() as s:
                job = service.claim(s, "r1", clock())
                assert service.complete(s, job.id, "r1", record(score=score), clock(), course)

    submit("bob", 0)
    submit("carol", 0, score=2.0)
    clock.advance(0.5 * DAY)
    submit("carol", 1)
    clock.advance(2 * DAY)  # 1.5 days late: 2 started days
    submit("alice", 0)
    submit("dave", 0, score=None)
    return toy_course, url


def _rows(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_file_has_canvas_headers_points_row_and_penalised_scores(graded, tmp_path):
    root, url = graded
    out = tmp_path / "canvas.csv"
    p = labs(root, "grades", "export", "--format", "canvas", "--lab", "07", "--db", url, "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "3 grade(s) of lab 07 written for canvas" in p.stdout
    rows = _rows(out)
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Lab 07: Toy lab"]
    assert rows[1] == ["    Points Possible", "", "", "", "", "10"]
    assert rows[2:] == [["alice", "", "", "alice@uni.edu", "", "6.8"],  # 8.5 x (1 - 2 x 0.1)
                        ["bob", "", "", "bob", "", "8.5"], ["carol", "", "", "carol", "", "8.5"]]
    assert out.read_bytes().count(b"\r\n") == 5  # Canvas's own export's line ends


def test_moodle_and_plain_csv_files_and_an_assignment_name(graded, tmp_path):
    root, url = graded
    out = tmp_path / "moodle.csv"
    p = labs(root, "grades", "export", "--format", "moodle", "--lab", "07", "--db", url, "--out", str(out),
             "--assignment", "Lab 7")
    assert p.returncode == 0, p.stderr
    rows = _rows(out)
    assert rows[0] == ["First name", "Surname", "Username", "Email address", "Lab 7", "Feedback: Lab 7"]
    assert [r[:5] for r in rows[1:]] == [["alice", "", "alice", "alice@uni.edu", "6.8"],
                                         ["bob", "", "bob", "", "8.5"], ["carol", "", "carol", "", "8.5"]]
    out = tmp_path / "plain.csv"
    assert labs(root, "grades", "export", "--format", "csv", "--lab", "07", "--db", url, "--out",
                str(out)).returncode == 0
    plain = list(csv.DictReader(out.open()))
    assert [(r["student"], r["score"], r["late_days"]) for r in plain] == [("alice", "6.8", "2"), ("bob", "8.5", "0"),
                                                                         ("carol", "8.5", "0")]


def test_from_a_grade_all_folder_and_bad_arguments_are_named(toy_course, tmp_path):
    folder = tmp_path / "grades-lab07"
    folder.mkdir()
    (folder / "grades.csv").write_text("student,lab,score,max,max_runnable,status,part A,part B\n"
                                       "zoe,07,9.5,10,10,ok,6,3.5\nyan,07,,10,,infrastructure error,,\n")
    out = tmp_path / "c.csv"
    p = labs(toy_course, "grades", "export", "--format", "canvas", "--lab", "07", "--from", str(folder), "--out",
             str(out))
    assert p.returncode == 0, p.stderr
    assert _rows(out)[2:] == [["yan", "", "", "yan", "", ""], ["zoe", "", "", "zoe", "", "9.5"]]  # blank: unchanged
    p = labs(toy_course, "grades", "export", "--format", "blackboard", "--lab", "07", "--out", str(out))
    assert p.returncode == 2 and "--format 'blackboard' is not one of canvas, moodle, csv" in p.stderr, p.stderr
    p = labs(toy_course, "grades", "export", "--format", "csv", "--lab", "07", "--from", str(tmp_path), "--out",
             str(out))
    assert p.returncode == 2 and "no grades.csv there" in p.stderr, p.stderr
