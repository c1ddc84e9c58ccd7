"""The README's staff commands, in the README's order, in a fresh git clone of a
course: nothing they write can reach students. Then a solved stub: release and
nbgrader export both refuse and leave nothing written.

The clone is the toy course (lab 07) with this checkout's harness, README,
pyproject and lock committed in it, so it runs in seconds; the README's lab 04
is read as lab 07."""
from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import release
from tests.conftest import ROOT, TOY_SOLUTION

FRAMEWORK = ["README.md", "pyproject.toml", "Makefile", ".gitignore", "docker/requirements.lock",
             "docker/torch-cpu.txt", "docker/torch-cuda.txt"]


def labs(cwd, *args, timeout=300):
    env = {**os.environ, "LABS_PROGRESS": "off", "PYTHONPATH": str(cwd)}
    env.pop("LABS_COURSE", None)
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def staff_commands() -> list[list[str]]:
    """The `labs ...` lines of the README's staff block (after "Staff outputs go to"), in order."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("Staff outputs go to"):]
    block = block[block.index("```bash\n") + 8:]
    block = block[:block.index("```")]
    return [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.startswith("labs ")]


@pytest.fixture
def clone(toy_course, tmp_path) -> Path:
    """A git clone of the toy course committed with this checkout's framework files."""
    for rel in FRAMEWORK:
        (toy_course / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, toy_course / rel)
    shutil.copytree(ROOT / "harness", toy_course / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    git(toy_course, "init", "-q")
    git(toy_course, "add", "-A")
    git(toy_course, "commit", "-qm", "course")
    work = tmp_path / "work"
    work.mkdir()
    git(work, "clone", "-q", str(toy_course), "course")
    return work / "course"


def released_files(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def test_readme_staff_commands_in_order_leak_nothing_to_the_release(clone):
    subs = clone / "submissions"  # the README's path: inside the clone, untracked
    for student, text in (("ref", TOY_SOLUTION),):
        (subs / student / "labs/07").mkdir(parents=True)
        (subs / student / "labs/07/toy.py").write_text(text)
    (subs / "notes.txt").write_text("a stray file")
    commands = [c for c in staff_commands() if c[1] not in ("progress", "nbgrader") or c[2] == "export"]
    commands = [c for c in commands if "--gradebook" not in c]  # nbgrader's gradebook: tests/test_nbgrader.py
    assert [c[1] for c in commands] == ["gradescope", "nbgrader", "grade-all", "release"]
    for cmd in commands:
        args = [a.replace("04", "07") for a in cmd[1:]]
        if args[0] == "grade-all":
            args += ["--sandbox", "process"]
        p = labs(clone, *args)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-2000:])
        if args[0] == "gradescope":
            assert "need a GPU" in p.stderr and "Gradescope's workers have none" in p.stderr
    staff = clone / ".labs-staff"
    assert (staff / "gradescope-lab07.zip").is_file() and (staff / "nbgrader/source/lab07/lab07.ipynb").is_file()
    assert (staff / "grades-lab07/grades.csv").is_file()
    assert "unrecognised submission" in (staff / "grades-lab07/grades.csv").read_text()  # notes.txt: a row
    assert git(clone, "status", "--porcelain") == "?? submissions/\n"  # every other output is git-ignored

    out = clone.parent / "student-repo"
    files = released_files(out)
    for bad in ("graders/", "solutions/", "submissions/", ".labs-staff/", "tests/"):
        assert not any(f.startswith(bad) for f in files), bad
    assert not [f for f in files if f.endswith((".ipynb", ".zip", ".csv", ".json", ".db"))]
    generated = {"README.md", "Makefile", "pyproject.toml"}
    for f in files:
        assert f in generated or any(fnmatch.fnmatch(f, pat) for pat, _ in release.ALLOW), f
    assert not set(files) & release.STAFF_HARNESS
    assert {"labs.yaml", "labs/07/toy.py", "labs/07/test_toy_visible.py", "harness/plugin.py"} <= set(files)
    readme = (out / "README.md").read_text()
    for staff_word in ("solutions/", "graders/", "make demo", "exploits", "grade-all"):
        assert staff_word not in readme, staff_word
    assert "nbgrader" not in (out / "pyproject.toml").read_text()
    assert 'testpaths = ["labs"]' in (out / "pyproject.toml").read_text()
    assert re.findall(r"^(\w[\w-]*):", (out / "Makefile").read_text(), re.M) == ["setup", "test", "clean"]


def test_solved_stub_release_and_nbgrader_export_refuse_and_write_nothing(toy_course, tmp_path):
    (toy_course / "labs/07/toy.py").write_text(TOY_SOLUTION)
    out = tmp_path / "student-repo"
    p = labs(toy_course, "release", str(out))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[0] == ("labs: error: release refused: labs/07/toy.py looks solved: "
                                        "add raise(s) no NotImplementedError (task(s) of labs.yaml's api)")
    assert "git checkout -- labs/07/toy.py" in p.stderr and "nothing was written" in p.stderr
    nb = tmp_path / "nb"
    p = labs(toy_course, "nbgrader", "export", str(nb))
    assert p.returncode == 2 and "nbgrader export refused: labs/07/toy.py looks solved" in p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["course"]  # no OUT, no temporary folder, no nb
    # one task filled in by hand (not the reference's text) is refused as well
    (toy_course / "labs/07/toy.py").write_text('def add(x, y=1):\n    """Return x + y."""\n    return y + x\n')
    p = labs(toy_course, "release", str(out))
    assert p.returncode == 2 and "add raise(s) no NotImplementedError" in p.stderr and not out.exists()
