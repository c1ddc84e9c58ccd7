"""nbgrader both ways: `labs nbgrader export` (real course structure; a real
`nbgrader generate_assignment` / `autograde` / `export` run on the toy lab) and
`labs grade-all --gradebook` (same scores through `nbgrader export`)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import impl as _impl
from harness import manifest, nbgrader_export
from tests.conftest import ROOT, TOY_GRADER, TOY_SOLUTION, TOY_STUB

nbgrader = pytest.importorskip("nbgrader", reason="nbgrader is the optional extra `nbgrader` (make test installs it)")


def labs(cwd, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "LABS_PROGRESS": "off"})


def nbg(cwd, *args, timeout=900):
    p = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def cells(nb_path: Path) -> dict:
    nb = json.loads(nb_path.read_text())
    return {c["metadata"].get("nbgrader", {}).get("grade_id", c.get("id")): c for c in nb["cells"]}


def src(cell) -> str:
    s = cell["source"]
    return s if isinstance(s, str) else "".join(s)


# --- export of the real course (no notebook is run) -----------------------------------------

def test_export_real_course_notebooks_configs_and_hidden_graders(tmp_path):
    course = manifest.load(ROOT)
    p = labs(ROOT, "nbgrader", "export", str(tmp_path / "nb"))
    assert p.returncode == 0, p.stderr
    nb_root = tmp_path / "nb"
    config = (nb_root / "nbgrader_config.py").read_text()
    assert 'c.ClearSolutions.code_stub = {"python": ""}' in config and "c.Execute.timeout" in config
    exported = sorted(d.name for d in (nb_root / "source").iterdir())
    assert "lab04" in exported
    for name in exported:
        lab = course.lab(name[3:])
        c = cells(nb_root / "source" / name / f"{name}.ipynb")
        module = src(c[f"{name}-module"])
        stub = (ROOT / "labs" / lab.number / lab.filename).read_text()
        ref = (ROOT / "solutions" / lab.number / lab.filename).read_text()
        assert module.startswith(f"%%writefile {lab.filename}\n")
        before, region = module.split("### BEGIN SOLUTION\n")
        assert stub.rstrip() in before and region.rstrip().endswith("### END SOLUTION")
        assert nbgrader_export._FUTURE.sub("", ref).strip() in region
        assert c[f"{name}-module"]["metadata"]["nbgrader"] == {
            "schema_version": 3, "grade": False, "solution": True, "locked": False, "task": False,
            "grade_id": f"{name}-module"}
        for key, part in lab.parts.items():
            meta = c[f"{name}-part-{key}"]["metadata"]["nbgrader"]
            assert meta["grade"] and meta["locked"] and meta["points"] == part.points
            assert f"autograde_part({lab.number!r}, {key!r}, {lab.filename!r})" in src(c[f"{name}-part-{key}"])
        graders = sorted(p.name for p in (ROOT / "graders" / lab.number).glob("*.py"))
        assert sorted(p.name for p in (nb_root / "labs_course/graders" / lab.number).glob("*.py")) == graders
    # nothing that nbgrader copies to students holds a grader or a reference
    assert sorted(p.name for p in (nb_root / "source").rglob("*") if p.is_file()) == [f"{n}.ipynb" for n in exported]
    assert not (nb_root / "labs_course/solutions").exists()


def test_module_cell_runs_as_the_reference_and_releases_as_the_stub(tmp_path):
    text = nbgrader_export.module_cell_source('"""Stub."""\nfrom __future__ import annotations\n' + TOY_STUB,
                                              "from __future__ import annotations\n" + TOY_SOLUTION, "toy.py")
    body = text.split("\n", 1)[1]
    (tmp_path / "toy.py").write_text(body)  # what %%writefile writes
    assert _impl.load_module(tmp_path / "toy.py").add(2, 3) == 5  # the reference's definitions win
    assert body.count("from __future__") == 1


# --- a real nbgrader run on the toy lab -----------------------------------------------------

def full_marks_toy(toy_course: Path) -> Path:
    """The toy lab without its GPU test and with a full-credit perf ratio: 10/10 is reachable on CPU."""
    grader = TOY_GRADER.replace('@pytest.mark.part("A")\n@pytest.mark.gpu\ndef test_on_gpu(impl):\n'
                                '    assert impl.add(1) == 2\n\n', "").replace('"add_vs_torch", 2.0', '"add_vs_torch", 1.0')
    assert "gpu" not in grader
    (toy_course / "graders/07/test_toy.py").write_text(grader)
    return toy_course


def submit(nb_root: Path, student: str, module_source: str | None):
    released = nb_root / "release/lab07/lab07.ipynb"
    nb = json.loads(released.read_text())
    for c in nb["cells"]:
        if module_source is not None and c["metadata"].get("nbgrader", {}).get("grade_id") == "lab07-module":
            c["source"] = "%%writefile toy.py\n" + module_source
    d = nb_root / "submitted" / student / "lab07"
    d.mkdir(parents=True)
    (d / "lab07.ipynb").write_text(json.dumps(nb))


def nb_export(nb_root: Path, out: Path, db_url: str | None = None) -> dict[str, dict]:
    args = ["export", f"--to={out}"] + ([f"--CourseDirectory.db_url={db_url}"] if db_url else [])
    nbg(nb_root, *args)
    return {r["student_id"]: r for r in csv.DictReader(out.open())}


def test_nbgrader_generate_assignment_autograde_and_gradebook_push_agree(toy_course, tmp_path):
    full_marks_toy(toy_course)
    nb_root = tmp_path / "nbcourse"
    p = labs(toy_course, "nbgrader", "export", str(nb_root))
    assert p.returncode == 0, p.stderr

    nbg(nb_root, "generate_assignment", "lab07")
    released = nb_root / "release/lab07"
    assert sorted(p.name for p in released.rglob("*")) == ["lab07.ipynb"]  # no grader, no reference
    c = cells(released / "lab07.ipynb")
    assert src(c["lab07-module"]).rstrip() == f"%%writefile toy.py\n{TOY_STUB}".rstrip()  # exactly the stub
    assert "\"    return x + y" not in (released / "lab07.ipynb").read_text()  # the reference line

    submit(nb_root, "ref", TOY_SOLUTION)
    submit(nb_root, "stub", None)
    nbg(nb_root, "autograde", "lab07")
    assert sorted(p.name for p in (nb_root / "autograded/ref/lab07").iterdir()) == ["lab07.ipynb", "toy.py"]
    graded = cells(nb_root / "autograded/ref/lab07/lab07.ipynb")
    assert "passed   test_adds" in json.dumps(graded["lab07-part-A"]["outputs"])
    rows = nb_export(nb_root, tmp_path / "autograde.csv")
    assert float(rows["ref"]["raw_score"]) == 10.0 and float(rows["ref"]["max_score"]) == 10.0
    assert float(rows["stub"]["raw_score"]) == 0.0

    # grade-all on the same modules, pushed into a new gradebook and into the course's own
    subs = tmp_path / "subs"
    for student, text in (("ref", TOY_SOLUTION), ("stub", TOY_STUB)):
        (subs / student).mkdir(parents=True)
        (subs / student / "toy.py").write_text(text)
    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    p = labs(toy_course, "grade-all", str(subs), "--lab", "07", "--out", str(tmp_path / "out"), "--jobs", "2",
             "--sandbox", "process", "--gradebook", fresh)
    assert p.returncode == 0, p.stdout + p.stderr
    pushed = nb_export(nb_root, tmp_path / "pushed.csv", fresh)
    assert {s: float(r["raw_score"]) for s, r in pushed.items()} == {"ref": 10.0, "stub": 0.0}
    assert {s: float(r["max_score"]) for s, r in pushed.items()} == {"ref": 10.0, "stub": 10.0}

    course_db = f"sqlite:///{nb_root / 'gradebook.db'}"
    (subs / "ref").rename(subs / "ref_via_grade_all")
    (subs / "stub").rename(subs / "stub_via_grade_all")
    p = labs(toy_course, "grade-all", str(subs), "--lab", "07", "--out", str(tmp_path / "out2"), "--jobs", "2",
             "--sandbox", "process", "--gradebook", course_db)
    assert p.returncode == 0, p.stdout + p.stderr
    both = nb_export(nb_root, tmp_path / "both.csv")
    assert {s: float(r["raw_score"]) for s, r in both.items()} == {
        "ref": 10.0, "stub": 0.0, "ref_via_grade_all": 10.0, "stub_via_grade_all": 0.0}


def test_gradebook_writer_records_part_scores_and_overwrites(toy_course, tmp_path):
    from nbgrader.api import Gradebook
    lab = manifest.load(toy_course).lab("07")
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    res = {"score": 4.5, "extra_data": {"status": "ok"}, "tests": [
        {"name": "A: test_adds", "score": 1.5, "max_score": 1.5, "status": "passed"},
        {"name": "A: test_default", "score": 3.0, "max_score": 3.0, "status": "passed"},
        {"name": "B: test_speed", "score": 0.0, "max_score": 4.0, "status": "failed"}]}
    w = nbgrader_export.GradebookWriter(url, lab)
    w.record("alice", res)
    res["tests"][2]["score"] = 4.0
    w.record("alice", res)  # regraded: overwritten, not duplicated
    w.close()
    w = nbgrader_export.GradebookWriter(url, lab)  # reopening keeps the structure
    w.close()
    with Gradebook(url) as gb:
        assert gb.find_grade("lab07-part-A", "lab07", "lab07", "alice").auto_score == 4.5
        assert gb.find_grade("lab07-part-B", "lab07", "lab07", "alice").auto_score == 4.0
        assert gb.find_submission("lab07", "alice").score == 8.5
        assert gb.find_assignment("lab07").max_score == 10.0
        comment = gb.find_comment("lab07-module", "lab07", "lab07", "alice").auto_comment
        assert "4/4 failed B: test_speed" in comment


def test_grade_all_with_an_unusable_gradebook_is_a_usage_error(toy_course, tmp_path):
    (tmp_path / "subs/alice").mkdir(parents=True)
    p = labs(toy_course, "grade-all", str(tmp_path / "subs"), "--lab", "07", "--out", str(tmp_path / "out"),
             "--sandbox", "process", "--gradebook", "nosuchdb://x")
    assert p.returncode == 2 and p.stderr.startswith("labs: error: cannot open the gradebook nosuchdb://x")
