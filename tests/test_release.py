"""`labs release OUT/`: the student repository holds no solutions, graders or
staff tests, builds as a package on its own, and its visible tests run on the
stubs (they fail with NotImplementedError; nothing errors at import)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import ROOT


def labs(cwd, *args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def pytest_in(repo: Path, *args, junit: Path) -> subprocess.CompletedProcess:
    """pytest in the released repository, with its own harness first on the path."""
    env = {**os.environ, "PYTHONPATH": str(repo), "LABS_PROGRESS": "off"}
    env.pop("LABS_COURSE", None)
    return subprocess.run([sys.executable, "-m", "pytest", *args, "-q", f"--junitxml={junit}",
                           "-p", "no:cacheprovider"], cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def outcomes(junit: Path) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    """(passed or skipped, failures, errors) from a JUnit XML report."""
    ok, failures, errors = [], [], []
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        f, e = case.find("failure"), case.find("error")
        if e is not None:
            errors.append((name, (e.get("message") or "") + (e.text or "")))
        elif f is not None:
            failures.append((name, (f.get("message") or "") + (f.text or "")))
        else:
            ok.append(name)
    return ok, failures, errors


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "student-repo"
    p = labs(ROOT, "release", str(out))
    assert p.returncode == 0, p.stderr
    assert "refused" in p.stdout and "  graders/ (" in p.stdout and "  labs/04/flash_attention.py\n" in p.stdout
    return out


def test_release_leaves_out_solutions_graders_and_staff_tests(released):
    files = {p.relative_to(released).as_posix() for p in released.rglob("*") if p.is_file()}
    for staff in ("solutions/", "graders/", "tests/", ".ci/"):
        assert not any(f.startswith(staff) for f in files), staff
    assert "scripts/demo.py" not in files
    assert {"labs.yaml", "pyproject.toml", "harness/plugin.py", "harness/cli/__init__.py", "labs/04/flash_attention.py"} <= files
    assert not any("__pycache__" in f or f.startswith(".venv/") for f in files)
    assert (released / "labs/04/flash_attention.py").read_text() == (ROOT / "labs/04/flash_attention.py").read_text()
    refs = {p.read_text() for p in (ROOT / "solutions").rglob("*.py")}
    assert not any((released / f).read_text(errors="replace") in refs for f in files if f.endswith(".py")
                   and (released / f).stat().st_size > 200)
    assert 'testpaths = ["labs"]' in (released / "pyproject.toml").read_text()
    assert "nbgrader" not in (released / "pyproject.toml").read_text()
    assert not files & {"harness/classroom.py", "harness/gradescope.py", "harness/nbgrader_export.py",
                        "harness/release.py", "harness/gradebook.py", "harness/scaffold.py", "harness/cli/staff.py",
                        "docs/sandbox.md", "docker/Dockerfile.cpu"}
    assert "make demo" not in (released / "README.md").read_text() and "| 04 | Flash Attention |" in \
        (released / "README.md").read_text()
    assert "demo:" not in (released / "Makefile").read_text()


def test_released_lab_04_collects_and_its_tests_fail_with_not_implemented(released, tmp_path):
    p = pytest_in(released, "labs/04", "--collect-only", junit=tmp_path / "c.xml")
    assert p.returncode in (0, 5), p.stdout[-3000:] + p.stderr[-3000:]  # 5: no visible tests yet
    assert "error" not in p.stdout.splitlines()[-1].lower(), p.stdout[-3000:]
    if p.returncode == 5:
        pytest.skip("labs/04 has no visible tests yet")
    p = pytest_in(released, "labs/04", junit=tmp_path / "r.xml")
    ok, failures, errors = outcomes(tmp_path / "r.xml")
    assert not errors, errors[:3]
    assert failures, "the stub should fail its visible tests"
    for name, text in failures:
        assert "NotImplementedError" in text, (name, text[-1500:])
    assert p.returncode == 1
    env = {**os.environ, "PYTHONPATH": str(released)}
    where = subprocess.run([sys.executable, "-c", "import harness.plugin as p; print(p.__file__)"], cwd=released,
                           env=env, capture_output=True, text=True).stdout.strip()
    assert where == str(released / "harness/plugin.py")  # the released harness ran, not the course's


def test_released_repo_builds_as_a_package(released, tmp_path):
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(released)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (wheel,) = tmp_path.glob("ai_infra_labs-*.whl")
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    assert "harness/plugin.py" in names and not any(n.startswith(("solutions/", "graders/")) for n in names)
    assert "harness/cli/submit.py" in names and not any(n.startswith("harness/server/") for n in names), \
        "students get `labs submit`, never the course server"


def test_released_cli_has_only_the_student_commands(released):
    """The student repository's `labs` lists test, grade, list, progress, reset and the
    course server's student side (login, submit, status, regrade-request); no staff command (grade-all,
    gradescope, image, nbgrader, new, release, serve, roster, calibrate)."""
    env = {**os.environ, "PYTHONPATH": str(released), "LABS_PROGRESS": "off"}
    env.pop("LABS_COURSE", None)
    p = subprocess.run([sys.executable, "-c", "import harness, sys; assert harness.__file__.startswith(sys.argv[1]); "
                        "from harness.cli import main; main(['--help'])", str(released)],
                       cwd=released, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    listed = {line.split()[0] for line in p.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"grade", "list", "progress", "reset", "test", "login", "submit", "status",
                      "regrade-request"}, listed


def test_released_labs_list_and_readme_show_the_points_that_need_a_gpu(released):
    """No silent cap in a student checkout: it has no graders to count GPU tests from, so
    release writes each lab's GPU points into its labs.yaml (``gpu_points``) and README."""
    from harness import grading, manifest
    staff = manifest.load(ROOT)
    env = {**os.environ, "PYTHONPATH": str(released), "LABS_PROGRESS": "off"}
    env.pop("LABS_COURSE", None)
    p = subprocess.run([sys.executable, "-m", "harness", "list", "--json"], cwd=released, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    shown = {r["lab"]: r["gpu_points"] for r in json.loads(p.stdout)}
    expected = {n: grading.gpu_points(staff, lab) for n, lab in staff.labs.items()}
    assert shown == pytest.approx(expected) and shown["04"] > 40, shown
    assert f"| 04 | {staff.lab('04').title} | `labs/04/flash_attention.py` | 100 | {expected['04']:g} |" in (
        released / "README.md").read_text()


def test_released_labs_grade_says_grading_happens_at_the_course_and_makes_no_secret(released):
    """A student's `labs grade` has no hidden graders: one line and a student's hint (not
    the staff hint "check graders/"), exit 1, and no .labs-staff/ secret left behind."""
    env = {**os.environ, "PYTHONPATH": str(released), "LABS_PROGRESS": "off"}
    env.pop("LABS_COURSE", None)
    env.pop("LABS_COURSE_SECRET", None)
    p = subprocess.run([sys.executable, "-m", "harness", "grade", ".", "--lab", "03"], cwd=released, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert p.stderr.splitlines()[0] == "labs: error: lab 03's hidden graders are not in a student checkout", p.stderr
    assert "`labs test 03` runs the visible tests" in p.stderr and "graders/" not in p.stderr
    assert "Traceback" not in p.stderr and not (released / ".labs-staff").exists()


def test_released_toy_lab_runs_its_visible_tests_on_the_stub(toy_course, tmp_path):
    out = tmp_path / "student"
    (toy_course / ".labs-staff").mkdir()
    (toy_course / ".labs-staff/course-secret").write_text("staff only\n")  # outside git: a walk
    p = labs(toy_course, "release", str(out))
    assert p.returncode == 0, p.stderr
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "README.md", "labs.yaml", "labs/07/test_toy_visible.py", "labs/07/toy.py"]
    (out / "harness").symlink_to(ROOT / "harness")  # the toy course has no harness of its own
    p = pytest_in(out, "labs/07", junit=tmp_path / "r.xml")
    ok, failures, errors = outcomes(tmp_path / "r.xml")
    assert p.returncode == 1 and not errors and len(failures) == 3 and len(ok) == 1
    assert all("NotImplementedError: Part A: return x + y" in text for _, text in failures)


def test_release_refuses_a_non_empty_or_inner_folder_and_filters_labs(toy_course, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    p = labs(toy_course, "release", str(tmp_path / "full"))
    assert p.returncode == 2 and "is not empty (--force replaces it)" in p.stderr
    p = labs(toy_course, "release", str(toy_course / "inside"))
    assert p.returncode == 2 and "inside the course tree" in p.stderr
    p = labs(toy_course, "release", str(tmp_path / "no/such/folder"))
    assert p.returncode == 2 and p.stderr.startswith("labs: error: OUT ") and "does not exist" in p.stderr
    assert not (tmp_path / "no").exists() and "Traceback" not in p.stderr
    p = labs(toy_course, "release", str(tmp_path / "full"), "--force", "--exclude", "labs/07/test_*")
    assert p.returncode == 0 and not (tmp_path / "full/x").exists()
    assert not (tmp_path / "full/labs/07/test_toy_visible.py").exists() and (tmp_path / "full/labs/07/toy.py").exists()
    (toy_course / "labs/08").mkdir()
    (toy_course / "labs/08/other.py").write_text("")
    p = labs(toy_course, "release", str(tmp_path / "only7"), "--lab", "07")
    assert p.returncode == 0 and not (tmp_path / "only7/labs/08").exists()
    assert "labs/08/other.py: labs/08 is not a lab in labs.yaml" in p.stdout


def test_release_refuses_a_staff_manifest_that_sets_gpu_points_and_writes_nothing(toy_course, tmp_path):
    """gpu_points is what release writes into the student labs.yaml from the graders; a staff
    labs.yaml that sets it would be appended to twice (YAML keeps the last key silently)."""
    with open(toy_course / "labs.yaml", "a") as f:
        f.write('gpu_points: {"07": 1.5}\n')
    p = labs(toy_course, "release", str(tmp_path / "student"))
    assert p.returncode == 2 and "labs.yaml sets gpu_points" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "student").exists()
