"""nbgrader, both ways: export the labs as an nbgrader course, and record
``labs grade-all`` scores in an nbgrader gradebook.

``labs nbgrader export COURSE/`` writes::

    COURSE/nbgrader_config.py          course id, the solution-region stub, cell timeouts
    COURSE/source/labNN/labNN.ipynb    one assignment per lab
    COURSE/labs_course/                labs.yaml, graders/NN/ (hidden), labs/NN/<stub>

Each notebook has a handout cell, the *module cell* and one *autograder tests*
cell per lab part. The module cell is ``%%writefile <module>.py`` followed by
the stub, then ``### BEGIN SOLUTION`` / the reference / ``### END SOLUTION``
(the reference comes after the stub, so its definitions win in the source
notebook); ``nbgrader generate_assignment`` removes the region and leaves the
stub, since ``nbgrader_config.py`` sets ``ClearSolutions.code_stub`` to an
empty string. Running the cell writes the student's module next to the
notebook. An autograder cell (``grade_id`` ``labNN-part-X``, ``points`` = the
part's points in ``labs.yaml``) calls ``autograde_part``, which grades that
file with the hidden graders (``harness.grading.grade``: pytest in a child
process, once per notebook run) and returns the part's points, which nbgrader
takes as partial credit.

The hidden graders are not in ``source/labNN/``: nbgrader copies every file
there into ``release/`` (and from ``autograded/`` into ``feedback/``), so they
would reach students. They live in ``COURSE/labs_course/``, which
``autograde_part`` finds by walking up from the notebook's folder
(``autograded/<student>/labNN/`` during ``nbgrader autograde``), or from
``$LABS_NBGRADER_COURSE``. The grading environment needs the harness
installed (the course's locked environment).

Trust: nbgrader runs a student's other cells in the same kernel as the
autograder cells, so a notebook can tamper with its own grade. For grades that
count, grade the submitted modules with ``labs grade-all ... --gradebook URL``
(``GradebookWriter``), which runs every submission out of process and writes
the same ``labNN-part-X`` grade cells, so formgrader and ``nbgrader export``
show them.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import click

from .manifest import Course, Lab

COURSE_DIR = "labs_course"       # the hidden graders' mini course inside the nbgrader course
ENV_COURSE = "LABS_NBGRADER_COURSE"
SCHEMA_VERSION = 3


def assignment_name(lab: Lab) -> str:
    return f"lab{lab.number}"


def module_cell_id(lab: Lab) -> str:
    return f"lab{lab.number}-module"


def part_cell_id(lab: Lab, part: str) -> str:
    return f"lab{lab.number}-part-{part}"


def require_nbgrader():
    """Import nbgrader's gradebook API, or raise ImportError saying how to get it."""
    try:
        import nbgrader.api  # noqa: F401
    except ImportError:
        raise ImportError("nbgrader is not installed (it is the optional extra `nbgrader`)") from None
    return nbgrader.api


# --- export -------------------------------------------------------------------------

_FUTURE = re.compile(r"^from __future__ import [^\n]*\n", re.M)


def module_cell_source(stub: str, reference: str, filename: str) -> str:
    """The module cell: ``%%writefile``, the stub, then the reference in a solution region.

    ``from __future__`` imports must open the file, so the reference's are dropped
    (the stub's own apply to the whole file) or, when the stub has none, hoisted
    above it."""
    hoist = "".join(f for f in _FUTURE.findall(reference) if f not in stub)
    reference = _FUTURE.sub("", reference)
    return (f"%%writefile {filename}\n{hoist}{stub.rstrip()}\n"
            f"### BEGIN SOLUTION\n{reference.strip()}\n### END SOLUTION\n")


def released_module_source(stub: str, reference: str, filename: str) -> str:
    """What the module cell holds after ``nbgrader generate_assignment`` (for checks)."""
    hoist = "".join(f for f in _FUTURE.findall(reference) if f not in stub)
    return f"%%writefile {filename}\n{hoist}{stub.rstrip()}\n"


def _cell(kind: str, source: str, nbgrader: dict | None = None) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(execution_count=None, outputs=[])
    if nbgrader is not None:
        cell["metadata"]["nbgrader"] = {"schema_version": SCHEMA_VERSION, **nbgrader}
    return cell


def lab_notebook(course: Course, lab: Lab) -> dict:
    """The source notebook (nbformat 4, as a dict) of one lab."""
    root = course.root
    stub = (root / "labs" / lab.number / lab.filename).read_text()
    reference = (root / "solutions" / lab.number / lab.filename).read_text()
    readme = root / "labs" / lab.number / "README.md"
    parts = "\n".join(f"- **Part {k}** ({p.points:g} points): {p.title}" for k, p in lab.parts.items())
    intro = (f"# Lab {lab.number}: {lab.title}\n\n"
             f"Write your implementation of `{lab.filename}` in the module cell below: replace each "
             f"`raise NotImplementedError(...)` and keep the names and signatures. Running that cell writes "
             f"`{lab.filename}` next to this notebook; `import {lab.module}` (after "
             f"`importlib.reload`) tries it out.\n\n{parts}\n\nThe cells after the module run the hidden "
             f"graders when the course staff autograde; each earns its part's points, shared among that "
             f"part's tests.")
    cells = [_cell("markdown", intro, {"grade": False, "solution": False, "locked": True,
                                       "grade_id": f"lab{lab.number}-intro"})]
    if readme.is_file():
        cells.append(_cell("markdown", readme.read_text(), {"grade": False, "solution": False, "locked": True,
                                                             "grade_id": f"lab{lab.number}-handout"}))
    cells.append(_cell("code", module_cell_source(stub, reference, lab.filename),
                       {"grade": False, "solution": True, "locked": False, "task": False,
                        "grade_id": module_cell_id(lab)}))
    cells.append(_cell("code", f"import importlib\nimport {lab.module}\n{lab.module} = importlib.reload({lab.module})"))
    for key, part in lab.parts.items():
        src = (f"# Part {key} ({part.points:g} points): {part.title}.\n"
               f"# Autograded: the hidden graders of part {key} run here (partial credit).\n"
               f"from harness.nbgrader_export import autograde_part\n"
               f"autograde_part({lab.number!r}, {key!r}, {lab.filename!r})")
        cells.append(_cell("code", src, {"grade": True, "solution": False, "locked": True, "task": False,
                                         "points": float(part.points), "grade_id": part_cell_id(lab, key)}))
    for i, cell in enumerate(cells):  # nbformat 4.5 cell ids: the grade id where there is one
        cell["id"] = cell["metadata"].get("nbgrader", {}).get("grade_id") or f"lab{lab.number}-cell-{i}"
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}}}


NBGRADER_CONFIG = '''\
"""nbgrader configuration for {name}, written by `labs nbgrader export`.

Each lab notebook's module cell holds the stub, then the reference inside
### BEGIN SOLUTION / ### END SOLUTION; releasing removes the region and
leaves the stub, so the solution stub is empty. The autograder cells grade the
whole module with the hidden graders in labs_course/ (never in source/, which
nbgrader copies to students), so they may take minutes: see Execute.timeout.
"""
c = get_config()  # noqa: F821

c.CourseDirectory.course_id = {course_id!r}
c.ClearSolutions.code_stub = {{"python": ""}}
c.Execute.timeout = {timeout}
'''


def export_course(course: Course, dest: Path, labs: list[Lab] | None = None) -> list[str]:
    """Write the nbgrader course for ``labs`` (default: every lab with a stub, a
    reference and graders) into ``dest``. Returns notes on what was skipped or kept."""
    dest.mkdir(parents=True, exist_ok=True)
    notes = []
    chosen = []
    for lab in labs or [course.labs[k] for k in sorted(course.labs)]:
        missing = [p for p in (f"labs/{lab.number}/{lab.filename}", f"solutions/{lab.number}/{lab.filename}",
                               f"graders/{lab.number}") if not (course.root / p).exists()]
        if missing:
            notes.append(f"lab {lab.number} left out: no {', '.join(missing)}")
            continue
        chosen.append(lab)
    hidden = dest / COURSE_DIR
    if hidden.exists():
        shutil.rmtree(hidden)
    (hidden / "graders").mkdir(parents=True)
    shutil.copyfile(course.root / "labs.yaml", hidden / "labs.yaml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    for lab in chosen:
        shutil.copytree(course.root / "graders" / lab.number, hidden / "graders" / lab.number, ignore=ignore)
        (hidden / "labs" / lab.number).mkdir(parents=True)
        shutil.copyfile(course.root / "labs" / lab.number / lab.filename,
                        hidden / "labs" / lab.number / lab.filename)
        nb_dir = dest / "source" / assignment_name(lab)
        nb_dir.mkdir(parents=True, exist_ok=True)
        (nb_dir / f"{assignment_name(lab)}.ipynb").write_text(json.dumps(lab_notebook(course, lab), indent=1) + "\n")
    config = dest / "nbgrader_config.py"
    if config.exists() and "ClearSolutions.code_stub" in config.read_text():
        notes.append(f"kept the existing {config.name}")
    else:
        if config.exists():
            shutil.copyfile(config, config.with_suffix(".py.bak"))
            notes.append(f"rewrote {config.name} (it did not set ClearSolutions.code_stub); the old one is "
                         f"{config.name}.bak")
        slug = re.sub(r"[^a-z0-9]+", "-", course.name.lower()).strip("-") or "labs"
        timeout = max([lab.limits.timeout_s for lab in chosen] or [1200]) + 120
        config.write_text(NBGRADER_CONFIG.format(name=course.name, course_id=slug, timeout=timeout))
    return notes


# --- autograding inside a notebook ---------------------------------------------------

_cache: dict = {}


def find_course(start: Path | None = None) -> Path:
    """The hidden graders' course: ``$LABS_NBGRADER_COURSE``, else the first
    ``labs_course/`` at or above ``start`` (default: the current directory)."""
    env = os.environ.get(ENV_COURSE)
    if env:
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        if (d / COURSE_DIR / "labs.yaml").is_file():
            return d / COURSE_DIR
    raise FileNotFoundError(f"no hidden graders: no {COURSE_DIR}/labs.yaml in {here} or above "
                            f"(they run when the course staff autograde; set {ENV_COURSE} to point elsewhere)")


def autograde_part(lab_number: str, part: str, filename: str, *, timeout_s: float | None = None) -> float:
    """Grade the module file ``filename`` (written by the module cell, in the
    current directory) with the lab's hidden graders, once per file content, and
    return part ``part``'s points (nbgrader's partial credit). Prints each test
    of the part to stdout; never writes to stderr (nbgrader scores a cell that
    does as 0)."""
    import tempfile

    from . import grading, manifest
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        course = manifest.load(find_course())
        lab = course.lab(lab_number)
        src = Path(filename).resolve()
        if not src.is_file():
            raise FileNotFoundError(f"{filename} was not written: run the module cell (%%writefile {filename})")
        digest = hashlib.sha256(src.read_bytes()).hexdigest()
        key = (str(course.root), lab.number, digest)
        if key not in _cache:
            with tempfile.TemporaryDirectory(prefix="labs-nbgrader-") as tmp, \
                    contextlib.redirect_stderr(io.StringIO()):
                (Path(tmp) / lab.number).mkdir()
                shutil.copyfile(src, Path(tmp) / lab.number / lab.filename)
                _cache[key] = grading.grade(tmp, lab, course, timeout_s=timeout_s, sandbox="process")
        result = _cache[key]
    tests = [t for t in result.tests if t.part == part]
    for note in result.notes:
        print(f"note: {note}")
    for t in tests:
        line = (t.output or "").splitlines()[0][:200] if t.output else ""
        print(f"{t.score:6.2f}/{t.max_score:<6.2f} {t.outcome:8s} {t.name}" + (f"  -- {line}" if line else ""))
    points = lab.parts[part].points
    return round(min(points, max(0.0, sum(t.score for t in tests))), 4)


# --- the gradebook ----------------------------------------------------------------------

def part_scores(results: dict) -> dict[str, float]:
    """Points per part from a Gradescope ``results.json`` (test names ``"A: test_x"``)."""
    out: dict[str, float] = {}
    for t in results.get("tests", []):
        part = t["name"].split(":", 1)[0]
        out[part] = out.get(part, 0.0) + float(t["score"])
    return out


class GradebookWriter:
    """Record ``labs grade-all`` results in an nbgrader gradebook (``Gradebook(url)``).

    The lab is assignment ``labNN`` with notebook ``labNN`` and one autograded
    grade cell ``labNN-part-X`` per part (max score = the part's points), the
    same names ``export_course`` gives the notebook's cells, so a course made by
    ``nbgrader generate_assignment`` and one made here share a gradebook. Each
    student's ``auto_score`` per part is set; the per-test breakdown is the
    auto comment on the module cell ``labNN-module``. Re-recording overwrites."""

    def __init__(self, url: str, lab: Lab):
        api = require_nbgrader()
        self.api, self.lab = api, lab
        self.gb = api.Gradebook(url)
        self.assignment = self.notebook = assignment_name(lab)
        self._ensure_structure()

    def _ensure_structure(self):
        api, gb, a, nb = self.api, self.gb, self.assignment, self.notebook
        try:
            gb.find_assignment(a)
        except api.MissingEntry:
            gb.add_assignment(a)
        try:
            gb.find_notebook(nb, a)
        except api.MissingEntry:
            gb.add_notebook(nb, a)
        for key, part in self.lab.parts.items():
            try:
                cell = gb.find_grade_cell(part_cell_id(self.lab, key), nb, a)
                if cell.max_score != float(part.points):
                    cell.max_score = float(part.points)
                    gb.db.commit()
            except api.MissingEntry:
                gb.add_grade_cell(part_cell_id(self.lab, key), nb, a, max_score=float(part.points),
                                  cell_type="code")
        try:
            gb.find_solution_cell(module_cell_id(self.lab), nb, a)
        except api.MissingEntry:
            gb.add_solution_cell(module_cell_id(self.lab), nb, a)

    def record(self, student: str, results: dict) -> None:
        api, gb, a, nb = self.api, self.gb, self.assignment, self.notebook
        gb.update_or_create_student(student)
        try:
            gb.find_submission(a, student)
        except api.MissingEntry:
            with warnings.catch_warnings():  # nbgrader's own autoflush warnings under SQLAlchemy 2
                warnings.simplefilter("ignore")
                gb.add_submission(a, student)
        scores = part_scores(results)
        for key, part in self.lab.parts.items():
            grade = gb.find_grade(part_cell_id(self.lab, key), nb, a, student)
            grade.auto_score = round(min(float(part.points), scores.get(key, 0.0)), 4)
            grade.needs_manual_grade = False
        status = results.get("extra_data", {}).get("status", "")
        lines = [f"labs grade-all: {results.get('score', 0):g} points; {status}".rstrip("; ")]
        lines += [f"{t['score']:g}/{t['max_score']:g} {t['status']} {t['name']}" for t in results.get("tests", [])]
        try:
            comment = gb.find_comment(module_cell_id(self.lab), nb, a, student)
            comment.auto_comment = "\n".join(lines)
        except api.MissingEntry:
            pass
        gb.db.commit()

    def close(self):
        self.gb.close()


# --- commands ------------------------------------------------------------------------------

@click.group("nbgrader")
def nbgrader_group():
    """nbgrader: export the labs as an nbgrader course (`grade-all --gradebook` records scores)."""


@nbgrader_group.command("export")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lab", "lab_numbers", multiple=True, help="Export only this lab (repeatable; default: all).")
@click.pass_context
def export_command(ctx, dest, lab_numbers):
    """Write an nbgrader course to DEST: nbgrader_config.py, source/labNN/labNN.ipynb
    per lab (the reference in a solution region, autograder cells per part) and the
    hidden graders in DEST/labs_course/.

    Then, in DEST: `nbgrader generate_assignment labNN`, `nbgrader autograde labNN`,
    `nbgrader formgrader`, `nbgrader generate_feedback labNN` as usual.
    """
    from .cli import _course, _lab
    course = _course(ctx)
    labs = [_lab(course, n) for n in lab_numbers] or None
    notes = export_course(course, dest, labs)
    for note in notes:
        click.echo(f"labs: note: {note}", err=True)
    written = sorted(p.relative_to(dest) for p in (dest / "source").glob("*/*.ipynb"))
    for p in written:
        click.echo(f"wrote {dest / p}")
    click.echo(f"hidden graders in {dest / COURSE_DIR}; next: cd {dest} && nbgrader generate_assignment "
               f"{written[0].parent.name if written else 'labNN'}")
