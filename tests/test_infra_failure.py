"""An infrastructure failure is "grading failed", never a student's 0.

The broken sandbox is real: a test-only pytest plugin, loaded into the grader's
pytest process through ``PYTEST_PLUGINS`` (the trusted side: the worker's
environment is scrubbed), replaces the sandbox's launcher (``harness.sandbox.zygote.spawn``) by a command
that exits or does not exist, so ``Worker.start`` raises ``SandboxStartError``
before any submission is imported. No production code reads a test hook.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import classroom, grading
from tests.conftest import ROOT, TOY_SOLUTION

BROKEN_LAUNCHERS = {  # the command started in place of the worker's launcher
    "exits": ["sh", "-c", "echo 'launcher: no sandbox on this host' >&2; exit 71", "sh"],
    "missing": ["/nonexistent/labs-launcher"],
}
HOOK = '''"""Test-only: the grader's sandbox launcher cannot start ({mode})."""
import subprocess

from harness.sandbox import zygote


def spawn(*, workdir, env, cgroup_procs, ctl, log):
    proc = subprocess.Popen({prefix!r}, stdin=ctl, stdout=ctl, stderr=log, cwd=workdir, env=env)
    proc.lib = ""
    return proc


zygote.spawn = spawn
'''


def broken_sandbox_env(tmp_path: Path, mode: str = "exits") -> dict:
    """An environment whose `labs grade` runs the graders with a launcher that fails."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir(exist_ok=True)
    (hook_dir / "labs_broken_sandbox.py").write_text(HOOK.format(mode=mode, prefix=BROKEN_LAUNCHERS[mode]))
    path = os.pathsep.join(p for p in (str(hook_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTEST_PLUGINS": "labs_broken_sandbox", "LABS_PROGRESS": "off"}


def labs(cwd, *args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env or {**os.environ, "LABS_PROGRESS": "off"})


# --- the records, unit by unit -------------------------------------------------------------

def _raw(finished=True, stopped="", infra=None):
    return {"finished": finished, "stopped": stopped, "errors": [],
            "tests": [{"nodeid": "g/test_x.py::test_x", "infra": infra}]}


@pytest.mark.parametrize("raw, reason", [
    (_raw(), ""),
    (_raw(finished=False, stopped="the grader run exceeded its 5 s limit"), ""),  # the student's timeout
    (_raw(finished=False), "the grader run ended early (exit code -11)"),          # the grader crashed
    (_raw(infra="the sandbox could not start"), "g/test_x.py::test_x: the sandbox could not start"),
])
def test_infra_failure_is_read_from_records(raw, reason):
    assert grading.infra_failure(raw, "the grader run ended early (exit code -11)" if reason.startswith("the grader")
                                 else "") == reason


def test_infra_failure_is_one_line_grading_failed():
    e = grading.InfraFailure("the sandbox could not start (EOFError); its output:\nno sandbox")
    assert isinstance(e, grading.GradingError) and "\n" not in str(e)
    assert str(e) == "grading failed: the sandbox could not start (EOFError); its output: no sandbox"


def test_a_kept_row_without_status_kind_is_graded_again(tmp_path):
    (tmp_path / "alice").mkdir()
    (tmp_path / "alice/results.json").write_text(json.dumps({"score": 0, "extra_data": {"status": "ok"}}))
    assert classroom.load_row(tmp_path, "alice").retry


def test_results_record_infra_only_for_the_trusted_start_error(toy_course):
    """A SandboxStartError raised mid-test (a worker that cannot restart) is recorded as
    ``infra``; a builtin ImportError (which a worker can send back) is not."""
    (toy_course / "graders/07/test_restart.py").write_text(
        "import pytest\nfrom harness.sandbox.worker import SandboxStartError\n\n"
        "@pytest.mark.part('A')\ndef test_restart(impl):\n"
        "    raise SandboxStartError('the sandbox could not start again')\n\n"
        "@pytest.mark.part('A')\ndef test_student_import_error(impl):\n"
        "    raise ImportError('No module named x')\n")
    out = toy_course / "results.json"
    p = subprocess.run([sys.executable, "-m", "pytest", "graders/07", "--impl", "solution", "--sandbox", "worker",
                        "--labs-results", str(out), "-q", "-p", "no:cacheprovider"],
                       cwd=toy_course, capture_output=True, text=True, timeout=300)
    tests = {t["name"]: t for t in json.loads(out.read_text())["tests"]}
    assert tests["test_restart"]["infra"] == "the sandbox could not start again", p.stdout
    assert tests["test_student_import_error"]["infra"] is None
    assert tests["test_adds"]["infra"] is None and tests["test_adds"]["outcome"] == "passed"
    assert all(t["impl_error"] is None for t in tests.values())


# --- end to end ----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", sorted(BROKEN_LAUNCHERS))
def test_grade_with_a_sandbox_that_cannot_start_fails_with_exit_1(tmp_path, mode):
    p = labs(ROOT, "grade", "solutions", "--lab", "03", "--sandbox", "process", env=broken_sandbox_env(tmp_path, mode))
    assert p.returncode == 1, p.stdout + p.stderr
    first = p.stderr.splitlines()[0]
    assert first.startswith("labs: error: grading failed: ") and "the sandbox could not start" in first, p.stderr
    assert ("no sandbox on this host" if mode == "exits" else "labs-launcher") in first
    assert "not the submission's fault" in p.stderr and "Traceback" not in p.stderr
    assert "score " not in p.stdout  # no table of zeros


def test_grade_all_marks_infra_error_rows_then_retries_them(toy_course, tmp_path):
    subs, out = tmp_path / "subs", tmp_path / "out"
    for student, text in (("alice", TOY_SOLUTION), ("bob", "def add(x, y=1:\n")):
        (subs / student / "labs/07").mkdir(parents=True)
        (subs / student / "labs/07/toy.py").write_text(text)
    args = ("grade-all", str(subs), "--lab", "07", "--out", str(out), "--jobs", "2", "--sandbox", "process")

    p = labs(toy_course, *args, env=broken_sandbox_env(tmp_path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert "labs: error: grading failed for 2 submission(s): infra_error: " in p.stderr
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    for student in ("alice", "bob"):  # the syntax error was never imported: not bob's fault either
        r = rows[student]
        assert r["status"].startswith("infra_error: ") and "the sandbox could not start" in r["status"], r
        assert r["score"] == ""  # no score, not 0
        res = json.loads((classroom.results_path(out, student)).read_text())
        assert res["score"] is None and res["extra_data"]["status_kind"] == "infra_error"

    # the environment is fixed: both are graded again; a genuine syntax error is the student's 0
    p = labs(toy_course, *args)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 graded now, 0 skipped" in p.stdout
    rows = {r["student"]: r for r in csv.DictReader((out / "grades.csv").open())}
    assert rows["alice"]["status"] == "ok" and float(rows["alice"]["score"]) == pytest.approx(6.5)
    assert rows["bob"]["status"].startswith("import error: importing toy.py failed (line 1): SyntaxError"), rows
    assert float(rows["bob"]["score"]) == 0
    res = json.loads((classroom.results_path(out, "bob")).read_text())
    assert res["extra_data"]["status_kind"] == "student_error" and res["score"] == 0
