"""nbgrader: export the labs as an nbgrader course, and collect the submitted
modules; ``harness.gradebook`` records the sandboxed grader's scores.

Grades never come from a notebook kernel. nbgrader's autograde runs every cell
of a student's notebook in one kernel, so an earlier cell can patch whatever a
later cell calls (this module, pytest, ``subprocess``, builtins, IPython's
display hooks); a score computed or printed there is worth nothing. So the
exported notebooks have *no* nbgrader grade cells: ``nbgrader autograde``
computes no points from them, and the only grade cells of the gradebook are the
ones ``labs grade-all --gradebook`` writes (``harness.gradebook``) after grading
each module, taken as text from the notebook file, in the sandbox.

The instructor's path to grades (in the nbgrader course ``COURSE/``)::

    labs nbgrader export COURSE/                      # once, in the labs course checkout
    cd COURSE && nbgrader generate_assignment labNN   # release/labNN/labNN.ipynb: the stub
    nbgrader collect labNN                            # (or zip_collect) -> submitted/<student>/labNN/
    labs nbgrader collect-modules COURSE/ --lab NN    # -> COURSE/labs_modules/labNN/<student>/NN/<module>.py
    labs grade-all COURSE/labs_modules/labNN --lab NN --gradebook sqlite:///COURSE/gradebook.db
    nbgrader export / formgrader                      # show those scores

``labs nbgrader export COURSE/`` writes::

    COURSE/nbgrader_config.py          course id, the solution-region stub, cell timeouts, ignored files
    COURSE/source/labNN/labNN.ipynb    one assignment per lab
    COURSE/labs_course/                labs.yaml, graders/NN/ (hidden), labs/NN/<stub>

Each notebook has a handout cell (the lab's README without its checkout-only
"Quick start"), the *module cell* and one *feedback* cell per lab part. The
module cell is ``%%writefile <module>.py`` followed by the stub, then ``###
BEGIN SOLUTION`` / the reference / ``### END SOLUTION`` (the reference comes
after the stub, so its definitions win in the source notebook); ``nbgrader
generate_assignment`` removes the region and leaves the stub, since
``nbgrader_config.py`` sets ``ClearSolutions.code_stub`` to an empty string.
The module cell's text (less its ``%%writefile`` line) is the submission:
``collect_modules`` extracts it without running anything.

Running a *source* notebook (``nbgrader validate``, Run All) writes its module
file -- the full reference -- into ``source/labNN/``, and nbgrader copies every
file there into ``release/labNN/``. So ``nbgrader_config.py`` adds every lab's
module file name (and ``__pycache__``, ``*.pyc``) to ``CourseDirectory.ignore``,
in a block each export rewrites (added to a config it otherwise keeps), and an
export removes a module file left in ``source/labNN/``.

A feedback cell (locked, not a grade cell) calls ``feedback_part`` (in a kernel
without the ``harness`` package it prints one line saying so), which grades
the written module file with the hidden graders when they are there (during a
staff ``nbgrader autograde``, for ``generate_feedback``) and prints the part's
tests under a "feedback only" banner; it returns nothing and counts for nothing.
The hidden graders are not in ``source/labNN/``: nbgrader copies every file
there to students. They live in ``COURSE/labs_course/``, found by walking up
from the notebook's folder or from ``$LABS_NBGRADER_COURSE``. Note that
``nbgrader autograde`` itself runs student cells outside the sandbox, on the
staff machine, where ``labs_course/`` and ``submitted/`` are readable: it is
optional (feedback only) and belongs in the course container, if used at all.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path


from . import grading, impl as _impl, manifest
from .manifest import Course, Lab, LabPaths
from .errors import LabsError
from .gradebook import assignment_name, module_cell_id, part_cell_id, require_nbgrader  # noqa: F401

COURSE_DIR = "labs_course"       # the hidden graders' mini course inside the nbgrader course
MODULES_DIR = "labs_modules"     # collect-modules' default output, COURSE/labs_modules/labNN/
ENV_COURSE = "LABS_NBGRADER_COURSE"
SCHEMA_VERSION = 3
MAX_NOTEBOOK_BYTES = 50 << 20    # a bigger submitted notebook is not read
FEEDBACK_ONLY = "Feedback only: this does not count. Your grade comes from the course's sandboxed grader."
NO_HARNESS = ("No feedback here: the course's `harness` package cannot be imported in this kernel; "
              "your module cell is graded after you submit.")


class ExportError(LabsError):
    """The export was refused (a lab's stub looks solved); nothing was written."""


def feedback_cell_id(lab: Lab, part: str) -> str:
    return f"lab{lab.number}-feedback-{part}"


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


_QUICK_START = re.compile(r"^## Quick start\n(.*?)(?=^## |\Z)", re.M | re.S)
_FENCED = re.compile(r"^```.*?^```[ \t]*(\n|\Z)", re.M | re.S)
_GRADER = "the course's grader"


def _phrase(pattern: str) -> re.Pattern:
    """A README phrase as a regex whose spaces match any run of whitespace (a phrase may
    be wrapped across lines)."""
    return re.compile(pattern.replace(" ", r"\s+"))


# A notebook student has no checkout, no visible tests and no pytest plugin: the README's
# commands, paths and pytest-only behaviour said in a notebook's words. Applied in order;
# each phrase keeps its sentence's grammar (a command is one thing: "the course's grader
# runs", never "the tests runs").
_CHECKOUT_WORDS = [
    # "`pytest labs/07` and the graders run ..." / "under `pytest` and the graders on CPU"
    (_phrase(r"`pytest(?: labs/\d\d[^`]*)?` and the graders"), "the graders"),
    (_phrase(r"`pytest labs/\d\d[^`]*`"), _GRADER),
    (_phrase(r"`labs (?:grade|test)\b[^`]*`"), _GRADER),
    # the course's pytest plugin sets an environment variable: here the student does
    (_phrase(r"the course's pytest plugin sets `([A-Za-z_]\w*)=([^`]*)`"),
     r'set `\1=\2` yourself (in this notebook: `os.environ["\1"] = "\2"`, in a cell you run first)'),
    (_phrase(r"[Oo]utside pytest,? set it yourself"), "Outside a notebook, set it in the shell"),
    (_phrase(r"in your own scripts outside pytest"), "in this notebook and in your own scripts"),
    (_phrase(r"[Oo]utside pytest"), "In this notebook"),
    # the module's path in the checkout: the module cell
    (re.compile(r"\(`labs/\d\d/([A-Za-z_]\w*\.py)`\)"), r"(`\1`, the module cell)"),
    (re.compile(r"`labs/\d\d/([A-Za-z_]\w*\.py)`"), r"`\1` (the module cell)"),
]


def _quick_start(m: re.Match) -> str:
    """The "Quick start" section without its commands (a checkout's), keeping its prose
    (what to edit, what is done for you) under a heading of its own."""
    prose = _FENCED.sub("", m.group(1)).strip()
    return f"## Your module\n\n{prose}\n\n" if prose else ""


def notebook_handout(readme: str) -> str:
    """The lab's README for a notebook student: its "Quick start" commands left out
    (their prose kept), and the checkout's commands, paths and pytest-only behaviour
    (``pytest labs/NN``, ``labs grade``, ``labs/NN/<module>.py``, what the course's
    pytest plugin does) said in a notebook's words."""
    text = _QUICK_START.sub(_quick_start, readme)
    for pattern, words in _CHECKOUT_WORDS:
        text = pattern.sub(words, text)
    # a replacement that starts a sentence or a paragraph starts with a capital
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2)[0].upper() + m.group(2)[1:], text)


_SENTENCE_START = re.compile(r"((?:^|\n\n|^#+ [^\n]*\n|[.!?] )\s*)(the (?:graders|course's grader))", re.M)


def feedback_cell_source(lab: Lab, key: str) -> str:
    part = lab.parts[key]
    return (f"# FEEDBACK ONLY, part {key} ({part.points:g} points): {part.title}.\n"
            f"# This cell does not count: your grade comes from the course's sandboxed grader,\n"
            f"# which grades the module cell above (its text, as submitted) after you submit.\n"
            f"try:\n"
            f"    from harness.nbgrader_export import feedback_part\n"
            f"except ImportError as e:  # a kernel without the course's harness package\n"
            f"    print({NO_HARNESS!r}, f'({{e}})')\n"
            f"else:\n"
            f"    feedback_part({lab.number!r}, {key!r}, {lab.filename!r})\n")


def lab_notebook(course: Course, lab: Lab) -> dict:
    """The source notebook (nbformat 4, as a dict) of one lab: intro, handout,
    module cell, a reload cell, then one feedback cell per part. No cell is an
    nbgrader grade cell, so ``nbgrader autograde`` computes no points from it."""
    paths = course.paths(lab)
    stub, reference, readme = paths.stub.read_text(), paths.reference.read_text(), paths.handout
    parts = "\n".join(f"- **Part {k}** ({p.points:g} points): {p.title}" for k, p in lab.parts.items())
    intro = (f"# Lab {lab.number}: {lab.title}\n\n"
             f"Write your implementation of `{lab.filename}` in the module cell below: replace each "
             f"`raise NotImplementedError(...)` and keep the names and signatures. Running that cell writes "
             f"`{lab.filename}` next to this notebook; `import {lab.module}` (after "
             f"`importlib.reload`) tries it out.\n\n{parts}\n\n"
             f"**How you are graded.** After you submit, the course staff take the text of the module cell "
             f"(only that cell: keep all of `{lab.filename}` in it) and grade it with the hidden graders in "
             f"the course's sandboxed grader. Nothing else in this notebook counts: the feedback cells at "
             f"the end only show test results, and only where the hidden graders are installed (when the "
             f"staff run them for feedback). The handout below is the lab's README, in a notebook's words: "
             f"its `{lab.filename}` is the module cell.")
    cells = [_cell("markdown", intro, {"grade": False, "solution": False, "locked": True,
                                       "grade_id": f"lab{lab.number}-intro"})]
    if readme.is_file():
        cells.append(_cell("markdown", notebook_handout(readme.read_text()),
                           {"grade": False, "solution": False, "locked": True,
                            "grade_id": f"lab{lab.number}-handout"}))
    cells.append(_cell("code", module_cell_source(stub, reference, lab.filename),
                       {"grade": False, "solution": True, "locked": False, "task": False,
                        "grade_id": module_cell_id(lab)}))
    cells.append(_cell("code", f"import importlib\nimport {lab.module}\n{lab.module} = importlib.reload({lab.module})"))
    cells.append(_cell("markdown", f"## Feedback (does not count)\n\n{FEEDBACK_ONLY}",
                       {"grade": False, "solution": False, "locked": True,
                        "grade_id": f"lab{lab.number}-feedback"}))
    for key in lab.parts:
        cells.append(_cell("code", feedback_cell_source(lab, key),
                           {"grade": False, "solution": False, "locked": True, "task": False,
                            "grade_id": feedback_cell_id(lab, key)}))
    for i, cell in enumerate(cells):  # nbformat 4.5 cell ids: the grade id where there is one
        cell["id"] = cell["metadata"].get("nbgrader", {}).get("grade_id") or f"lab{lab.number}-cell-{i}"
    return {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}}}


NBGRADER_CONFIG = '''\
"""nbgrader configuration for {name}, written by `labs nbgrader export`.

Each lab notebook's module cell holds the stub, then the reference inside
### BEGIN SOLUTION / ### END SOLUTION; releasing removes the region and
leaves the stub, so the solution stub is empty.

The notebooks have no grade cells: `nbgrader autograde` records no points.
Grades come from the sandboxed grader, outside any notebook kernel:
    labs nbgrader collect-modules COURSE/ --lab NN
    labs grade-all COURSE/labs_modules/labNN --lab NN --gradebook sqlite:///COURSE/gradebook.db
`nbgrader autograde` is optional, for feedback only: its feedback cells grade
the module with the hidden graders in labs_course/ (never in source/, which
nbgrader copies to students), so they may take minutes: see Execute.timeout.
It runs student code outside the sandbox: use it in the course container.
"""
c = get_config()  # noqa: F821

c.CourseDirectory.course_id = {course_id!r}
c.ClearSolutions.code_stub = {{"python": ""}}
c.Execute.timeout = {timeout}

{ignore}'''

IGNORE_BEGIN = "# >>> labs nbgrader export: files nbgrader never copies (each export rewrites this block)"
IGNORE_END = "# <<< labs nbgrader export"
_IGNORE_BLOCK = re.compile(rf"^{re.escape(IGNORE_BEGIN)}\n.*?^{re.escape(IGNORE_END)}[^\n]*\n?", re.M | re.S)


def ignored_files(course: Course) -> list[str]:
    """What nbgrader must never copy out of ``source/labNN/`` (into ``release/``, or into
    ``autograded/``): each lab's module file, which running the source notebook's
    module cell writes next to it (the full reference), and its bytecode."""
    return ["__pycache__", "*.pyc", *sorted({lab.filename for lab in course.labs.values()})]


def ignore_block(course: Course) -> str:
    """The config lines adding ``ignored_files`` to ``CourseDirectory.ignore`` (nbgrader's
    defaults, or whatever the config set above them)."""
    return (f"{IGNORE_BEGIN}\n"
            f"# Running a source notebook (nbgrader validate, Run All) writes its module file, the full\n"
            f"# reference with its solution region, into source/labNN/; nbgrader copies every file there\n"
            f"# to students unless it is ignored. (A student's own module file is ignored too: the\n"
            f"# module cell's text is the submission.)\n"
            f"c.CourseDirectory.ignore.extend({ignored_files(course)!r})\n"
            f"{IGNORE_END}\n")


def with_ignore_block(config: str, course: Course) -> str:
    """``config`` (an nbgrader_config.py's text) with its ignore block rewritten, or appended."""
    block = ignore_block(course)
    if _IGNORE_BLOCK.search(config):
        return _IGNORE_BLOCK.sub(lambda _: block, config, count=1)
    return config.rstrip("\n") + "\n\n" + block


def export_course(course: Course, dest: Path, labs: list[Lab] | None = None) -> list[str]:
    """Write the nbgrader course for ``labs`` (default: every lab with a stub, a
    reference and graders) into ``dest``. Returns notes on what was skipped or kept."""
    notes = []
    chosen = []
    for lab in labs or [course.labs[k] for k in sorted(course.labs)]:
        paths = course.paths(lab)
        missing = [p.relative_to(course.root).as_posix() for p in (paths.stub, paths.reference, paths.graders)
                   if not p.exists()]
        if missing:
            notes.append(f"lab {lab.number} left out: no {', '.join(missing)}")
            continue
        chosen.append(lab)
    for lab in chosen:  # checked before anything is written: a solved stub would be what students get
        why = _impl.solved_stub(course, lab)
        if why:
            raise ExportError(f"nbgrader export refused: {why}")
    dest.mkdir(exist_ok=True)
    hidden = dest / COURSE_DIR
    if hidden.exists():
        shutil.rmtree(hidden)
    (hidden / "graders").mkdir(parents=True)
    shutil.copyfile(course.root / "labs.yaml", hidden / "labs.yaml")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
    for lab in chosen:
        paths, copy = course.paths(lab), LabPaths.of(lab, hidden)
        shutil.copytree(paths.graders, copy.graders, ignore=ignore)
        copy.folder.mkdir(parents=True)
        shutil.copyfile(paths.stub, copy.stub)
        nb_dir = dest / "source" / assignment_name(lab)
        nb_dir.mkdir(parents=True, exist_ok=True)
        for leaked in (dest / "release" / assignment_name(lab) / lab.filename,):  # from an export before the fix
            if leaked.is_file():
                notes.append(f"{leaked.relative_to(dest)} exists: it is likely the reference, copied there by "
                             f"generate_assignment from an older export; delete it and regenerate before releasing")
        stale = nb_dir / lab.filename  # written by running the source notebook: the reference
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
            notes.append(f"removed {stale.relative_to(dest)} (the reference, written by running the source "
                         f"notebook); nbgrader_config.py makes nbgrader ignore it")
        (nb_dir / f"{assignment_name(lab)}.ipynb").write_text(json.dumps(lab_notebook(course, lab), indent=1) + "\n")
        for data in sorted(d for d in paths.folder.iterdir() if d.is_dir() and not d.name.startswith((".", "__"))):
            # what the lab ships beside its module (labs/16/data/): next to the notebook, where the
            # module the notebook writes finds it, and released with it by nbgrader
            shutil.copytree(data, nb_dir / data.name, ignore=ignore, dirs_exist_ok=True)
    config = dest / "nbgrader_config.py"
    text = config.read_text() if config.exists() else ""
    if "ClearSolutions.code_stub" in text:
        updated = with_ignore_block(text, course)
        if updated == text:
            notes.append(f"kept the existing {config.name}")
        elif IGNORE_BEGIN in text:
            config.write_text(updated)
            notes.append(f"kept the existing {config.name}; rewrote its ignored files")
        else:
            shutil.copyfile(config, config.with_suffix(".py.bak"))
            config.write_text(updated)
            notes.append(f"kept the existing {config.name}, adding the module files to CourseDirectory.ignore "
                         f"(so the reference never reaches release/); the old one is {config.name}.bak")
    else:
        if config.exists():
            shutil.copyfile(config, config.with_suffix(".py.bak"))
            notes.append(f"rewrote {config.name} (it did not set ClearSolutions.code_stub); the old one is "
                         f"{config.name}.bak")
        slug = re.sub(r"[^a-z0-9]+", "-", course.name.lower()).strip("-") or "labs"
        timeout = max([lab.limits.timeout_s for lab in chosen] or [1200]) + 120
        config.write_text(NBGRADER_CONFIG.format(name=course.name, course_id=slug, timeout=timeout,
                                                 ignore=ignore_block(course)))
    return notes


# --- feedback inside a notebook (counts for nothing) ----------------------------------

_cache: dict = {}


def find_course(start: Path | None = None) -> Path:
    """The hidden graders' course: ``$LABS_NBGRADER_COURSE``, else the first
    ``labs_course/`` at or above ``start`` (default: the current directory)."""
    env = os.environ.get(ENV_COURSE)
    if env:
        if not (Path(env) / "labs.yaml").is_file():
            raise FileNotFoundError(f"no hidden graders: ${ENV_COURSE} is {env}, which has no labs.yaml")
        return Path(env)
    here = (start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        if (d / COURSE_DIR / "labs.yaml").is_file():
            return d / COURSE_DIR
    raise FileNotFoundError(f"no hidden graders: no {COURSE_DIR}/labs.yaml in {here} or above")


def feedback_part(lab_number: str, part: str, filename: str, *, timeout_s: float | None = None) -> None:
    """Print feedback on part ``part``: the module file ``filename`` (written by
    the module cell, in the current directory) graded with the lab's hidden
    graders (``harness.grading.grade``, once per file content), when they are
    installed here. Returns nothing, and never counts: this runs in the
    student's kernel, where any earlier cell can change what it does. Never
    writes to stderr and never raises for the student's fault."""
    print(FEEDBACK_ONLY)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            course = manifest.load(find_course())
    except FileNotFoundError:
        print("The hidden graders are not installed here, so there is no feedback to show; "
              "they grade your module cell after you submit.")
        return
    lab = course.lab(lab_number)
    src = Path(filename).resolve()
    if not src.is_file():
        print(f"{filename} was not written: run the module cell (%%writefile {filename}) first.")
        return
    key = (str(course.root), lab.number, hashlib.sha256(src.read_bytes()).hexdigest())
    if key not in _cache:
        with tempfile.TemporaryDirectory(prefix="labs-nbgrader-") as tmp, \
                contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            staged = LabPaths.of(lab).in_impl(tmp)
            staged.parent.mkdir()
            shutil.copyfile(src, staged)
            try:
                _cache[key] = grading.grade(tmp, lab, course, timeout_s=timeout_s, sandbox="process")
            except grading.GradingError as e:
                print(f"feedback could not be computed: {e}")
                return
    result = _cache[key]
    for note in result.notes:
        print(f"note: {note}")
    for t in (t for t in result.tests if t.part == part):
        line = (t.output or "").splitlines()[0][:200] if t.output else ""
        print(f"{t.score:6.2f}/{t.max_score:<6.2f} {t.outcome:8s} {t.name}" + (f"  -- {line}" if line else ""))


# --- collecting the submitted modules (no notebook is run) ---------------------------------

def _text(source) -> str:
    return source if isinstance(source, str) else "".join(s for s in source if isinstance(s, str))


def module_source(nb: dict, lab: Lab) -> str | None:
    """The submission in a notebook (parsed JSON): the body of its module cell,
    i.e. what running ``%%writefile <module>.py`` would write. The module cell is
    the first code cell whose nbgrader ``grade_id`` is ``labNN-module``, else
    the first code cell opening with ``%%writefile <module>.py``; ``None`` when
    there is none. Other cells are ignored: they are not the module."""
    code = [c for c in nb.get("cells") or [] if isinstance(c, dict) and c.get("cell_type") == "code"]

    def grade_id(c):
        meta = c.get("metadata")
        nbg = meta.get("nbgrader") if isinstance(meta, dict) else None
        return nbg.get("grade_id") if isinstance(nbg, dict) else None

    def writes_module(c):
        words = _text(c.get("source", "")).split("\n", 1)[0].split()
        return words[:1] == ["%%writefile"] and words[-1:] == [lab.filename]

    cell = next((c for c in code if grade_id(c) == module_cell_id(lab)), None) \
        or next((c for c in code if writes_module(c)), None)
    if cell is None:
        return None
    text = _text(cell.get("source", ""))
    first, _, body = text.partition("\n")
    return body if first.split()[:1] == ["%%writefile"] else text


def collect_modules(nb_root: Path, lab: Lab, out: Path) -> tuple[list[str], list[str]]:
    """Write ``out/<student>/NN/<module>.py`` from each ``nb_root/submitted/<student>/labNN/labNN.ipynb``
    (``module_source``; nothing is executed), ready for ``labs grade-all out/``.
    A student whose notebook is missing, unreadable or has no module cell gets an
    empty folder (grade-all: "no module"). Each student's folder is rewritten.
    Returns (students, notes)."""
    name = assignment_name(lab)
    submitted = nb_root / "submitted"
    if not submitted.is_dir():
        raise FileNotFoundError(f"{submitted} does not exist: run `nbgrader collect {name}` first")
    students, notes = [], []
    for d in sorted(submitted.iterdir()):
        if not d.is_dir() or d.name.startswith(".") or not (d / name).is_dir():
            continue
        dest = out / d.name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        students.append(d.name)
        nb_path = d / name / f"{name}.ipynb"
        try:
            if not nb_path.is_file() or nb_path.is_symlink():
                raise ValueError(f"no {name}.ipynb")
            if nb_path.stat().st_size > MAX_NOTEBOOK_BYTES:
                raise ValueError(f"{name}.ipynb is over {MAX_NOTEBOOK_BYTES >> 20} MiB")
            nb = json.loads(nb_path.read_text(encoding="utf-8"))
            body = module_source(nb, lab) if isinstance(nb, dict) else None
            if body is None:
                raise ValueError(f"no module cell ({module_cell_id(lab)} or %%writefile {lab.filename})")
        except (OSError, ValueError, TypeError, AttributeError, RecursionError) as e:
            notes.append(f"{d.name}: {e}")
            continue
        module = LabPaths.of(lab).in_impl(dest)
        module.parent.mkdir()
        module.write_text(body, encoding="utf-8")
    return students, notes
