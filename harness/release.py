"""``labs release OUT/``: the student repository.

Everything in the course tree that git would track (``git ls-files``, or a walk
skipping virtual environments and caches outside a git checkout) except what is
for staff only:

* ``solutions/`` and ``graders/`` (references and hidden graders),
* ``tests/`` (the framework's own tests, its mutants and exploits: they read
  the solutions and graders), ``scripts/demo.py`` (grades the references) and
  ``.ci/``, ``.labs-staff/`` (the course's grading secret),
* anything matched by ``--exclude`` (fnmatch on the posix path).

``pyproject.toml``'s pytest ``testpaths`` then points at ``labs`` (``tests``
is gone), so a plain ``pytest`` runs the visible tests. Without the graders,
``labs grade`` in the released repository says that there are no hidden graders.
``--lab NN`` (repeatable) releases only those labs' folders. The result is
checked: no excluded path and no reference module may be in it.
"""
from __future__ import annotations

import fnmatch
import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import click

from .manifest import Course

STAFF_ONLY = ["solutions/*", "graders/*", "tests/*", "scripts/demo.py", ".ci/*", ".github/*",
              ".labs-staff/*"]  # the course secret (harness.grading.course_secret)
NEVER = {".venv", "venv", "__pycache__", ".pytest_cache", ".git", ".mypy_cache", ".ruff_cache",
         "node_modules", ".ipynb_checkpoints"}


def course_files(root: Path) -> list[str]:
    """Posix paths (relative to ``root``) of the files the course tree holds:
    tracked and untracked-but-not-ignored files in a git checkout, else a walk."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True, timeout=60).stdout
        names = [n for n in out.decode().split("\0") if n]
        top = subprocess.run(["git", "rev-parse", "--show-prefix"], cwd=root, capture_output=True,
                             text=True, check=True, timeout=60).stdout.strip()
        if top:  # the course lives in a subfolder of the repository
            names = [n[len(top):] for n in names if n.startswith(top)]
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        names = [p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()]
    return sorted(n for n in names if (root / n).is_file() and not (set(n.split("/")) & NEVER)
                  and not n.endswith(".pyc"))


def select(names: list[str], course: Course, labs: list[str] | None = None,
           exclude: list[str] = ()) -> tuple[list[str], list[str]]:
    """``(kept, dropped)``: the student files, and the staff-only ones left out."""
    patterns = STAFF_ONLY + list(exclude)
    kept, dropped = [], []
    for n in names:
        parts = n.split("/")
        staff = any(fnmatch.fnmatch(n, p) for p in patterns)
        other_lab = (labs is not None and len(parts) > 2 and parts[0] == "labs" and parts[1] not in labs)
        (dropped if staff or other_lab else kept).append(n)
    return kept, dropped


def _student_pyproject(text: str) -> str:
    return re.sub(r'^testpaths\s*=\s*\[[^\]]*\]', 'testpaths = ["labs"]', text, count=1, flags=re.M)


def release(course: Course, out: Path, *, labs: list[str] | None = None, exclude: list[str] = (),
            force: bool = False) -> tuple[list[str], list[str]]:
    """Write the student repository to ``out``. Returns ``(written, dropped)``.

    Raises FileExistsError when ``out`` is not empty (``force`` replaces it) and
    ValueError when ``out`` is inside the course tree or a check fails."""
    root = course.root.resolve()
    out = out.resolve()
    if out == root or root in out.parents:
        raise ValueError(f"{out} is inside the course tree {root}; release to a folder outside it")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise FileExistsError(f"{out} is not empty (--force replaces it)")
        shutil.rmtree(out)
    kept, dropped = select(course_files(root), course, labs, exclude)
    for n in kept:
        dest = out / n
        dest.parent.mkdir(parents=True, exist_ok=True)
        if n == "pyproject.toml":
            dest.write_text(_student_pyproject((root / n).read_text()))
        else:
            shutil.copy2(root / n, dest)
    # the check: no staff path, no copy of a reference module under any name
    refs = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in (root / "solutions").rglob("*.py")
            if p.is_file() and p.stat().st_size > 200} if (root / "solutions").is_dir() else {}
    for n in kept:
        if any(fnmatch.fnmatch(n, p) for p in STAFF_ONLY):
            raise ValueError(f"release check: staff-only {n} was copied")
        digest = hashlib.sha256((out / n).read_bytes()).hexdigest()
        if digest in refs:
            raise ValueError(f"release check: {n} is a copy of the reference {refs[digest].relative_to(root)}")
    return kept, dropped


@click.command("release")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lab", "labs", multiple=True, help="Release only this lab's folder (repeatable; default: all).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out more paths (fnmatch on the posix path).")
@click.option("--force", is_flag=True, help="Replace OUT when it is not empty.")
@click.pass_context
def release_command(ctx, out, labs, exclude, force):
    """Write the student repository to OUT: the course without solutions/, graders/,
    the framework's tests (mutants, exploits) and other staff-only files.

    In OUT, `make setup` (or `pip install -e .`) and `pytest labs/NN` run the
    visible tests on the stubs.
    """
    from .cli import LabsError, _course, _lab
    course = _course(ctx)
    numbers = [_lab(course, n).number for n in labs] or None
    try:
        kept, dropped = release(course, out, labs=numbers, exclude=list(exclude), force=force)
    except (FileExistsError, ValueError) as e:
        raise LabsError(str(e), hint="release into a new, empty folder outside the course") from None
    tops = sorted({n.split("/")[0] for n in dropped})
    click.echo(f"wrote {len(kept)} files to {out}; left out {len(dropped)} staff-only files "
               f"({', '.join(tops) if tops else 'none'})")
