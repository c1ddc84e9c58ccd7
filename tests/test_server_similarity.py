"""Issue 34.2: the similarity report (`labs similarity`, `/staff/labs/NN/similarity`) on a
planted class of lab 03 (tests/similarity_class: three independent real solutions, each
passing lab 03's graders, and bob, alice's module with every name renamed and a comment
added). The copy must rank first and be flagged; no pair of independent solutions may
reach the threshold; the stub and the handout's snippets never count."""
from __future__ import annotations

import csv
import os
import shutil
import zipfile
from pathlib import Path

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("copydetect")
from fastapi.testclient import TestClient  # noqa: E402

from harness import manifest  # noqa: E402
from harness.server import app as server_app, db, service, similarity  # noqa: E402
from tests.test_server_cli import labs  # noqa: E402
from tests.test_server_pages import Browser, self_contained  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLASS = Path(__file__).with_name("similarity_class")
HONEST = ("alice", "carol", "dave")


@pytest.fixture
def planted(tmp_path) -> Path:
    """grade-all's layout: alice, carol and dave as checkouts, bob's copy as a zip."""
    root = tmp_path / "submissions"
    for who in HONEST:
        (root / who / "labs/03").mkdir(parents=True)
        shutil.copy(CLASS / f"{who}.py", root / who / "labs/03/gqa.py")
    with zipfile.ZipFile(root / "bob.zip", "w") as z:
        z.write(CLASS / "bob.py", "03/gqa.py")
    return root


def test_the_renamed_copy_ranks_first_and_independent_solutions_stay_below_the_threshold(planted, tmp_path):
    out = tmp_path / "report"
    p = labs(ROOT, "similarity", str(planted), "--lab", "03", "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "4 module(s) of lab 03, 6 pair(s), 1 at or over 0.5" in p.stdout, p.stdout
    rows = list(csv.DictReader((out / "similarity.csv").open()))
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4", "5", "6"]
    assert {rows[0]["student_a"], rows[0]["student_b"]} == {"alice", "bob"} and rows[0]["flagged"] == "yes"
    assert float(rows[0]["score"]) > 0.9, rows[0]
    scores = [float(r["score"]) for r in rows]
    assert scores == sorted(scores, reverse=True)
    honest = [r for r in rows if {r["student_a"], r["student_b"]} <= set(HONEST)]
    assert len(honest) == 3 and all(float(r["score"]) < 0.5 and r["flagged"] == "no" for r in honest), honest
    html = (out / "similarity.html").read_text()
    self_contained(html)
    assert html.count("<mark>") > 10 and 'id="pair-1"' in html


def test_the_stub_and_the_handout_snippets_are_boilerplate_that_never_counts():
    course = manifest.load(ROOT)
    lab = course.lab("03")
    boiler = similarity.boilerplate(course, lab)
    stub = (ROOT / "labs/03/gqa.py").read_text()
    assert boiler[0] == stub and len(boiler) > 1  # the stub, then the handout's fenced snippets
    handed_in = {"x": stub, "y": stub + "\n# nothing done yet\n"}
    assert similarity.compare(handed_in, [], lab).pairs[0].score > 0.9  # without boilerplate: a "copy"
    assert similarity.compare(handed_in, boiler, lab).pairs[0].score == 0.0
    snippet = boiler[1] if len(boiler[1]) > 200 else max(boiler[1:], key=len)
    two = {"x": (CLASS / "carol.py").read_text() + snippet, "y": (CLASS / "dave.py").read_text() + snippet}
    base = similarity.compare({k: (CLASS / f"{n}.py").read_text() for k, n in (("x", "carol"), ("y", "dave"))},
                              boiler, lab).pairs[0]
    assert similarity.compare(two, boiler, lab).pairs[0].tokens == base.tokens  # the shared snippet adds nothing


def test_a_bad_threshold_or_folder_is_named(planted, tmp_path):
    p = labs(ROOT, "similarity", str(planted), "--lab", "03", "--threshold", "1.5", "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "--threshold 1.5" in p.stderr, p.stderr
    p = labs(ROOT, "similarity", str(tmp_path / "nope"), "--lab", "03", "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "nope is not a directory" in p.stderr, p.stderr


def test_staff_page_ranks_the_newest_modules_and_students_cannot_see_it(tmp_path):
    course = manifest.load(ROOT)
    lab = course.lab("03")
    url = f"sqlite:///{tmp_path / 'server.db'}"
    app = server_app.create_app(course, url)
    with db.sessions(url, course)() as s:
        names = [*HONEST, "bob"]
        tokens = dict(service.import_roster(s, [{"name": n} for n in names] + [{"name": "prof", "role": "staff"}],
                                            b"secret", now=service.clock()))
    client = TestClient(app)
    for who, text in [("alice", "def early(): pass\n" * 40), *[(n, (CLASS / f"{n}.py").read_text()) for n in names]]:
        src = tmp_path / "up" / who / "gqa.py"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text(text)
        r = client.post("/api/submissions", data={"lab": "03"}, files={"file": ("gqa.tar.gz",
                        service.pack_module(src, lab))}, headers={"Authorization": f"Bearer {tokens[who]}"})
        assert r.status_code == 201, r.text
    client.post("/login", data={"token": tokens["alice"]})
    assert client.get("/staff/labs/03/similarity").status_code == 403  # never shown to a student
    client.cookies.clear()
    r = client.post("/login", data={"token": tokens["prof"]}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get("/staff/labs/03/similarity?threshold=0").status_code == 422
    assert client.get("/staff/labs/99/similarity").status_code == 404
    r = client.get("/staff/labs/03/similarity")
    assert r.status_code == 200
    self_contained(r.text)
    page = tmp_path / "similarity.html"
    page.write_text(r.text, encoding="utf-8")
    dom = Browser(tmp_path / "chromium").dom(page.as_uri())
    head = dom.tables[0][0]
    rows = [dict(zip(head, row)) for row in dom.rows()]
    assert len(rows) == 6 and {rows[0]["Student A"], rows[0]["Student B"]} == {"alice", "bob"}
    assert rows[0]["Flagged"] == "flagged" and [r["Flagged"] for r in rows[1:]] == ["no"] * 5
    assert "similarity of 4 submission(s)" in dom.text  # alice's newest module only, the staff's none
    assert any(a.get("href") == "#pair-1" for a in dom.tags("a"))
    staff_lab = client.get("/staff/labs/03").text
    assert 'href="/staff/labs/03/similarity"' in staff_lab
