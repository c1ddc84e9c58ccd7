"""`labs grade-all`: safe unpacking, finding the module, a 23-submission class
end to end (killed mid-way, then resumed), and a small class of real lab 06."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

from harness import archives, classroom, impl as _impl, manifest, records
from tests.conftest import ROOT, TOY_SOLUTION, TOY_STUB, materialize_mutant


def labs_cmd(*args):
    return [sys.executable, "-m", "harness", *args]


def toy_lab(course_root: Path):
    return manifest.load(course_root).lab("07")


# --- unpacking and locating (no grading) ---------------------------------------------

def _zip(path: Path, members: dict[str, bytes], links: dict[str, str] = {}):
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        for name, target in links.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777) << 16
            zf.writestr(info, target)
    return path


def _tar(path: Path, members: dict[str, bytes], symlinks: dict[str, str] = {}):
    with tarfile.open(path, "w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in symlinks.items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tf.addfile(info)
    return path


@pytest.mark.parametrize("kind, members, links, message", [
    ("zip", {"../evil.py": b"x"}, {}, "path traversal '../evil.py'"),
    ("zip", {"/etc/evil.py": b"x"}, {}, "absolute path '/etc/evil.py'"),
    ("zip", {"ok/toy.py": b"x"}, {"ok/link": "/etc/passwd"}, "link 'ok/link'"),
    ("tar", {"a/../../evil.py": b"x"}, {}, "path traversal"),
    ("tar", {"toy.py": b"x"}, {"toy2.py": "/etc/passwd"}, "link 'toy2.py'"),
    ("zip", {"big.bin": b"\0" * (3 << 20)}, {}, "unpacks to more than 2 MiB"),
    ("tar", {"big.bin": b"\0" * (3 << 20)}, {}, "unpacks to more than 2 MiB"),
])
def test_unpack_refuses_unsafe_or_oversized_archives(tmp_path, kind, members, links, message):
    arc = (_zip if kind == "zip" else _tar)(tmp_path / f"s.{'zip' if kind == 'zip' else 'tar.gz'}", members, links)
    with pytest.raises(archives.UnpackError, match=message.replace("(", r"\(").replace(".", r"\.")):
        archives.unpack(arc, tmp_path / "out", max_bytes=2 << 20)
    assert not (tmp_path / "evil.py").exists() and not Path("/etc/evil.py").exists()


@pytest.mark.parametrize("data", [b"", b"not an archive at all", b"PK\x03\x04garbage"])
def test_unpack_corrupt_archive_is_an_unpack_error(tmp_path, data):
    (tmp_path / "s.zip").write_bytes(data)
    (tmp_path / "s.tar.gz").write_bytes(data)
    for name in ("s.zip", "s.tar.gz"):
        with pytest.raises(archives.UnpackError, match="not a readable archive"):
            archives.unpack(tmp_path / name, tmp_path / "out")


def test_locate_prefers_checkout_then_the_only_shallowest(toy_course, tmp_path):
    """impl.locate: the one rule of labs grade, grade-all and the Gradescope autograder."""
    lab = toy_lab(toy_course)
    sub = tmp_path / "s"
    (sub / "wrapper/deeper").mkdir(parents=True)
    (sub / "wrapper/deeper/toy.py").write_text("1")
    (sub / "wrapper/toy.py").write_text("2")
    (sub / "__MACOSX").mkdir()
    (sub / "__MACOSX/toy.py").write_text("3")
    assert _impl.locate(sub, lab) == sub / "wrapper/toy.py"
    (sub / "other").mkdir()
    (sub / "other/toy.py").write_text("5")
    with pytest.raises(_impl.ImplError, match=r"2 files named toy.py equally deep .*other/toy.py, wrapper/toy.py"):
        _impl.locate(sub, lab)
    (sub / "labs/07").mkdir(parents=True)
    (sub / "labs/07/toy.py").write_text("4")
    assert _impl.locate(sub, lab) == sub / "labs/07/toy.py"
    assert _impl.locate(tmp_path / "s/__MACOSX", lab) == tmp_path / "s/__MACOSX/toy.py"
    (tmp_path / "empty").mkdir()
    with pytest.raises(_impl.ImplError, match="no toy.py in .*every folder below"):
        _impl.locate(tmp_path / "empty", lab)


def test_grades_csv_statuses_and_subtotals_come_from_records_not_messages(toy_course, tmp_path):
    """Reword every message and test name a grading wrote: each row's status kind and
    its part subtotals in grades.csv stay the same (they come from the records:
    ``impl_error``, ``stopped``, ``extra_data.part``)."""
    from harness.grading import GradeResult, TestResult
    lab = toy_lab(toy_course)

    def results(reworded: bool):
        say = (lambda s: "reworded: " + s[::-1]) if reworded else (lambda s: s)
        t = lambda name, part, score, **kw: TestResult(name=say(name), nodeid=say(name), part=part, max_score=2.0,
                                                       score=score, outcome="passed" if score else "failed",
                                                       output=say(kw.pop("output", "")), **kw)
        ok = GradeResult("07", "s", 1, [t("test_a", "A", 2.0), t("test_b", "B", 1.0)], 1.0)
        broken = GradeResult("07", "s", 1, [t(f"test_{i}", "A", 0.0, impl_error="import",
                                             output="importing toy.py failed (line 3): SyntaxError") for i in "ab"], 1.0)
        slow = GradeResult("07", "s", 1, [t("test_a", "A", 2.0), t("test_b", "B", 0.0)], 9.0,
                           stopped=say("stopped at the 60 s limit"))
        rows = []
        for student, r in (("ada", ok), ("bob", broken), ("cy", slow)):
            status = records.status_of(r)
            rows.append(classroom.Row(student, status, r.to_gradescope(), kind=records.kind_of(r, status)))
        out = tmp_path / ("reworded.csv" if reworded else "plain.csv")
        classroom.write_csv(out, rows, lab)
        table = list(csv.DictReader(out.open()))
        return [(r.kind, r.status.split(":")[0]) for r in rows], \
            [(row["student"], row["part A"], row["part B"], row["score"]) for row in table]

    assert results(reworded=False) == results(reworded=True)
    kinds, table = results(reworded=True)
    assert kinds == [(records.Status.OK, "ok"), (records.Status.STUDENT_ERROR, "import error"),
                     (records.Status.TIMEOUT, "timeout")]
    assert table == [("ada", "2", "1", "3"), ("bob", "0", "0", "0"), ("cy", "2", "0", "2")]


def test_discover_names_students_and_gives_strays_their_own_row(tmp_path):
    for d in ("alice", "bob", ".hidden", "__MACOSX"):
        (tmp_path / d).mkdir()
    for f in ("carol.zip", "dave.tar.gz", "erin.tgz", "notes.txt", "bob.zip"):
        (tmp_path / f).write_bytes(b"")
    subs, notes = classroom.discover(tmp_path)
    assert [s.student for s in subs] == ["alice", "bob", "carol", "dave", "erin", "notes.txt"]
    assert [s.student for s in subs if s.ambiguous] == ["bob"]  # bob/ and bob.zip: one row, graded neither
    assert [p.name for p in subs[1].entries] == ["bob", "bob.zip"] and not subs[0].entries
    assert [s.student for s in subs if s.stray] == ["notes.txt"] and not notes  # a row: "unrecognised submission"


def _result(stopped="", outputs=("",), outcome="failed", impl_error=""):
    from harness.grading import GradeResult, TestResult
    tests = [TestResult(name=f"t{i}", nodeid=f"t{i}", part="A", max_score=1, score=0, outcome=outcome, output=o,
                        impl_error=impl_error) for i, o in enumerate(outputs)]
    return GradeResult(lab="07", submission="x", seed=1, tests=tests, duration_s=1,
                       notes=[stopped] if stopped else [], stopped=stopped)


@pytest.mark.parametrize("result, status", [  # from the results' records (stopped, impl_error), not messages
    (_result("the grader run exceeded its 5 s limit and was stopped"), "timeout: the grader run exceeded"),
    (_result("", ["importing toy.py failed (line 3): ValueError: x"] * 2, impl_error="import"),
     "import error: importing toy.py failed"),
    (_result("", ["toy.py does not match the lab 07 contract: add(x)"], impl_error="api"),
     "api mismatch: toy.py does not match"),
    (_result("", ["importing toy.py failed (line 3): ValueError: x"]), "ok"),  # a message alone decides nothing
    (_result("", ["wrong answer", "importing toy.py failed"]), "ok"),
    (_result("", [""], outcome="passed"), "ok"),
])
def test_status_names_why_a_submission_did_not_grade_normally(result, status):
    assert records.status_of(result).startswith(status)
    assert records.one_line("a\nb  c" + "x" * 400).startswith("a b c") and len(records.one_line("x" * 400)) == 300


# --- a class of the toy lab, end to end -----------------------------------------------

MUTANTS = {  # toy mutants: one bug each -> expected score
    "minus": (TOY_SOLUTION.replace("x + y", "x - y"), 0.0),
    "ignores_y": (TOY_SOLUTION.replace("x + y", "x + 1"), 5.0),
    "off_by_one_big": (TOY_SOLUTION.replace("return x + y", "return x + y + (x > 1000)"), 5.0),
}
BAD = {
    "crash_at_import": 'raise RuntimeError("boom at import")\n',
    "exits_at_import": "import os\nos._exit(3)\n",
    "syntax_error": "def add(x, y=1:\n",
    "wrong_signature": "def add(a, b, c):\n    return a + b + c\n",  # binds none of the graders' calls
}
HANG_TIMEOUT_S = 60  # --timeout: far above a toy run even on a loaded 2-core machine


def _checkout(root: Path, text: str, layout: str = "checkout") -> Path:
    rel = {"checkout": "labs/07/toy.py", "nn": "07/toy.py", "flat": "toy.py", "wrapped": "myrepo/labs/07/toy.py"}[layout]
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    (root / "README.md").write_text("my submission\n")
    return root


def build_class(subs: Path, tmp: Path) -> dict[str, dict]:
    """23 submissions; returns student -> (expected score, status prefix)."""
    ref, stub = TOY_SOLUTION, TOY_STUB
    want = {}
    n = iter(range(1, 100))

    def name(kind):
        return f"s{next(n):02d}_{kind}"

    for layout in ("checkout", "checkout", "hang", "nn", "flat", "wrapped"):
        if layout == "hang":  # early, so that its timeout overlaps the others' grading
            s = name("hangs")
            _checkout(subs / s, "import time\ndef add(x, y=1):\n    time.sleep(3600)\n")
            want[s] = (0.0, f"timeout: the grader run exceeded its {HANG_TIMEOUT_S} s limit")
            continue
        s = name(f"ref_{layout}")
        _checkout(subs / s, ref, layout)
        want[s] = (6.5, "ok")
    for fmt in ("zip", "tar.gz", "tgz"):
        s = name(f"ref_{fmt.replace('.', '')}")
        src = _checkout(tmp / "src" / s, ref, "wrapped")
        arc = subs / f"{s}.{fmt}"
        if fmt == "zip":
            _zip(arc, {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()})
        else:
            with tarfile.open(arc, "w:gz") as tf:
                tf.add(src, arcname=".")
        want[s] = (6.5, "ok")
    for layout in ("checkout", "nn", "flat"):
        s = name("stub")
        _checkout(subs / s, stub, layout)
        want[s] = (0.0, "ok")
    for m, (text, score) in MUTANTS.items():
        s = name(f"mutant_{m}")
        _checkout(subs / s, text)
        want[s] = (score, "ok")
    for b, text in BAD.items():
        s = name(b)
        _checkout(subs / s, text)
        want[s] = (0.0, {"crash_at_import": "import error: importing toy.py failed (line 1): RuntimeError: boom",
                         # the implementation runs in a worker process: its exit is its own failure
                         "exits_at_import": "import error: importing toy.py failed",
                         "syntax_error": "import error: importing toy.py failed (line 1): SyntaxError",
                         "wrong_signature": "api mismatch:"}[b])
    s = name("corrupt")
    (subs / f"{s}.zip").write_bytes(b"PK\x03\x04 this is not a zip")
    want[s] = (0.0, "unpack error: " + s + ".zip: not a readable archive")
    s = name("traversal")
    _zip(subs / f"{s}.zip", {"../../toy.py": ref.encode()})
    want[s] = (0.0, "unpack error: " + s + ".zip: path traversal")
    s = name("nothing")
    (subs / s).mkdir()
    (subs / s / "notes.txt").write_text("forgot the code")
    want[s] = (0.0, "no module: no toy.py")
    assert len(want) >= 20
    return want


def _descendants(pid: int) -> list[int]:
    kids = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            kids.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _kill_tree(proc: subprocess.Popen):
    tree = _descendants(proc.pid)
    proc.kill()
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def test_grade_all_class_of_23_killed_then_resumed(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    subs.mkdir()
    want = build_class(subs, tmp_path)
    cmd = labs_cmd("grade-all", str(subs), "--lab", "07", "--out", str(out), "--jobs", "2",
                   "--timeout", str(HANG_TIMEOUT_S), "--sandbox", "process")
    env = {**os.environ, "LABS_PROGRESS": "off"}

    # run 1: killed (with its grading processes) once the first rows land
    proc = subprocess.Popen(cmd, cwd=toy_course, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while len(list(out.glob("students/*/results.json"))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    _kill_tree(proc)
    first = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("students/*/results.json")}
    assert 3 <= len(first) < len(want), f"run 1 should have been killed mid-way: {sorted(first)}"
    rows = list(csv.DictReader((out / "grades.csv").open()))
    assert {r["student"] for r in rows} == set(first)  # the CSV always matches the finished rows

    # run 2: grades the rest, skips what run 1 finished
    p = subprocess.run(cmd, cwd=toy_course, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"skipping {len(first)} submission(s) already graded" in p.stderr
    for s, mtime in first.items():
        assert (out / "students" / s / "results.json").stat().st_mtime_ns == mtime, f"{s} was graded again"
    assert f"{len(want) - len(first)} graded now, {len(first)} skipped" in p.stdout

    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert set(rows) == set(want)
    header = next(csv.reader((out / "grades.csv").open()))
    assert header[:6] == ["student", "lab", "score", "max", "max_runnable", "status"]
    assert header[6:] == ["part A", "part B", "A: test_adds", "A: test_default", "A: test_on_gpu", "B: test_speed"]
    for s, (score, status) in want.items():
        r = rows[s]
        assert r["status"].startswith(status), (s, r["status"])
        assert r["lab"] == "07" and float(r["max"]) == 10
        assert float(r["score"]) == pytest.approx(score), (s, r)
        if r["score"]:  # rows without a score (ambiguous, infra_error) have no subtotals either
            assert float(r["part A"]) + float(r["part B"]) == pytest.approx(float(r["score"]))
        else:
            assert r["part A"] == r["part B"] == ""
        res = json.loads((out / "students" / s / "results.json").read_text())
        assert res["extra_data"]["status"] == r["status"] and res["score"] == pytest.approx(float(r["score"]))
        if r["status"].startswith(("unpack error", "no module")):
            assert r["max_runnable"] == "" and r["A: test_adds"] == "" and res["tests"] == []
        else:
            # tests a stopped run never reached count as runnable (they could have run here)
            assert float(r["max_runnable"]) == (8.5 if not r["status"].startswith(("timeout", "crashed")) else 10)
            assert sum(float(r[c]) for c in header[8:]) == pytest.approx(float(r["score"]))  # the tests, not the parts
    (iy,) = [r for s, r in rows.items() if s.endswith("mutant_ignores_y")]
    assert iy["A: test_adds"] == "0" and iy["A: test_default"] == "3"

    # run 3: nothing left to do; a changed submission is graded again
    (stub,) = [s for s in want if s.endswith("_stub") and (subs / s / "labs/07/toy.py").is_file()]
    (subs / stub / "labs/07/toy.py").write_text(TOY_SOLUTION)
    p = subprocess.run(cmd, cwd=toy_course, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "1 graded now" in p.stdout, p.stdout + p.stderr
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert float(rows[stub]["score"]) == 6.5 and len(rows) == len(want)


def test_grade_all_broken_graders_exit_1_and_are_retried(toy_course, tmp_path):
    subs = tmp_path / "subs"
    _checkout(subs / "alice", TOY_SOLUTION)
    (toy_course / "graders/07/test_broken.py").write_text("import nonexistent_module\n")
    cmd = labs_cmd("grade-all", str(subs), "--lab", "07", "--out", str(tmp_path / "out"), "--sandbox", "process")
    p = subprocess.run(cmd, cwd=toy_course, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "labs: error: grading failed for 1 submission(s): grading error: graders failed" in p.stderr
    row = next(csv.DictReader((tmp_path / "out/grades.csv").open()))
    assert row["student"] == "alice" and row["status"].startswith("grading error")
    (toy_course / "graders/07/test_broken.py").unlink()
    p = subprocess.run(cmd, cwd=toy_course, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "1 graded now" in p.stdout, p.stderr


def test_grade_all_usage_errors(toy_course, tmp_path):
    p = subprocess.run(labs_cmd("grade-all", "nowhere", "--lab", "07"), cwd=toy_course, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("labs: error: submissions folder nowhere is not a directory")
    p = subprocess.run(labs_cmd("grade-all", ".", "--lab", "99"), cwd=toy_course, capture_output=True, text=True)
    assert p.returncode == 2 and "no lab '99'" in p.stderr


def test_grade_all_warns_on_an_empty_folder_and_gives_a_stray_file_a_row(toy_course, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from harness.cli import main
    monkeypatch.chdir(toy_course)
    (tmp_path / "subs").mkdir()
    r = CliRunner().invoke(main, ["grade-all", str(tmp_path / "subs"), "--lab", "07", "--sandbox", "process"])
    assert r.exit_code == 0 and "labs: warning: " in r.stderr and "holds no submission" in r.stderr, r.output
    assert (toy_course / ".labs-staff/grades-lab07/grades.csv").is_file()  # the default --out: staff only
    (tmp_path / "subs/bob.py").write_text(TOY_SOLUTION)  # a lone file: no archive, no folder
    (tmp_path / "subs/.DS_Store").write_text("")
    run = classroom.grade_all(tmp_path / "subs", toy_lab(toy_course), manifest.load(toy_course), tmp_path / "out")
    (row,) = run.rows
    assert row.student == "bob.py" and row.kind is records.Status.STUDENT_ERROR and row.results["score"] == 0
    assert row.status.startswith("unrecognised submission: bob.py is neither a folder nor an archive")
    row_csv = next(csv.DictReader((tmp_path / "out/grades.csv").open()))
    assert row_csv["status"] == row.status and row_csv["part A"] == row_csv["part B"] == "0"


def test_grade_all_table_shows_the_points_that_need_a_gpu(toy_course, tmp_path, monkeypatch):
    """No silent cap: without a GPU the table's Max and the mean line say what could run here."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("the toy lab's GPU test runs here: every point is runnable")
    from click.testing import CliRunner

    from harness.cli import main
    monkeypatch.chdir(toy_course)
    (tmp_path / "subs/alice").mkdir(parents=True)
    (tmp_path / "subs/alice/toy.py").write_text(TOY_SOLUTION)
    r = CliRunner().invoke(main, ["grade-all", str(tmp_path / "subs"), "--lab", "07", "--sandbox", "process",
                                  "--out", str(tmp_path / "out"), "--jobs", "1"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "10 (8.5 here)" in r.stdout and "/ 10 (8.5 runnable without a GPU)" in r.stdout, r.stdout


# --- a small class of the real lab 06 ----------------------------------------------------

def test_grade_all_real_lab_06_reference_stub_and_mutant(tmp_path):
    course = manifest.load(ROOT)
    lab = course.lab("06")
    mutants = sorted((ROOT / "tests/mutants/06").glob("*.py"))
    if not (ROOT / "graders/06").is_dir() or not mutants:
        pytest.skip("lab 06 graders or mutants not present")
    subs = tmp_path / "subs"
    src = tmp_path / "ref"
    (src / "labs/06").mkdir(parents=True)
    (src / "labs/06" / lab.filename).write_text((ROOT / "solutions/06" / lab.filename).read_text())
    with tarfile.open(subs.parent / "ref.tar.gz", "w:gz") as tf:
        tf.add(src, arcname="repo")
    subs.mkdir()
    (subs.parent / "ref.tar.gz").rename(subs / "reference.tar.gz")
    (subs / "stub/06").mkdir(parents=True)
    (subs / "stub/06" / lab.filename).write_text((ROOT / "labs/06" / lab.filename).read_text())
    materialize_mutant(mutants[0], lab, subs / "mutant")
    out = tmp_path / "out"
    p = subprocess.run(labs_cmd("grade-all", str(subs), "--lab", "06", "--out", str(out), "--jobs", "2",
                                "--sandbox", "process"), cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "LABS_PROGRESS": "off"})
    assert p.returncode == 0, p.stdout + p.stderr
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    ref, stub, mut = (float(rows[s]["score"]) for s in ("reference", "stub", "mutant"))
    assert ref == pytest.approx(float(rows["reference"]["max_runnable"])) and ref > 0
    assert stub == 0 and 0 <= mut < ref
