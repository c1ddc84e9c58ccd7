"""The pytest plugin on a throwaway course: --impl, markers, seed, results file."""
import json
import subprocess
import sys

import pytest


def run_pytest(cwd, *args):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300)
    return proc.returncode, pytest.LineMatcher(proc.stdout.splitlines())


def test_stub_fails_with_not_implemented_and_header_names_impl_and_seed(toy_course):
    rc, out = run_pytest(toy_course, "labs/07", "-rA")
    assert rc == 1
    out.fnmatch_lines(["labs: course *, impl student, device cpu*", "labs: seed * (replay with --seed *)",
                       "*NotImplementedError: Part A: return x + y*"])


def test_solution_passes_and_gpu_test_is_not_run_with_reason(toy_course):
    """Issue 34.6: a test this hardware cannot run is ``not_run`` with its reason, never
    ``skipped`` (which reads as passed) nor failed."""
    rc, out = run_pytest(toy_course, "labs/07", "--impl", "solution", "-rs")
    assert rc == 0
    out.fnmatch_lines(["*..N.*", "*not run on this hardware*",
                       "NOT RUN labs/07/test_toy_visible.py::test_on_gpu: needs a CUDA GPU*", "*3 passed, 1 not_run*"])
    assert "skipped" not in out.str()


def test_perf_on_an_uncalibrated_model_is_not_run_and_correctness_still_runs(toy_course, monkeypatch):
    """Issue 34.6: with ``perf_calibrated_on`` set, a perf test on another model (faked
    with ``LABS_GPU_MODEL``) is not_run naming the model; the correctness tests run."""
    yaml_path = toy_course / "labs.yaml"
    yaml_path.write_text(yaml_path.read_text().replace("labs:\n", "perf_calibrated_on: [NVIDIA H100 80GB HBM3]\nlabs:\n", 1))
    monkeypatch.setenv("LABS_GPU_MODEL", "NVIDIA L4")
    rc, out = run_pytest(toy_course, "labs/07", "--impl", "solution")
    assert rc == 0
    out.fnmatch_lines(["NOT RUN labs/07/test_toy_visible.py::test_speed: perf thresholds are not calibrated on "
                       "NVIDIA L4 (labs.yaml perf_calibrated_on: NVIDIA H100 80GB HBM3*", "*2 passed, 2 not_run*"])
    monkeypatch.setenv("LABS_GPU_MODEL", "NVIDIA H100 80GB HBM3")  # the calibrated model: perf is graded
    rc, out = run_pytest(toy_course, "labs/07", "--impl", "solution")
    out.fnmatch_lines(["*3 passed, 1 not_run*"])


def test_impl_path_accepts_checkout_and_module_folder(toy_course, tmp_path):
    for layout in ("07/toy.py", "labs/07/toy.py"):
        sub = tmp_path / layout.replace("/", "_")
        (sub / layout).parent.mkdir(parents=True)
        (sub / layout).write_text("def add(x, y=1):\n    return x + y\n")
        rc, _ = run_pytest(toy_course, "labs/07", "--impl", str(sub))
        assert rc == 0, layout


@pytest.mark.parametrize("source, message", [
    ("def add(x, y=1):\n    return (\n", "*importing toy.py failed (line 2): SyntaxError*"),
    # a signature that does not bind a grader's call fails that test only (add(3) still passes)
    ("def add(x):\n    return x + 1\n", "*add() takes 1 positional argument but 2 were given*"),
    ("def plus(x, y=1):\n    return x + y\n", "*api mismatch: add is missing (the lab 07 contract requires it)*"),
    ("import os\nos._exit(0)\n", None),
    ("raise SystemExit(0)\n", "*importing toy.py failed (line 1): SystemExit*"),
])
def test_broken_submission_fails_each_test_with_one_clear_line(toy_course, tmp_path, source, message):
    (tmp_path / "07").mkdir()
    (tmp_path / "07" / "toy.py").write_text(source)
    rc, out = run_pytest(toy_course, "labs/07", "--impl", str(tmp_path))
    if message is None:  # os._exit at import ends pytest itself: it must not look like a pass
        assert rc == 0 and not any("passed" in line for line in out.lines)
        return
    assert rc == 1
    out.fnmatch_lines([message])


def test_missing_impl_dir_is_reported(toy_course):
    rc, out = run_pytest(toy_course, "labs/07", "--impl", "no/such/dir")
    assert rc == 1
    out.fnmatch_lines(["*--impl no/such/dir: no such directory*"])


def test_seed_is_replayable_and_per_test(toy_course, tmp_path):
    grader = toy_course / "labs/07/test_seed.py"
    grader.write_text("def test_a(seed):\n    print('SEED', seed)\n\ndef test_b(seed):\n    print('SEED', seed)\n")
    seeds = []
    for _ in range(2):
        _, out = run_pytest(toy_course, "labs/07/test_seed.py", "--seed", "123", "-s")
        seeds.append([line for line in out.lines if line.startswith("SEED") or "SEED" in line])
    assert seeds[0] == seeds[1] and len(set(seeds[0])) == 2


def test_a_students_local_runs_draw_a_fresh_seed_each_time(toy_course, tmp_path):
    """`pytest labs/NN` (a student's own run) never reuses inputs: each run prints a new
    seed, even with a course secret present (that one is for grading only)."""
    (toy_course / ".labs-staff").mkdir()
    (toy_course / ".labs-staff/course-secret").write_text("a" * 64 + "\n")
    (toy_course / "labs/07/test_seed.py").write_text("def test_a(seed):\n    print('SEED', seed)\n")
    printed = set()
    for _ in range(3):
        _, out = run_pytest(toy_course, "labs/07/test_seed.py", "-s")
        printed.add(next(line for line in out.lines if line.startswith("labs: seed")))
    assert len(printed) == 3, printed


def test_results_file_records_parts_weights_outcomes_and_perf(toy_course, tmp_path):
    out = tmp_path / "r.json"
    run_pytest(toy_course, "graders/07", "--impl", "solution", "--labs-results", str(out))
    data = json.loads(out.read_text())
    assert data["finished"] and not data["errors"]
    by_name = {t["name"]: t for t in data["tests"]}
    assert by_name["test_default"]["weight"] == 2.0 and by_name["test_default"]["part"] == "A"
    assert by_name["test_on_gpu"]["outcome"] == "skipped" and by_name["test_on_gpu"]["gpu"]
    assert by_name["test_speed"]["perf"] == [{"name": "add_vs_torch", "ratio": 2.0, "figures": {"note": "toy"}}]


def test_plugin_is_inert_outside_a_course(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    assert True\n")
    rc, out = run_pytest(tmp_path, "test_x.py")
    assert rc == 0
    assert not any(line.startswith("labs:") for line in out.lines)


def test_xdist_workers_share_the_printed_seed(toy_course):
    (toy_course / "labs/07/test_seed.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(4))\ndef test_a(seed, i):\n"
        "    assert False, f'SEEDVAL {seed}'\n")

    def seeds(*args):
        _, out = run_pytest(toy_course, "labs/07/test_seed.py", "-n", "2", "-rf", *args)
        header = next(line for line in out.lines if line.startswith("labs: seed"))
        return int(header.split()[2]), sorted(line.split("SEEDVAL ")[1] for line in out.lines
                                              if line.startswith("FAILED") and "SEEDVAL" in line)

    run_seed, per_test = seeds()
    assert len(per_test) == 4 and len(set(per_test)) == 4
    assert seeds("--seed", str(run_seed)) == (run_seed, per_test)  # the printed seed replays every worker


def test_gpu_tests_of_a_triton_lab_skip_with_the_reason_on_a_triton_without_its_features(monkeypatch):
    """A GPU machine outside the course image may carry no Triton or an old one: the reason
    names which; a local run skips the lab's GPU tests with it, a graded run (--sandbox
    worker) records it as an infrastructure failure (never a student's 0; needs a GPU to run)."""
    import types

    from harness import plugin
    assert plugin._triton_missing() == ""   # the lock's Triton
    monkeypatch.setitem(sys.modules, "triton", None)
    assert plugin._triton_missing().startswith("needs Triton >= 3.0 with its CUDA backend; not importable here")
    monkeypatch.setitem(sys.modules, "triton", types.SimpleNamespace(__version__="2.1.0"))
    assert plugin._triton_missing() == "needs Triton >= 3.0; this environment has 2.1.0 (the course image pins the lock's)"
