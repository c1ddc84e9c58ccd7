"""`labs list`, `labs test`, `labs grade` on the toy course: scores, JSON schema, errors."""
import json
import subprocess
import sys

import pytest

from tests.conftest import course


def labs(cwd, *args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_list_shows_labs_parts_and_points(toy_course):
    p = labs(toy_course, "list", "--json")
    assert p.returncode == 0
    (row,) = json.loads(p.stdout)
    assert row["lab"] == "07" and row["parts"] == {"A": 6, "B": 4} and row["points"] == 10
    assert row["gpu_points"] == 1.5 and row["gpu"] == "1.5 pts need a GPU"  # test_on_gpu: weight 1 of 4 in A
    p = labs(toy_course, "list")
    assert "Toy lab" in p.stdout and "A 6, B 4" in p.stdout and "1.5 pts need a GPU" in p.stdout


def test_test_runs_visible_tests_like_pytest(toy_course):
    p = labs(toy_course, "test", "07", "-q")
    assert p.returncode == 1 and "NotImplementedError" in p.stdout
    p = labs(toy_course, "test", "7", "--impl", "solution", "-q")
    assert p.returncode == 0, p.stdout


def test_grade_reference_gets_full_runnable_marks_with_gradescope_json(toy_course, tmp_path):
    out = tmp_path / "results.json"
    p = labs(toy_course, "grade", "solutions", "--lab", "07", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    # A (6 points): weights 1, 2, 1 -> 1.5, 3, 1.5 (the GPU one skipped); B (4): perf ratio 2.0 -> half credit
    assert r["extra_data"]["max_score_runnable"] == pytest.approx(8.5)
    assert r["score"] == pytest.approx(1.5 + 3 + 2)
    assert {"score", "execution_time", "tests", "leaderboard", "visibility"} <= set(r)
    for t in r["tests"]:
        assert {"name", "score", "max_score", "output", "visibility", "tags", "extra_data"} <= set(t)
        # a GPU test not run here is neutral (no status); every test that ran passed or failed
        assert ("status" in t) == (t["extra_data"].get("not_run_points") is None)
        assert t.get("status", "passed") in ("passed", "failed")
    gpu = next(t for t in r["tests"] if "test_on_gpu" in t["name"])
    assert gpu["score"] == gpu["max_score"] == 0 and "not_run" in gpu["tags"] and "needs a CUDA GPU" in gpu["output"]
    assert "status" not in gpu and gpu["extra_data"]["not_run_points"] == pytest.approx(1.5)
    assert gpu["extra_data"]["status"] == "not_run" and gpu["extra_data"]["not_run_reason"].startswith("needs a CUDA")
    speed = next(t for t in r["tests"] if "test_speed" in t["name"])
    assert speed["score"] == pytest.approx(2.0) and "2.000x the baseline's time (baseline: torch.add)" in speed["output"]
    assert r["leaderboard"] == [{"name": "add_vs_torch", "value": 2.0, "order": "asc"}]


def test_grade_stub_scores_zero_and_exits_0(toy_course, tmp_path):
    out = tmp_path / "r.json"
    p = labs(toy_course, "grade", "labs", "--lab", "07", "--json", str(out))
    assert p.returncode == 0
    r = json.loads(out.read_text())
    assert r["score"] == 0
    assert "NotImplementedError: Part A" in r["tests"][0]["output"]


def test_grade_submission_with_syntax_error_still_gets_a_row(toy_course, tmp_path):
    (tmp_path / "sub/labs/07").mkdir(parents=True)
    (tmp_path / "sub/labs/07/toy.py").write_text("def add(x, y=1:\n")
    (tmp_path / "sub/labs/07/notes.txt").write_text("hi")
    p = labs(toy_course, "grade", str(tmp_path / "sub"), "--lab", "07", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["score"] == 0 and "SyntaxError" in r["tests"][0]["output"]
    assert r["extra_data"]["ignored_files"] == ["notes.txt"]
    assert "ignored 1 other file" in p.stderr
    # one line for the whole submission, not a row per test with the same error
    assert p.stdout.splitlines() == [f"Lab 07 — Toy lab: {tmp_path / 'sub'}: score 0 / 10: import error: importing "
                                     "toy.py failed (line 1): SyntaxError: invalid syntax (toy.py, line 1)"]


def test_grade_misnamed_module_is_one_line_naming_the_near_miss(toy_course, tmp_path):
    (tmp_path / "sub/labs/07").mkdir(parents=True)
    (tmp_path / "sub/labs/07/TOY.py").write_text("def add(x, y=1):\n    return x + y\n")
    (tmp_path / "sub/toy_solution.py").write_text("def add(x, y=1):\n    return x + y\n")
    p = labs(toy_course, "grade", str(tmp_path / "sub"), "--lab", "07", "--sandbox", "process")
    assert p.returncode == 0 and "Traceback" not in p.stderr
    (line,) = p.stdout.splitlines()
    assert line.startswith(f"Lab 07 — Toy lab: {tmp_path / 'sub'}: score 0 / 10: no module: no toy.py in ")
    assert line.endswith("found labs/07/TOY.py, toy_solution.py: the file must be named toy.py exactly")


@pytest.mark.parametrize("args, code, message", [
    (["grade", "solutions", "--lab", "99"], 2, "labs: error: no lab '99' (labs.yaml lists 07)"),
    (["grade", "nowhere", "--lab", "07"], 2, "labs: error: submission nowhere is not a directory"),
    (["test", "12"], 2, "labs: error: no lab '12'"),
])
def test_usage_errors_are_one_line_with_exit_2(toy_course, args, code, message):
    p = labs(toy_course, *args)
    assert p.returncode == code
    assert p.stderr.splitlines()[0].startswith(message)
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("yaml_text, message, hint", [
    ('name: x\nlabs:\n  "07": {title: t, module: toy, api: [add], parts: {A: {title: a, points: many}}}\n',
     "invalid course manifest: labs.07.parts.A.points: Input should be a valid number",
     "fix `labs.07.parts.A.points` in labs.yaml"),
    ('name: x\nlabs:\n  "07": {title: t, module: toy\n', "not valid YAML at line 4, column 1: expected ',' or '}'",
     "fix the YAML syntax of labs.yaml at line 4"),
    ('name: x\nlabs:\n  "07": {title: t, module: toys, api: [add], parts: {A: {title: a, points: 1}}}\n',
     "labs.07.module: 'toys' names labs/07/toys.py, which does not exist (labs/07 holds toy.py)",
     "fix `labs.07.module` in labs.yaml or rename the file"),
])
def test_corrupt_labs_yaml_is_one_line_and_a_hint_in_the_cli_and_in_pytest(toy_course, yaml_text, message, hint):
    (toy_course / "labs.yaml").write_text(yaml_text)
    p = labs(toy_course, "list")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    error, hint_line = p.stderr.splitlines()  # two lines: the error and its hint
    assert error.startswith(f"labs: error: {toy_course / 'labs.yaml'}: ") and message in error
    assert hint_line.startswith("  hint: ") and hint in hint_line
    p = subprocess.run([sys.executable, "-m", "pytest", "labs/07", "-q", "-p", "no:cacheprovider"], cwd=toy_course,
                       capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "INTERNALERROR" not in out and "Traceback" not in out
    assert message in out and f"hint: {hint}" in out


def test_output_paths_in_missing_folders_or_inside_the_course_are_refused(toy_course, tmp_path):
    (tmp_path / "subs").mkdir()
    for args, message in ((["grade-all", str(tmp_path / "subs"), "--lab", "07", "--out", str(tmp_path / "a/b")],
                           f"labs: error: --out {tmp_path / 'a/b'}: the folder {tmp_path / 'a'} does not exist"),
                          (["nbgrader", "export", "course"], "labs: error: DEST course is inside the course tree"),
                          (["grade-all", str(tmp_path / "subs"), "--lab", "07", "--out", "grades"],
                           "labs: error: --out grades is inside the course tree"),
                          (["grade", "solutions", "--lab", "07", "--json", str(tmp_path / "a/r.json")],
                           f"labs: error: --json {tmp_path / 'a/r.json'}: the folder {tmp_path / 'a'} does not exist"),
                          (["progress", "--html", str(tmp_path / "a/r.html")],
                           f"labs: error: --html {tmp_path / 'a/r.html'}: the folder {tmp_path / 'a'} does not exist")):
        p = labs(toy_course, *args)
        assert p.returncode == 2 and p.stderr.splitlines()[0].startswith(message), p.stderr
        assert "hint:" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "a").exists() and not (toy_course / "course").exists() and not (toy_course / "grades").exists()


def test_broken_graders_fail_grading_with_exit_1(toy_course):
    (toy_course / "graders/07/test_broken.py").write_text("import nonexistent_module\n")
    p = labs(toy_course, "grade", "solutions", "--lab", "07")
    assert p.returncode == 1
    assert p.stderr.startswith("labs: error: graders failed to collect")


def test_grader_without_part_marker_is_a_grading_error(toy_course):
    (toy_course / "graders/07/test_nopart.py").write_text("def test_x(impl):\n    pass\n")
    p = labs(toy_course, "grade", "solutions", "--lab", "07")
    assert p.returncode == 1 and "test_x: no part marker" in p.stderr and "parts of lab 07 in labs.yaml: A, B" in p.stderr


def test_timeout_keeps_finished_tests_and_marks_the_rest_not_run(toy_course, tmp_path):
    (toy_course / "graders/07/test_zz_hang.py").write_text(
        "import pytest, time\n@pytest.mark.part('B')\ndef test_hangs(impl):\n    time.sleep(600)\n")
    p = labs(toy_course, "grade", "solutions", "--lab", "07", "--timeout", "20", "--json", str(tmp_path / "r.json"))
    assert p.returncode == 0, p.stderr
    r = json.loads((tmp_path / "r.json").read_text())
    hang = next(t for t in r["tests"] if "test_hangs" in t["name"])
    assert hang["score"] == 0 and "exceeded its 20 s limit" in hang["output"]
    assert r["score"] > 0  # tests graded before the hang keep their points


def test_grade_table_keeps_names_and_case_ids_whole_in_80_columns(monkeypatch, capsys):
    from harness import cli
    from harness.grading import GradeResult, TestResult
    monkeypatch.setenv("COLUMNS", "80")
    name = "test_output_matches_flash_attention_reference[causal-fp16-B2-H4-L127-D64]"
    tests = [TestResult(name=name, nodeid=name, part="B", max_score=1.0, score=0.0, outcome="failed",
                        output="AssertionError: a [red]student message[/red] is shown as written")]
    cli._print_result(GradeResult(lab="07", submission="sub", seed=1, tests=tests, duration_s=1.0),
                      course().lab("04"))
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    cells = "".join(line.split("│")[2].strip() for line in out.splitlines() if line.count("│") > 2)
    assert name in cells, f"the test name is cut in an 80-column table:\n{out}"
    assert "[red]student" in out  # student text is not rich markup
