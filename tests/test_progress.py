"""Self-paced progress (harness/progress.py): recording visible runs and local
grades, concurrent writers, an unwritable store, `labs progress` / `labs reset`,
and the HTML report opened in headless Chromium."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import grading, manifest, progress
from harness.cli import main

SOLUTION = "def add(x, y=1):\n    return x + y\n"


def env_for(db=None, *, nested=True, **extra):
    """Environment for a child process. ``nested=False`` drops PYTEST_CURRENT_TEST,
    so the child looks like a student's own run rather than one spawned by a test."""
    env = {k: v for k, v in os.environ.items() if k not in ("LABS_PROGRESS_DB", "LABS_PROGRESS", "LABS_COURSE")}
    if not nested:
        env.pop("PYTEST_CURRENT_TEST", None)
    if db is not None:
        env["LABS_PROGRESS_DB"] = str(db)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn(cwd, args, env):
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=300):
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def pytest_args(*args):
    return ["-m", "pytest", "-p", "no:cacheprovider", *args]


def solution_dir(tmp_path) -> Path:
    d = tmp_path / "mine" / "07"
    d.mkdir(parents=True)
    (d / "toy.py").write_text(SOLUTION)
    return d.parent


def runs(db, checkout: Path, lab=None):
    """The runs recorded for the checkout ``checkout`` (progress is keyed by checkout)."""
    return progress.load_runs(str(checkout.resolve()), lab, db)


def solved(checkout: Path) -> Path:
    """``checkout`` with the student's own working toy.py in it."""
    (checkout / "labs/07/toy.py").write_text(SOLUTION)
    return checkout


# --- recording -----------------------------------------------------------------------

def test_visible_runs_are_recorded_per_checkout_and_other_impls_and_nested_runs_are_not(toy_course, tmp_path):
    db, xdg = tmp_path / "p.db", tmp_path / "xdg"
    mine = solution_dir(tmp_path)
    other = solved(Path(shutil.copytree(toy_course, tmp_path / "checkout-2")))  # a second checkout, solved
    procs = {
        # a student's own run, default store location (XDG data dir)
        "stub": spawn(toy_course, pytest_args("labs/07"), env_for(nested=False, XDG_DATA_HOME=xdg)),
        # the same student's second checkout of the course, with a working implementation, explicit store
        "other": spawn(other, pytest_args("labs/07"), env_for(db)),
        # another folder's code (--impl PATH) is not this checkout's: not recorded
        "mine": spawn(toy_course, pytest_args("labs/07", "--impl", str(mine)), env_for(db)),
        # never recorded: the reference, a run nested in a test run (the hidden graders' run: see the grade test)
        "solution": spawn(toy_course, pytest_args("labs/07", "--impl", "solution"), env_for(db)),
        "nested": spawn(toy_course, pytest_args("labs/07"), env_for(XDG_DATA_HOME=xdg)),
    }
    rcs = {name: finish(p) for name, p in procs.items()}
    assert rcs["stub"][0] == 1 and rcs["mine"][0] == 0 and rcs["other"][0] == 0, rcs
    assert not any("progress not recorded" in out for _, out in rcs.values())

    (stub_run,) = runs(xdg / "ai-infra-labs" / "progress.sqlite3", toy_course)
    assert stub_run["kind"] == "visible" and stub_run["impl"] == "student"
    assert (stub_run["passed"], stub_run["failed"], stub_run["skipped"], stub_run["total"]) == (0, 3, 1, 4)

    assert runs(db, toy_course) == []  # --impl mine, the reference, the nested run: none is this checkout's
    (run,) = runs(db, other)  # the second checkout keeps its own history
    assert run["kind"] == "visible" and run["lab"] == "07" and run["impl"] == "student"
    tests = {t["name"]: t for t in run["tests"]}
    assert {n: (t["part"], t["outcome"]) for n, t in tests.items()} == {
        "test_adds": ("A", "passed"), "test_default": ("A", "passed"),
        "test_on_gpu": ("A", "not_run"), "test_speed": ("B", "passed")}
    assert all(t["duration_s"] > 0 for t in tests.values())
    assert [(p["metric"], p["ratio"], p["part"]) for p in run["perf"]] == [("add_vs_torch", 2.0, "B")]
    assert abs(run["started"] - time.time()) < 600 and run["seed"] is not None


def test_xdist_and_parallel_pytest_processes_record_one_run_each(toy_course, tmp_path):
    pytest.importorskip("xdist")
    db = tmp_path / "p.db"
    solved(toy_course)
    procs = [spawn(toy_course, pytest_args("labs/07", "-n", "2"), env_for(db))]
    procs.append(spawn(toy_course, pytest_args("labs/07"), env_for(db)))
    for p in procs:
        rc, out = finish(p)
        assert rc == 0, out
        assert "progress not recorded" not in out
    recorded = runs(db, toy_course)
    assert len(recorded) == 2
    for run in recorded:  # the xdist controller knows parts and perf from the workers' reports
        assert run["total"] == 4 and run["passed"] == 3
        assert sorted((t["name"], t["part"]) for t in run["tests"]) == [
            ("test_adds", "A"), ("test_default", "A"), ("test_on_gpu", "A"), ("test_speed", "B")]
        assert [p["ratio"] for p in run["perf"]] == [2.0]


def test_local_grade_of_the_checkout_is_recorded_once_and_of_another_folder_not_at_all(toy_course, tmp_path):
    db = tmp_path / "p.db"
    mine = solution_dir(tmp_path)
    solved(toy_course)
    procs = [spawn(toy_course, ["-m", "harness", "grade", ".", "--lab", "07", "--sandbox", "process"], env_for(db)),
             spawn(toy_course, ["-m", "harness", "grade", str(mine), "--lab", "07", "--sandbox", "process"],
                   env_for(db)),  # an instructor grading a folder: not "your" grade
             spawn(toy_course, ["-m", "harness", "grade", "solutions", "--lab", "07", "--sandbox", "process"],
                   env_for(db))]
    for p in procs:
        rc, out = finish(p)
        assert rc == 0, out
    (run,) = runs(db, toy_course)  # the other folder, the reference and the grader child run: not recorded
    assert run["kind"] == "grade" and run["impl"] == str(toy_course.resolve())
    assert len(progress.load_runs(str(mine.resolve()), None, db)) == 0
    assert run["score"] == pytest.approx(6.5) and run["max_score"] == 10 and run["max_score_runnable"] == 8.5
    parts = {}
    for t in run["tests"]:
        assert t["nodeid"].startswith("graders/07/")
        parts[t["part"]] = parts.get(t["part"], 0) + t["score"]
    assert parts == {"A": pytest.approx(4.5), "B": pytest.approx(2.0)}
    assert [(p["metric"], p["ratio"]) for p in run["perf"]] == [("add_vs_torch", 2.0)]


# --- concurrency and failure ----------------------------------------------------------

WRITER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from harness.progress import RunRecord, TestRecord, record_runs
    db, who, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        tests = [TestRecord(nodeid=f"labs/07/test_x.py::t{j}", name=f"t{j}", part="A", outcome="passed",
                            perf=[{"name": "m", "ratio": 1.0 + j}]) for j in range(5)]
        record_runs([RunRecord(course="Toy course", course_root=str(Path.cwd().resolve()), lab="07",
                               kind="visible", started=time.time(), impl=f"{who}:{i}", tests=tests)], db)
    print("done", who)
""")


def test_concurrent_writers_lose_no_rows(tmp_path):
    db, script = tmp_path / "p.db", tmp_path / "writer.py"
    script.write_text(WRITER)
    env = env_for(db, PYTHONPATH=Path(__file__).resolve().parents[1])
    writers, n = 6, 25
    procs = [spawn(tmp_path, [str(script), str(db), f"w{k}", str(n)], env) for k in range(writers)]
    for p in procs:
        rc, out = finish(p, timeout=240)
        assert rc == 0 and "locked" not in out, out
    recorded = runs(db, tmp_path)
    assert len(recorded) == writers * n
    assert sorted(r["impl"] for r in recorded) == sorted(f"w{k}:{i}" for k in range(writers) for i in range(n))
    assert all(len(r["tests"]) == 5 and len(r["perf"]) == 5 for r in recorded)
    import sqlite3
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_unwritable_store_warns_once_and_never_fails_the_run(toy_course, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's folder should be")
    solved(toy_course)
    rc, out = finish(spawn(toy_course, pytest_args("labs/07"), env_for(blocker / "p.db")))
    assert rc == 0, out
    warnings = [line for line in out.splitlines() if "progress not recorded" in line]
    assert len(warnings) == 1, out
    assert warnings[0].startswith("labs: warning: progress not recorded (cannot write")
    assert "your test results are unaffected" in warnings[0]

    # the local-grade path: record_grade returns the reason, the CLI prints it as one warning line
    result = grading.GradeResult(lab="07", submission=str(toy_course), seed=1, duration_s=0.1, tests=[
        grading.TestResult(name="t", nodeid="graders/07/t.py::t", part="A", max_score=6, score=6, outcome="passed")])
    course = manifest.load(toy_course)
    monkeypatch.setenv("LABS_PROGRESS_DB", str(blocker / "p.db"))
    problem = progress.record_grade(result, course.lab("07"), course)
    assert problem and problem.startswith("cannot write")


# --- the commands ---------------------------------------------------------------------

def seed_history(db, checkout: Path):
    """Two visible runs and three grades of lab 07 at known times."""
    def rec(kind, at, outcomes, ratio=None, scores=None):
        tests = []
        for j, (part, outcome) in enumerate(outcomes):
            perf = [{"name": "add_vs_torch", "ratio": ratio}] if part == "B" and ratio else []
            score = None if scores is None else scores[j]
            tests.append(progress.TestRecord(nodeid=f"labs/07/t.py::t{j}", name=f"t{j}", part=part,
                                             outcome=outcome, duration_s=0.01, score=score,
                                             max_score=None if scores is None else (6 if part == "A" else 4),
                                             perf=perf))
        total = None if scores is None else round(sum(scores), 4)
        return progress.RunRecord(course="Toy course", course_root=str(checkout.resolve()), lab="07", kind=kind,
                                  started=at, tests=tests,
                                  score=total, max_score=None if scores is None else 10.0)

    t0 = 1_750_000_000.0
    progress.record_runs([
        rec("visible", t0, [("A", "failed"), ("A", "failed"), ("B", "failed")]),
        rec("grade", t0 + 60, [("A", "failed"), ("B", "passed")], ratio=3.5, scores=[0.0, 0.5]),
        rec("visible", t0 + 120, [("A", "passed"), ("A", "failed"), ("B", "passed")], ratio=2.5),
        rec("grade", t0 + 180, [("A", "passed"), ("B", "passed")], ratio=1.2, scores=[6.0, 3.6]),
        rec("grade", t0 + 240, [("A", "failed"), ("B", "passed")], ratio=1.8, scores=[0.0, 2.8]),
    ], db)
    progress.record_runs([progress.RunRecord(course="Toy course", course_root=str(checkout.parent / "elsewhere"),
                                             lab="07", kind="visible", started=t0,
                                             tests=[progress.TestRecord(nodeid="x", name="x", outcome="passed")])],
                         db)
    return t0


def labs_cli(toy_course, db, *args, input=None):
    return CliRunner().invoke(main, ["--course", str(toy_course), *args], input=input,
                              env={"LABS_PROGRESS_DB": str(db), "COLUMNS": "200"}, catch_exceptions=False)


def test_progress_json_reports_last_and_best_per_lab_and_part(toy_course, tmp_path):
    db = tmp_path / "p.db"
    t0 = seed_history(db, toy_course)
    r = labs_cli(toy_course, db, "progress", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["course"] == "Toy course" and data["db"] == str(db)
    (lab,) = data["labs"]
    assert lab["visible"] == {"passed": 2, "total": 3, "at": t0 + 120}  # the last visible run, not the best
    assert lab["last_grade"] == {"score": 2.8, "max_score": 10.0, "at": t0 + 240}
    assert lab["best_grade"] == {"score": 9.6, "max_score": 10.0, "at": t0 + 180}
    assert lab["best_perf"] == {"add_vs_torch": 1.2}
    assert lab["attempts"] == {"visible": 2, "grade": 3}
    assert (lab["first"], lab["last"]) == (t0, t0 + 240)
    a, b = lab["parts"]
    assert (a["part"], a["visible"]["passed"], a["visible"]["total"]) == ("A", 1, 2)
    assert a["last_grade"]["score"] == 0 and a["best_grade"] == {"score": 6.0, "max_score": 6.0, "at": t0 + 180}
    assert a["best_perf"] == {} and b["best_perf"] == {"add_vs_torch": 1.2}
    assert b["best_grade"]["score"] == 3.6 and b["best_grade"]["max_score"] == 4.0
    assert [h["kind"] for h in lab["history"]] == ["visible", "grade", "visible", "grade", "grade"]


def test_progress_table_and_empty_store(toy_course, tmp_path):
    db = tmp_path / "p.db"
    r = labs_cli(toy_course, db, "progress")
    assert r.exit_code == 0 and "Toy course: local progress" in r.output
    assert re.search(r"07\s+all\s+-\s+-\s+-\s+-\s+0\s+0\s+-\s+-", r.output), r.output
    seed_history(db, toy_course)
    r = labs_cli(toy_course, db, "progress")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert any(re.search(r"07\s+all\s+2/3\s+2\.8/10\s+9\.6/10\s+add_vs_torch 1\.2x\s+2\s+3\s", ln) for ln in lines), \
        r.output
    assert any(re.search(r"^\s+A\s+1/2\s+0/6\s+6/6\s+-\s+2\s+3\s", ln) for ln in lines), r.output
    assert any(re.search(r"^\s+B\s+1/1\s+2\.8/4\s+3\.6/4\s+add_vs_torch 1\.2x\s+2\s+3\s", ln) for ln in lines), \
        r.output
    assert f"Recorded in {db}" in r.output.replace("\n", " ")
    r = labs_cli(toy_course, db, "progress", "12")
    assert r.exit_code == 2 and "no lab '12'" in r.output


def test_reset_asks_first_and_deletes_only_this_checkout(toy_course, tmp_path):
    db = tmp_path / "p.db"
    seed_history(db, toy_course)
    r = labs_cli(toy_course, db, "reset", "07", input="n\n")
    assert r.exit_code == 1 and "Delete 5 recorded run(s) of lab 07" in r.output and "Aborted" in r.output
    assert len(runs(db, toy_course)) == 5
    r = labs_cli(toy_course, db, "reset", "07", input="y\n")
    assert r.exit_code == 0 and "deleted 5 recorded run(s) of lab 07" in r.output
    assert runs(db, toy_course) == []
    assert len(progress.load_runs(str(toy_course.parent / "elsewhere"), None, db)) == 1  # another checkout's is kept
    seed_history(db, toy_course)
    r = labs_cli(toy_course, db, "reset", "--yes")
    assert r.exit_code == 0 and "deleted 5 recorded run(s) of every lab of Toy course" in r.output
    assert "Delete" not in r.output
    r = labs_cli(toy_course, db, "reset", "--yes")
    assert r.exit_code == 0 and "nothing recorded" in r.output
    import sqlite3
    con = sqlite3.connect(db)
    for table in ("results", "perf"):  # no orphan rows left behind
        assert con.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id NOT IN (SELECT id FROM runs)").fetchone() == (0,)
    con.close()


# --- the HTML report ------------------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1280,1100"]


def chromium() -> str:
    exe = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if exe is None:
        msg = "headless Chromium is needed to check the HTML report (Debian: apt-get install -y chromium)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def test_html_report_is_self_contained_and_renders_table_and_plots(toy_course, tmp_path):
    exe = chromium()
    db, page = tmp_path / "p.db", tmp_path / "report" / "progress.html"
    page.parent.mkdir()  # an output's folder must exist (a typo is an error, not created)
    seed_history(db, toy_course)
    r = labs_cli(toy_course, db, "progress", "--html", str(page))
    assert r.exit_code == 0 and page.is_file(), r.output
    text = page.read_text()
    assert "<table>" in text and text.count("<svg") == 1 and "Lab 07 — Toy lab" in text
    assert "9.6/10" in text and "add_vs_torch 1.2x" in text
    # nothing fetched from anywhere: no scripts, links, imports, remote urls (SVG xmlns are names, not fetches)
    assert not re.search(r"<script|<link|<img|@import|url\((?!#)|(src|href)\s*=\s*[\"']?(https?:)?//", text, re.I)
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= {"http://www.w3.org/2000/svg",
                                                             "http://www.w3.org/1999/xlink"}

    shot = tmp_path / "artifacts" / "progress.png"
    shot.parent.mkdir()
    proc = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}",
                           f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.is_file() and shot.stat().st_size > 10_000, proc.stderr[-2000:]
    print(f"screenshot: {shot}")

    import matplotlib.image
    img = (matplotlib.image.imread(str(shot))[..., :3] * 255).round()

    def share(rgb, region=None):
        sub = img if region is None else img[region]
        return float((abs(sub - rgb).max(axis=-1) <= 12).mean())

    header_band = (slice(0, 300), slice(None))
    assert share((0xF0, 0xF0, 0xF0), header_band) > 0.002  # the table's header cells
    assert share((0x4C, 0x78, 0xA8)) > 0.0002  # the visible-tests line
    assert share((0xE4, 0x57, 0x56)) > 0.0002  # the hidden-grade line
    assert share((255, 255, 255)) < 0.97  # not a blank page


def test_html_report_without_attempts_says_so(toy_course, tmp_path):
    page = tmp_path / "empty.html"
    r = labs_cli(toy_course, tmp_path / "none.db", "progress", "--html", str(page))
    assert r.exit_code == 0
    text = page.read_text()
    assert "No attempts recorded yet" in text and "<svg" not in text


def test_plots_show_what_each_run_measured_and_leave_out_empty_panels(toy_course, tmp_path):
    """Issue 33.6: a `-k` run (fewer tests), one whose tests were all skipped (no GPU) and
    one stopped early are plotted as the share of the tests they ran, never as 0 %; the
    perf panel is left out for a lab with no timed figure."""
    from harness import manifest, progress_report

    db = tmp_path / "p.db"
    root, t0 = str(toy_course.resolve()), 1_750_000_000.0

    def visible(at, outcomes):
        tests = [progress.TestRecord(nodeid=f"labs/07/t.py::t{j}", name=f"t{j}", part="A", outcome=o)
                 for j, o in enumerate(outcomes)]
        return progress.RunRecord(course="Toy course", course_root=root, lab="07", kind="visible", started=at,
                                  tests=tests)

    progress.record_runs([visible(t0, ["passed", "failed", "failed", "failed"]),   # the full set: 25 %
                          visible(t0 + 1, ["passed"]),                              # -k one test: 100 %
                          visible(t0 + 2, ["skipped", "skipped"]),                   # -k gpu, no GPU: nothing ran
                          visible(t0 + 3, ["passed", "passed", "failed", "not run"])], db)  # -x: 2 of 3 ran
    (lab,) = progress_report.summarize(manifest.load(toy_course), db)["labs"]
    vis, grd = progress_report.score_series(lab["history"])
    assert vis == [(1, 25.0), (2, 100.0), (4, pytest.approx(200 / 3))] and grd == []
    svg = progress_report._plot_svg(lab, {})
    assert svg.count('<g id="axes_') == 1  # no perf figure recorded: no empty perf chart
    seed_history(db, toy_course)
    (lab,) = progress_report.summarize(manifest.load(toy_course), db)["labs"]
    assert progress_report._plot_svg(lab, {}).count('<g id="axes_') == 2


def test_progress_counts_tests_not_run_on_this_hardware_apart_from_failures(toy_course, tmp_path):
    """Issue 34.6: `labs progress` shows a visible test this hardware could not run as
    not_run, never as a failure."""
    db = tmp_path / "p.db"
    root = str(toy_course.resolve())
    tests = [progress.TestRecord(nodeid=f"labs/07/t.py::t{j}", name=f"t{j}", part="A", outcome=o)
             for j, o in enumerate(["passed", "passed", "not_run"])]
    progress.record_runs([progress.RunRecord(course="Toy course", course_root=root, lab="07", kind="visible",
                                             started=time.time(), tests=tests)], db)
    r = labs_cli(toy_course, db, "progress", "--json")
    (lab,) = json.loads(r.output)["labs"]
    assert lab["visible"]["passed"] == 2 and lab["visible"]["not_run"] == 1
    r = labs_cli(toy_course, db, "progress")
    assert "2/3 (1 not_run)" in r.output, r.output


def test_progress_shows_why_each_test_was_not_run(toy_course, tmp_path, monkeypatch):
    """Issue 34.6: a test this hardware could not run shows its reason in `labs progress`
    (table, JSON, HTML), as `labs grade` and the pages do: a real visible run on this CPU
    machine with perf calibrated only on another model (labs.yaml perf_calibrated_on:
    the uncalibrated GPU model, faked), and a local grade's not_run test."""
    import sqlite3
    from types import SimpleNamespace

    from harness import records

    y = toy_course / "labs.yaml"
    y.write_text(y.read_text().replace("labs:\n", "perf_calibrated_on: [NVIDIA H100 80GB HBM3]\nlabs:\n", 1))
    solved(toy_course)
    db = tmp_path / "p.db"
    rc, out = finish(spawn(toy_course, pytest_args("labs/07"), env_for(db, LABS_GPU_MODEL="cpu")))
    assert rc == 0, out
    (run,) = runs(db, toy_course)
    reasons = {t["name"]: (t["outcome"], t["reason"]) for t in run["tests"]}
    assert reasons["test_adds"] == ("passed", None)
    assert reasons["test_on_gpu"][0] == "not_run" and "needs a CUDA GPU" in reasons["test_on_gpu"][1]
    assert reasons["test_speed"][0] == "not_run" and "perf thresholds are not calibrated on cpu" in \
        reasons["test_speed"][1]

    graded = SimpleNamespace(submission=str(toy_course), duration_s=1.0, seed=1, score=6.0, max_score=10.0,
                             max_score_runnable=6.0, tests=[
                                 records.TestResult("test_adds", "g::test_adds", "A", 6.0, 6.0, "passed"),
                                 records.TestResult("test_speed", "g::test_speed", "B", 4.0, 0.0, "skipped",
                                                    "skipped: perf not verified: no calibration for this GPU model")])
    course = manifest.load(toy_course)
    monkeypatch.setenv("LABS_PROGRESS_DB", str(db))  # inside a test run, recording needs a named store
    assert progress.record_grade(graded, course.lab("07"), course, db) is None

    r = labs_cli(toy_course, db, "progress", "--json")
    (lab,) = json.loads(r.output)["labs"]
    assert {(n["run"], n["test"], n["part"]) for n in lab["not_run"]} == {
        ("visible", "test_on_gpu", "A"), ("visible", "test_speed", "B"), ("grade", "test_speed", "B")}
    assert [n["reason"] for n in lab["not_run"] if n["run"] == "grade"] == [
        "perf not verified: no calibration for this GPU model"]
    r = labs_cli(toy_course, db, "progress")
    text = " ".join(r.output.split())
    assert "Not run on this hardware (not verified here: neither passed nor failed):" in text, r.output
    assert "lab 07 part A test_on_gpu (last visible run): needs a CUDA GPU" in text, r.output
    assert "lab 07 part B test_speed (last visible run): perf thresholds are not calibrated on cpu" in text
    assert "lab 07 part B test_speed (last grade): perf not verified: no calibration for this GPU model" in text
    page = tmp_path / "p.html"
    assert labs_cli(toy_course, db, "progress", "--html", str(page)).exit_code == 0
    html_text = page.read_text()
    assert "Not run on this hardware" in html_text and "no calibration for this GPU model" in html_text

    # a store written before reasons were kept (schema 2) takes them from now on
    old = tmp_path / "old.db"
    con = sqlite3.connect(old)
    con.executescript(progress._SCHEMA.replace(
        ",\n    reason      TEXT                      -- not_run: why this hardware could not run it", ""))
    con.execute("PRAGMA user_version = 2")
    con.commit()
    assert "reason" not in {c[1] for c in con.execute("PRAGMA table_info(results)")}
    con.close()
    progress.record_runs([progress.RunRecord(course="Toy course", course_root=str(toy_course.resolve()), lab="07",
                                             kind="visible", started=time.time(), tests=[progress.TestRecord(
                                                 "n::t", "t", "A", "not_run", reason="needs a CUDA GPU")])], old)
    (run,) = runs(old, toy_course)
    assert run["tests"][0]["reason"] == "needs a CUDA GPU"
