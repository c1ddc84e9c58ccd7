"""``labs release OUT/``: the student repository, as an allow-list.

A release is an ordered list of small steps; nothing is written until every
check has passed:

1. ``course_files``  the files git tracks (plus the untracked ones, only to list
                     them as refused); outside a git checkout, a walk;
2. ``select``        keep only ``ALLOW``: ``labs.yaml``, each listed lab's
                     ``labs/NN/`` (handout, stub, visible tests), the harness
                     modules students run (not ``STAFF_HARNESS``: grade-all,
                     Gradescope, nbgrader, release), ``pyproject.toml``, the lock
                     (``docker/*.lock``, ``docker/torch-*.txt``) and
                     ``.gitignore``; every other path is refused with its reason;
3. ``generated``     what is written for students instead of the staff's own:
                     ``README.md`` (``templates/student-README.md``),
                     ``Makefile`` (``templates/student.mk``: setup, test, clean)
                     ``pyproject.toml`` (pytest ``testpaths = ["labs"]``,
                     without the staff-only ``nbgrader`` extra) and ``labs.yaml``
                     with ``gpu_points`` appended (counted from the graders,
                     which the checkout lacks; validated);
4. ``check``         no kept path matches ``FORBIDDEN`` (graders, solutions,
                     notebooks, grade files, archives, staff outputs), no kept file
                     is a copy of a reference module, holds a solution region or
                     the course secret, and every released stub is a stub
                     (``impl.solved_stub``);
5. ``write``         into a temporary folder next to OUT, moved into place only
                     when complete: a refused or failed release leaves nothing at OUT.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import string
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import grading, impl as _impl, manifest
from .manifest import Course, LabPaths
from .errors import LabsError

TEMPLATES = Path(__file__).resolve().parent / "templates"
# (pattern, what it is): fnmatch on the posix path; labs/NN/ only for labs in labs.yaml (and --lab)
ALLOW = [("labs.yaml", "the course manifest"), ("labs/*/*", "a lab: handout, stub, visible tests"),
         ("harness/*.py", "the framework"), ("harness/sandbox/*.py", "the framework"), ("harness/cli/*.py", "the framework"),
         ("pyproject.toml", "the package (rewritten for students)"), ("docker/*.lock", "the lock"),
         ("docker/torch-*.txt", "the lock"), (".gitignore", "git's ignore list")]
STAFF_HARNESS = {"harness/classroom.py", "harness/gradescope.py", "harness/nbgrader_export.py", "harness/gradebook.py",
                 "harness/release.py", "harness/scaffold.py", "harness/cli/staff.py", "harness/cli/server.py",
                 "harness/calibrate.py"}
STAFF_PACKAGES = ("harness/server/",)  # the course server: staff only; the student CLI goes without them
FORBIDDEN = ["solutions/*", "graders/*", "tests/*", f"{manifest.STAFF_DIR}/*", "*.ipynb", "*.zip", "*.db",
             "*grades*.csv", "*results*.json", "*submissions/*", "scripts/demo.py", "harness/templates/*"]
REASONS = {"solutions": "reference solutions", "graders": "hidden graders",
           "tests": "the framework's own tests, mutants and exploits", manifest.STAFF_DIR: "staff outputs and the grading secret",
           "scripts": "staff scripts (make demo)", "docs": "staff documentation", ".ci": "CI",
           "README.md": "the staff README (a student README is written instead)",
           "Makefile": "the staff Makefile (a student Makefile is written instead)"}
GROUPED = set(REASONS.values()) | {"not tracked by git", "--exclude"}  # listed per top folder, not per file
NEVER = {".venv", "venv", "__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache",
         "node_modules", ".ipynb_checkpoints"}


class ReleaseError(LabsError):
    """The release was refused (a check failed) or could not be written; nothing is at OUT."""


def course_files(root: Path) -> tuple[list[str], set[str]]:
    """``(names, untracked)``: posix paths (relative to ``root``) of the course's files, and
    those git does not track (ignored files are not listed). Outside git: a walk, all tracked."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, check=True, timeout=60).stdout.decode()
    try:  # paths relative to root, also when the course is a subfolder of its repository
        tracked = set(git("ls-files", "-z", "--cached").split("\0")) - {""}
        others = set(git("ls-files", "-z", "--others", "--exclude-standard").split("\0")) - {""}
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        tracked, others = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}, set()
    keep = lambda n: (root / n).is_file() and not (set(n.split("/")) & NEVER) and not n.endswith(".pyc")
    return sorted(n for n in tracked | others if keep(n)), {n for n in others if keep(n)}


def select(names: list[str], untracked: set[str], course: Course, labs: list[str] | None = None,
           exclude: list[str] = ()) -> tuple[list[str], dict[str, str]]:
    """``(kept, refused)``: the allow-listed student files, and every other path with its reason."""
    kept, refused = [], {}
    wanted = set(labs if labs is not None else course.labs)
    for n in names:
        parts = n.split("/")
        rule = next((why for pat, why in ALLOW if fnmatch.fnmatch(n, pat)), None)
        if n in untracked:
            refused[n] = "not tracked by git"
        elif any(fnmatch.fnmatch(n, p) for p in exclude):
            refused[n] = "--exclude"
        elif rule is None or n in STAFF_HARNESS or n.startswith(STAFF_PACKAGES):
            staff = n in STAFF_HARNESS or n.startswith(STAFF_PACKAGES)
            refused[n] = REASONS.get(parts[0]) or ("staff commands" if staff else "not on the allow-list")
        elif parts[0] == "labs" and parts[1] not in wanted:
            refused[n] = f"lab {parts[1]} is not released" if parts[1] in course.labs else \
                f"labs/{parts[1]} is not a lab in labs.yaml"
        else:
            kept.append(n)
    return kept, refused


def student_pyproject(text: str) -> str:
    """The staff ``pyproject.toml`` for students: ``pytest`` runs ``labs``, no staff-only extra
    or import contract."""
    text = re.sub(r'^(#[^\n]*\n)?testpaths\s*=[^\n]*$',
                  '# `pytest` runs every lab\'s visible tests; `pytest labs/NN` those of one lab.\ntestpaths = ["labs"]',
                  text, count=1, flags=re.M)
    text = re.sub(r'^norecursedirs\s*=.*$', 'norecursedirs = [".venv"]', text, count=1, flags=re.M)
    text = re.sub(r'^(#[^\n]*\n)?nbgrader\s*=[^\n]*\n', '', text, flags=re.M)  # the extra and its comment
    text = re.sub(r'^(#[^\n]*\n)?server\s*=\s*\[(?:[^\n]*\n)*?[^\n]*\]\s*\n', '', text, flags=re.M)  # the server's extra
    # the server's and the staff templates' packages (left out of a release), and their package data
    text = re.sub(r',\s*"harness\.(?:server|templates)[\w.]*"', '', text)
    text = re.sub(r'^"harness\.(?:server|templates)[^\n]*\n', '', text, flags=re.M)
    # the staff's layer contract (`lint-imports`): it names the staff modules a release leaves out
    text = re.sub(r'^(#[^\n]*\n)*\[\[?tool\.importlinter[^\n]*\n(?:(?!\[)[^\n]*(?:\n|$))*', '', text, flags=re.M)
    return re.sub(r'^\s*"docker:[^\n]*\n', '', text, flags=re.M)  # a marker of the framework's tests


def student_manifest(course: Course, text: str, gpu: dict[str, float]) -> str:
    """The course's ``labs.yaml`` with ``gpu_points`` appended: a student checkout has no
    graders to count the points that need a GPU from (``labs list`` shows them). Raises
    ReleaseError when the staff manifest already sets them or the result does not validate."""
    if course.gpu_points:
        raise ReleaseError("release refused: labs.yaml sets gpu_points, which labs release writes from the graders",
                           hint="remove gpu_points from labs.yaml (a staff tree counts them from graders/)")
    lines = ", ".join(f'"{n}": {p:g}' for n, p in sorted(gpu.items()))
    out = (text.rstrip("\n") + "\n\n# written by `labs release`: the points of each lab that only a GPU can earn "
           "(tests the hidden graders run on a GPU)\n" + f"gpu_points: {{{lines}}}\n")
    try:
        Course(**yaml.safe_load(out))
    except (yaml.YAMLError, ValueError, TypeError) as e:
        raise ReleaseError(f"release refused: the student labs.yaml does not validate: {e}") from None
    return out


def student_readme(course: Course, labs: list[str], gpu: dict[str, float]) -> str:
    rows = "\n".join(f"| {n} | {course.labs[n].title} | `{LabPaths.of(course.labs[n]).stub}` | "
                     f"{course.labs[n].points:g} | {gpu[n]:g} |" for n in labs)
    tpl = string.Template((TEMPLATES / "student-README.md").read_text())
    return tpl.substitute(course=course.name, labs=rows, first=labs[0] if labs else "01")


@dataclass
class Plan:
    """What a release writes (``files``: path -> bytes) and what it refused (path -> reason)."""
    files: dict[str, bytes] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)


def plan(course: Course, labs: list[str] | None = None, exclude: list[str] = ()) -> Plan:
    """Steps 1-4 (see the module docstring): every byte to write, checked; raises ReleaseError."""
    root = course.root.resolve()
    names, untracked = course_files(root)
    kept, refused = select(names, untracked, course, labs, exclude)
    files = {n: (root / n).read_bytes() for n in kept}
    released = sorted({n.split("/")[1] for n in kept if n.startswith("labs/")})
    if "pyproject.toml" in files:
        files["pyproject.toml"] = student_pyproject(files["pyproject.toml"].decode()).encode()
    gpu = {n: grading.gpu_points(course, course.labs[n]) for n in released}
    if "labs.yaml" in files:
        files["labs.yaml"] = student_manifest(course, files["labs.yaml"].decode(), gpu).encode()
    files["README.md"] = student_readme(course, released, gpu).encode()
    if (root / "Makefile").is_file():
        files["Makefile"] = (TEMPLATES / "student.mk").read_bytes()
    check(course, files, released)
    return Plan(files, refused)


def check(course: Course, files: dict[str, bytes], released: list[str]) -> None:
    """Step 4: raise ReleaseError naming the first problem (see the module docstring)."""
    root = course.root
    for lab in (course.labs[n] for n in released):
        stub = LabPaths.of(lab).stub
        if stub.as_posix() in files:
            why = _impl.solved_stub(course, lab)
            if why:
                raise ReleaseError(f"release refused: {why}",
                                   hint=f"restore the stub (git checkout -- {stub}, "
                                        f"or git stash), then release again; nothing was written")
    refs = {hashlib.sha256(p.read_bytes()).hexdigest(): p.relative_to(root).as_posix()
            for p in (root / "solutions").rglob("*.py") if p.is_file() and p.stat().st_size > 200}
    secret = (root / manifest.STAFF_DIR / "course-secret")
    secret = secret.read_bytes().strip() if secret.is_file() else b""
    for n, data in files.items():
        bad = next((p for p in FORBIDDEN if fnmatch.fnmatch(n, p)), None)
        why = (f"{n} matches the staff-only pattern {bad}" if bad else
               f"{n} is a copy of the reference {refs[d]}" if (d := hashlib.sha256(data).hexdigest()) in refs else
               f"{n} holds a solution region (### BEGIN SOLUTION)" if b"### BEGIN SOLUTION" in data else
               f"{n} holds the course's grading secret" if secret and secret in data else "")
        if why:
            raise ReleaseError(f"release refused: {why}", hint=f"move {n} out of the course tree (or git rm it), "
                                                               f"then release again; nothing was written")


def write(out: Path, files: dict[str, bytes]) -> None:
    """Step 5: write ``files`` into a temporary folder next to ``out``, then move it into place."""
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-"))
    old = None
    try:
        for n, data in files.items():
            dest = tmp / n
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        if out.exists():
            old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
            os.rename(out, old)  # onto the empty folder just made
        os.rename(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not out.exists():
            os.rename(old, out)
        raise ReleaseError(f"cannot write {out}: {e}") from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def release(course: Course, out: Path, *, labs: list[str] | None = None, exclude: list[str] = (),
            force: bool = False) -> Plan:
    """Write the student repository to ``out`` (see the module docstring); returns the plan.
    Raises ReleaseError (nothing written) for a bad ``out`` or a failed check."""
    root = course.root.resolve()
    out = out.resolve()
    if out == root or root in out.parents:
        raise ReleaseError(f"OUT {out} is inside the course tree {root}", hint="release to a folder outside it")
    if not out.parent.is_dir():
        raise ReleaseError(f"OUT {out}: the folder {out.parent} does not exist", hint="create it first")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not force)):
        raise ReleaseError(f"OUT {out} is not empty (--force replaces it)",
                           hint="release into a new, empty folder outside the course")
    p = plan(course, labs, exclude)
    write(out, p.files)
    return p
