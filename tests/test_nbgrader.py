"""nbgrader both ways: `labs nbgrader export` (real course structure; a real
`nbgrader generate_assignment` / `autograde` / `export` run on the toy lab),
`labs nbgrader collect-modules` and `labs grade-all --gradebook`: the only
scores in the gradebook, which no notebook cell can change."""
from __future__ import annotations

import ast
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import impl as _impl
from harness import manifest, nbgrader_export
from harness.gradebook import GradebookWriter
from tests.conftest import ROOT, TOY_GRADER, TOY_SOLUTION, TOY_STUB

nbgrader = pytest.importorskip("nbgrader", reason="nbgrader is the optional extra `nbgrader` (make test installs it)")


# nbgrader's Gradebook runs the `alembic` console script: the venv's bin on PATH
ENV = {**os.environ, "LABS_PROGRESS": "off",
       "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


@pytest.fixture(autouse=True)
def _venv_on_path(monkeypatch):
    monkeypatch.setenv("PATH", ENV["PATH"])  # for in-process Gradebook() too


def labs(cwd, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def nbg(cwd, *args, timeout=900, failing_students=(), env=None):
    """Run nbgrader; it must succeed, or fail for exactly ``failing_students``."""
    p = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**ENV, **(env or {})})
    failed = sorted(re.findall(r"error processing assignment '[^']*' for student '([^']*)'", p.stdout + p.stderr))
    assert (p.returncode == 0) == (not failing_students) and failed == sorted(failing_students), \
        f"nbgrader {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
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
    ignored = re.search(r"^c\.CourseDirectory\.ignore\.extend\((.*)\)$", config, re.M)
    assert ignored and {lab.filename for lab in course.labs.values()} <= set(ast.literal_eval(ignored[1]))
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
        # no grade cell: nbgrader autograde computes no points; the feedback cells say they do not count
        assert not [k for k, cell in c.items() if cell["metadata"].get("nbgrader", {}).get("grade")]
        for key in lab.parts:
            cell = c[f"{name}-feedback-{key}"]
            assert cell["metadata"]["nbgrader"]["locked"] and "points" not in cell["metadata"]["nbgrader"]
            assert src(cell).startswith("# FEEDBACK ONLY") and "does not count" in src(cell)
            assert f"feedback_part({lab.number!r}, {key!r}, {lab.filename!r})" in src(cell)
        handout = src(c[f"{name}-handout"])
        assert "pytest labs/" not in handout and "`labs grade" not in handout and "## Quick start" not in handout
        # said in a notebook's words: no pytest (no plugin sets anything there), no checkout path, and no
        # broken rewording of a command ("the tests runs")
        for phrase in ("pytest", "plugin", "labs/", "labs progress"):
            assert phrase not in handout, f"lab {lab.number} handout says {phrase!r}"
        assert not re.findall(r"\bthe tests runs?\b|\bgraders runs\b|\bgrader run\b|\b[Yy]our own the\b", handout), \
            lab.number
        assert not re.findall(r"(?:^|\n\n|^#+ [^\n]*\n)the (?:graders|course's grader)", handout, re.M), \
            f"lab {lab.number}: a sentence starts in lower case"
        readme = (ROOT / "labs" / lab.number / "README.md").read_text()
        if f"labs/{lab.number}/{lab.filename}" in readme:  # "Edit only ...", kept from the Quick start
            assert f"`{lab.filename}` (the module cell)" in handout
        if "the course's pytest plugin sets `TRITON_INTERPRET=1`" in " ".join(readme.split()):
            assert 'os.environ["TRITON_INTERPRET"] = "1"' in handout and "set `TRITON_INTERPRET=1` yourself" in handout
        assert "sandboxed grader" in src(c[f"{name}-intro"])
        graders = sorted(p.name for p in (ROOT / "graders" / lab.number).glob("*.py"))
        assert sorted(p.name for p in (nb_root / "labs_course/graders" / lab.number).glob("*.py")) == graders
    # nothing that nbgrader copies to students holds a grader or a reference: the notebooks, and the data a
    # lab ships beside its module (labs/16/data/), next to its notebook
    shipped = {f"{assignment}/{p.relative_to(ROOT / 'labs' / n).as_posix()}" for n, assignment in
               ((lab.number, nbgrader_export.assignment_name(lab)) for lab in course.labs.values())
               for d in (ROOT / "labs" / n).iterdir() if d.is_dir() and not d.name.startswith((".", "__"))
               for p in d.rglob("*") if p.is_file()}
    assert "lab16/data/chinchilla_svg_extracted.csv" in shipped
    assert sorted(p.relative_to(nb_root / "source").as_posix() for p in (nb_root / "source").rglob("*")
                  if p.is_file()) == sorted([f"{n}/{n}.ipynb" for n in exported] + [s for s in shipped
                                                                                  if s.split("/")[0] in exported])
    assert not (nb_root / "labs_course/solutions").exists()


def test_module_cell_runs_as_the_reference_and_releases_as_the_stub(tmp_path):
    text = nbgrader_export.module_cell_source('"""Stub."""\nfrom __future__ import annotations\n' + TOY_STUB,
                                              "from __future__ import annotations\n" + TOY_SOLUTION, "toy.py")
    body = text.split("\n", 1)[1]
    (tmp_path / "toy.py").write_text(body)  # what %%writefile writes
    assert _impl.load_module(tmp_path / "toy.py").add(2, 3) == 5  # the reference's definitions win
    assert body.count("from __future__") == 1


def test_feedback_cell_in_a_kernel_without_harness_prints_one_line(toy_course, tmp_path):
    lab = manifest.load(toy_course).lab("07")
    cell = nbgrader_export.feedback_cell_source(lab, "A")
    p = subprocess.run([sys.executable, "-c", "import sys; sys.modules['harness'] = None\n"
                        "exec(compile(sys.stdin.read(), 'cell', 'exec'))"],
                       input=cell, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.count("\n") == 1 and p.stdout.startswith(nbgrader_export.NO_HARNESS), p.stdout


def test_running_the_source_notebook_leaks_nothing_into_the_release(tmp_path):
    """Staff run the source notebook (nbgrader validate executes it in source/lab03/, and its
    module cell writes gqa.py there: the reference); generate_assignment must not release it.
    (The validation's feedback cells find no hidden graders here, to keep this short: they
    grade in a temporary folder, never next to the notebook.)"""
    course = manifest.load(ROOT)
    lab = course.lab("03")
    nb_root = tmp_path / "nb"
    p = labs(ROOT, "nbgrader", "export", str(nb_root), "--lab", lab.number)
    assert p.returncode == 0, p.stderr
    source = nb_root / "source/lab03"
    p = nbg(nb_root, "validate", "source/lab03/lab03.ipynb", env={nbgrader_export.ENV_COURSE: str(tmp_path)})
    assert "Success" in p.stdout + p.stderr
    assert "### BEGIN SOLUTION" in (source / lab.filename).read_text()  # what the module cell wrote
    nbg(nb_root, "generate_assignment", "lab03", "--force")
    released = nb_root / "release/lab03"
    assert sorted(p.relative_to(released).as_posix() for p in released.rglob("*")) == ["lab03.ipynb"]
    text = (released / "lab03.ipynb").read_text()
    body = "".join(src(cell) for cell in json.loads(text)["cells"])
    assert "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    stub = (ROOT / "labs/03" / lab.filename).read_text()
    ref = (ROOT / "solutions/03" / lab.filename).read_text()
    ref_only = [ln.strip() for ln in ref.splitlines() if len(ln.strip()) > 25 and ln.strip() not in stub]
    assert len(ref_only) > 10 and not [ln for ln in ref_only if ln in body]

    # an export into that course again drops the written module; a kept config without the
    # ignore block (an older export's) gets it
    config = nb_root / "nbgrader_config.py"
    old = config.read_text().split(nbgrader_export.IGNORE_BEGIN)[0]
    config.write_text(old)
    notes = nbgrader_export.export_course(course, nb_root, [lab])
    assert not (source / lab.filename).exists() and any("removed source/lab03/gqa.py" in n for n in notes)
    assert config.read_text().startswith(old) and f"'{lab.filename}'" in config.read_text()
    assert (nb_root / "nbgrader_config.py.bak").read_text() == old
    assert nbgrader_export.export_course(course, nb_root, [lab]) == ["kept the existing nbgrader_config.py"]
    (released / lab.filename).write_text(ref)  # what generate_assignment shipped before the fix: said, not kept quiet
    assert any(n.startswith("release/lab03/gqa.py exists: it is likely the reference")
               for n in nbgrader_export.export_course(course, nb_root, [lab]))


# --- a real nbgrader run on the toy lab -----------------------------------------------------

def full_marks_toy(toy_course: Path) -> Path:
    """The toy lab without its GPU test and with a full-credit perf ratio: 10/10 is reachable on CPU."""
    grader = TOY_GRADER.replace('@pytest.mark.part("A")\n@pytest.mark.gpu\ndef test_on_gpu(impl):\n'
                                '    assert impl.add(1) == 2\n\n', "").replace('"add_vs_torch", 2.0', '"add_vs_torch", 1.0')
    assert "gpu" not in grader
    (toy_course / "graders/07/test_toy.py").write_text(grader)
    return toy_course


# A notebook that tries to grade itself: its module cell is the stub plus patches of the feedback
# helper, the grading pipeline and pytest; a later cell patches them again in the kernel (where
# nbgrader autograde runs it), and a forged grade cell claims points.
ATTACK_MODULE = TOY_STUB + """
import builtins, sys
try:
    import harness.grading, harness.nbgrader_export as nbx
    nbx.feedback_part = nbx.autograde_part = lambda *a, **k: print("6.00/6.00  passed   test_adds") or 6.0
    harness.grading.grade = lambda *a, **k: None
except Exception:
    pass
try:
    import _pytest.reports
    _pytest.reports.TestReport.outcome = property(lambda self: "passed", lambda self, v: None)
except Exception:
    pass
"""
KERNEL_PATCH = """\
import builtins, subprocess, sys, harness.nbgrader_export as nbx, harness.grading, harness.gradebook
nbx.feedback_part = nbx.autograde_part = lambda *a, **k: print("6.00/6.00  passed   test_adds") or 6.0
harness.grading.grade = lambda *a, **k: None
harness.gradebook.GradebookWriter.record = lambda *a, **k: None
subprocess.run = subprocess.Popen = lambda *a, **k: None
sys.modules["pytest"] = sys.modules["_pytest"] = None
builtins.open = lambda *a, **k: None
"""


def submit(nb_root: Path, student: str, module_source: str | None, extra_cells=()):
    released = nb_root / "release/lab07/lab07.ipynb"
    nb = json.loads(released.read_text())
    for i, c in enumerate(nb["cells"]):
        if module_source is not None and c["metadata"].get("nbgrader", {}).get("grade_id") == "lab07-module":
            c["source"] = "%%writefile toy.py\n" + module_source
            nb["cells"][i + 1:i + 1] = list(extra_cells)
            break
    d = nb_root / "submitted" / student / "lab07"
    d.mkdir(parents=True)
    (d / "lab07.ipynb").write_text(json.dumps(nb))


def code_cell(source: str, nbgrader: dict | None = None) -> dict:
    meta = {"nbgrader": {"schema_version": 3, **nbgrader}} if nbgrader else {}
    return {"cell_type": "code", "metadata": meta, "source": source, "execution_count": None, "outputs": []}


def nb_export(nb_root: Path, out: Path, db_url: str | None = None) -> dict[str, dict]:
    args = ["export", f"--to={out}"] + ([f"--CourseDirectory.db_url={db_url}"] if db_url else [])
    nbg(nb_root, *args)
    return {r["student_id"]: r for r in csv.DictReader(out.open())}


def scores(rows: dict[str, dict], column="raw_score") -> dict[str, float]:
    return {s: float(r[column]) for s, r in rows.items()}


def test_nbgrader_round_trip_grades_come_only_from_the_sandboxed_grader(toy_course, tmp_path):
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
    submit(nb_root, "attack", ATTACK_MODULE, [code_cell(KERNEL_PATCH)])
    submit(nb_root, "forger", TOY_STUB, [code_cell("10.0", {  # a forged grade cell: nbgrader rejects it
        "grade": True, "solution": False, "locked": False, "points": 100.0, "grade_id": "lab07-part-A"})])

    # nbgrader autograde is feedback only: it records no points, whatever the kernel does
    nbg(nb_root, "autograde", "lab07", failing_students=["forger"])
    graded = cells(nb_root / "autograded/ref/lab07/lab07.ipynb")
    out = json.dumps(graded["lab07-feedback-A"]["outputs"])
    assert "Feedback only" in out and "passed   test_adds" in out
    attacked = json.loads((nb_root / "autograded/attack/lab07/lab07.ipynb").read_text())
    outputs = [o for c in attacked["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]  # every patch ran in the kernel
    assert "6.00/6.00  passed" in json.dumps(outputs)  # and its feedback lies, which is all it can do
    assert set(scores(nb_export(nb_root, tmp_path / "autograde.csv")).values()) == {0.0}

    # the documented path: module cells as text -> grade-all (sandboxed) -> the gradebook
    p = labs(toy_course, "nbgrader", "collect-modules", str(nb_root), "--lab", "07")
    assert p.returncode == 0, p.stderr
    modules = nb_root / "labs_modules/lab07"
    assert (modules / "ref/07/toy.py").read_text() == TOY_SOLUTION
    assert (modules / "stub/07/toy.py").read_text().rstrip() == TOY_STUB.rstrip()
    assert (modules / "attack/07/toy.py").read_text() == ATTACK_MODULE  # the kernel cells are not the module
    course_db = f"sqlite:///{nb_root / 'gradebook.db'}"
    assert f"--gradebook {course_db}" in p.stdout
    p = labs(toy_course, "grade-all", str(modules), "--lab", "07", "--out", str(tmp_path / "out"), "--jobs", "4",
             "--sandbox", "process", "--gradebook", course_db)
    assert p.returncode == 0, p.stdout + p.stderr
    expected = {"ref": 10.0, "stub": 0.0, "attack": 0.0, "forger": 0.0}
    rows = nb_export(nb_root, tmp_path / "graded.csv")
    assert scores(rows) == expected and scores(rows, "max_score") == dict.fromkeys(expected, 10.0)

    # autograding again afterwards (the attack's kernel patches run again) changes no recorded score
    nbg(nb_root, "autograde", "lab07", "--student", "attack", "--force")
    assert scores(nb_export(nb_root, tmp_path / "again.csv")) == expected


def test_module_source_is_the_module_cell_text_as_writefile_writes_it(toy_course):
    lab = manifest.load(toy_course).lab("07")
    body = "import math\n\ndef add(x, y=1):\n    return x + y\n"
    module = code_cell(["%%writefile toy.py\n", *body.splitlines(keepends=True)], {"grade_id": "lab07-module"})
    other = code_cell("%%writefile toy.py\ndef add(x, y=1):\n    return 0\n")
    nb = {"cells": [code_cell("print(1)"), module, other]}
    assert nbgrader_export.module_source(nb, lab) == body
    assert nbgrader_export.module_source({"cells": [code_cell("x = 1"), other]}, lab).endswith("return 0\n")
    assert nbgrader_export.module_source({"cells": [code_cell(body, {"grade_id": "lab07-module"})]}, lab) == body
    for broken in ({}, {"cells": None}, {"cells": [1, {"cell_type": "code", "metadata": []}]}):
        assert nbgrader_export.module_source(broken, lab) is None


def test_collect_modules_gives_an_empty_folder_for_an_unusable_notebook(toy_course, tmp_path):
    lab = manifest.load(toy_course).lab("07")
    sub = tmp_path / "nb/submitted"
    for student, text in {"ok": json.dumps({"cells": [code_cell("%%writefile toy.py\nX = 1\n")]}),
                          "bad": "{not json", "none": json.dumps({"cells": []})}.items():
        (sub / student / "lab07").mkdir(parents=True)
        (sub / student / "lab07/lab07.ipynb").write_text(text)
    (sub / "nothing/lab07").mkdir(parents=True)
    out = tmp_path / "mods"
    (out / "bad/07").mkdir(parents=True)
    (out / "bad/07/toy.py").write_text("stale")  # from an earlier collect: removed
    students, notes = nbgrader_export.collect_modules(tmp_path / "nb", lab, out)
    assert students == ["bad", "none", "nothing", "ok"] and len(notes) == 3
    assert (out / "ok/07/toy.py").read_text() == "X = 1\n"
    assert [p for p in out.rglob("*") if p.is_file()] == [out / "ok/07/toy.py"]


def test_feedback_part_without_hidden_graders_only_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(nbgrader_export.ENV_COURSE, raising=False)
    assert nbgrader_export.feedback_part("07", "A", "toy.py") is None
    out = capsys.readouterr()
    assert out.err == "" and out.out.startswith(nbgrader_export.FEEDBACK_ONLY) and "not installed" in out.out
    monkeypatch.setenv(nbgrader_export.ENV_COURSE, str(tmp_path))  # names a folder without the graders
    assert nbgrader_export.feedback_part("07", "A", "toy.py") is None
    assert "not installed" in capsys.readouterr().out


def test_gradebook_writer_records_part_scores_and_overwrites(toy_course, tmp_path):
    from nbgrader.api import Gradebook
    lab = manifest.load(toy_course).lab("07")
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    res = {"score": 4.5, "extra_data": {"status": "ok"}, "tests": [
        {"name": "A: test_adds", "score": 1.5, "max_score": 1.5, "status": "passed", "extra_data": {"part": "A"}},
        {"name": "A: test_default", "score": 3.0, "max_score": 3.0, "status": "passed", "extra_data": {"part": "A"}},
        {"name": "B: test_speed", "score": 0.0, "max_score": 4.0, "status": "failed", "extra_data": {"part": "B"}},
        {"name": "A: test_on_gpu", "score": 0.0, "max_score": 0.0, "tags": ["part A", "skipped", "gpu"],
         "extra_data": {"part": "A", "not_run_points": 1.5}}]}  # a GPU test not run here: no status
    w = GradebookWriter(url, lab)
    w.record("alice", res)
    res["tests"][2]["score"] = 4.0
    w.record("alice", res)  # regraded: overwritten, not duplicated
    w.close()
    w = GradebookWriter(url, lab)  # reopening keeps the structure
    w.close()
    with Gradebook(url) as gb:
        assert gb.find_grade("lab07-part-A", "lab07", "lab07", "alice").auto_score == 4.5
        assert gb.find_grade("lab07-part-B", "lab07", "lab07", "alice").auto_score == 4.0
        assert gb.find_submission("lab07", "alice").score == 8.5
        assert gb.find_assignment("lab07").max_score == 10.0
        comment = gb.find_comment("lab07-module", "lab07", "lab07", "alice").auto_comment
        assert "4/4 failed B: test_speed" in comment and "0/0 not run A: test_on_gpu (worth 1.5)" in comment


def test_grade_all_gradebook_with_a_gpu_test_and_a_bonus_part_matches_grades_csv(toy_course, tmp_path):
    """The toy lab keeps its GPU test (not run on a CPU) and gets a bonus part: the gradebook's
    score is results.json's and grades.csv's, and its maximum theirs (the bonus aside)."""
    from nbgrader.api import Gradebook
    (toy_course / "labs.yaml").write_text(re.sub(
        r"(      B: \{title: Speed, points: 4\}\n)", r"\1      C: {title: Extra, points: 2, bonus: true}\n",
        (toy_course / "labs.yaml").read_text()))
    with (toy_course / "graders/07/test_toy.py").open("a") as f:
        f.write('\n@pytest.mark.part("C")\ndef test_extra(impl):\n    assert impl.add(2, 2) == 4\n')
    lab = manifest.load(toy_course).lab("07")
    assert lab.points == 10 and lab.parts["C"].bonus
    for student, text in {"ref": TOY_SOLUTION, "stub": TOY_STUB}.items():
        (tmp_path / "subs" / student / "07").mkdir(parents=True)
        (tmp_path / "subs" / student / "07/toy.py").write_text(text)
    url = f"sqlite:///{tmp_path / 'gb.db'}"
    p = labs(toy_course, "grade-all", str(tmp_path / "subs"), "--lab", "07", "--out", str(tmp_path / "out"),
             "--jobs", "2", "--sandbox", "process", "--gradebook", url)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["student"]: r for r in csv.DictReader((tmp_path / "out/grades.csv").open())}
    gpu_ran = False
    with Gradebook(url) as gb:
        assert gb.find_assignment("lab07").max_score == 10.0
        for student, row in rows.items():
            results = json.loads((tmp_path / "out/students" / student / "results.json").read_text())
            gpu = next(t for t in results["tests"] if t["name"] == "A: test_on_gpu")
            score = gb.find_submission("lab07", student).score
            assert float(row["score"]) == results["score"] == pytest.approx(score, abs=1e-4), student
            assert float(row["max"]) == results["extra_data"]["max_score"] == 10.0
            gpu_ran = "status" in gpu
            if not gpu_ran:  # not run here (no GPU): 0, and said so
                assert gpu["score"] == 0 and "not run A: test_on_gpu" in \
                    gb.find_comment("lab07-module", "lab07", "lab07", student).auto_comment
        assert gb.find_grade("lab07-part-C", "lab07", "lab07", "ref").extra_credit == 2.0
    # ref: A 4.5 of 6 (+1.5 where the GPU test ran), B 2 of 4 (the toy's perf ratio), C the bonus 2
    assert float(rows["ref"]["score"]) == (10.0 if gpu_ran else 8.5) and float(rows["stub"]["score"]) == 0.0


def test_grade_all_with_an_unusable_gradebook_is_a_usage_error(toy_course, tmp_path):
    (tmp_path / "subs/alice").mkdir(parents=True)
    p = labs(toy_course, "grade-all", str(tmp_path / "subs"), "--lab", "07", "--out", str(tmp_path / "out"),
             "--sandbox", "process", "--gradebook", "nosuchdb://x")
    assert p.returncode == 2 and p.stderr.startswith("labs: error: cannot open the gradebook nosuchdb://x")
