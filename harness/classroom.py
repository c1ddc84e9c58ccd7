"""Grade a whole class: ``labs grade-all SUBMISSIONS/ --lab NN``.

One entry of ``SUBMISSIONS/`` per student, named for the student:

* a folder: a checkout (``labs/NN/<module>.py``), a folder holding
  ``NN/<module>.py``, or a plain folder of lab files (``<module>.py``);
* an archive of either (``.zip``, ``.tar.gz``/``.tgz``, ``.tar``, ``.tar.bz2``,
  ``.tar.xz``), unpacked safely into a temporary folder (``harness.archives``:
  at most ``--max-unpacked-mb`` bytes in all, no links, no paths outside).

Two entries for one student (a folder and an archive, or two archives with the
same stem: ``alice/`` and ``alice.zip``, ``alice.tar`` and ``alice.zip``) are one
row, ``ambiguous submission: alice.tar, alice.zip``, graded neither and without a
score until staff keep one of them.

Each submission is graded by ``harness.grading.grade_one`` (one grading subprocess
or container per submission) in a bounded thread pool (``--jobs``) into its typed
record (``records.Graded``). As each one finishes, the trusted parent writes its
export, ``OUT/students/<student>/results.json``
(Gradescope's schema plus ``extra_data.status``; atomically; under ``students/``,
so that no student's name can be one of the class's own files), rewrites
``OUT/grades.csv`` (one row per student, one column per grader test;
atomically) and, with
``--gradebook URL``, records the part scores in an nbgrader gradebook. A run
that is killed resumes: a student whose ``results.json`` is there for the same
lab and the same submission bytes (``extra_data.fingerprint``) is skipped
(``--force`` regrades everyone).

Every student gets a row; ``status`` says what happened, and its kind
(``records.Status``, ``extra_data.status_kind``, from records in the results, never
from messages) says what it means for the grade:

* ``ok``: ``ok``;
* ``student_error`` (final until the submission changes, scores 0 where the
  code could not run): ``import error: ...``, ``api mismatch: ...``, ``no
  module: ...`` (also a module over ``grading.MAX_MODULE_BYTES``), ``unpack
  error: ...``, and ``ambiguous submission: ...`` (no score);
* ``timeout``: ``timeout: ...`` (the run hit its limit; what was graded counts);
* ``infra_error`` (no score, retried on the next run): ``infra_error: ...``
  (the sandbox could not start, the grader run crashed) and ``grading error:
  ...`` (the graders themselves failed).

A row's failure (a corrupt archive, a results file that cannot be written) is
that row's status, never the end of the class run. The command exits 0 when
grading ran, 1 when grading itself failed for some submission (after grading
all the others).
"""
from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from . import files, grading, impl as _impl
from .archives import ARCHIVES, DEFAULT_MAX_UNPACKED_MB, archive_stem
from .manifest import Course, Lab, LabPaths
from .errors import LabsError
from .gradebook import GradebookWriter
from .records import Graded, Status, part_scores

ERROR_MAX = 200                 # characters of a name or an error quoted in a message
CSV_NAME = "grades.csv"         # OUT/grades.csv
STUDENTS_DIR = "students"       # OUT/students/<student>/results.json
RESULTS_NAME = "results.json"
FIXED_COLUMNS = ["student", "lab", "score", "max", "max_runnable", "status"]


class GradebookError(LabsError):
    """The nbgrader gradebook given with ``--gradebook`` cannot be opened."""


class OutputError(LabsError):
    """The output folder cannot hold the class's results (a path there is in the way)."""


def _short(text: str, limit: int = ERROR_MAX) -> str:
    """``text`` cut to ``limit`` characters (a name or an error quoted in a status)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- finding the submissions ------------------------------------------------

@dataclass
class Submission:
    student: str
    path: Path  # the folder or the archive
    entries: tuple[Path, ...] = ()  # when more than one entry is this student's: all of them
    stray: bool = False  # a file that is no archive: its own row, "unrecognised submission"

    @property
    def is_archive(self) -> bool:
        return self.path.is_file()

    @property
    def ambiguous(self) -> bool:
        """More than one entry of SUBMISSIONS/ is this student's: none is graded."""
        return len(self.entries) > 1


def discover(root: Path) -> tuple[list[Submission], list[str]]:
    """The submissions in ``root`` (sorted by student) and notes on what was left out.
    A student with several entries (``alice/``, ``alice.zip``, ``alice.tar``) gets one
    ``Submission`` holding them all (``ambiguous``)."""
    found: dict[str, list[Path]] = {}
    notes, strays = [], []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".") or p.name in _impl.SKIP_NAMES:
            continue
        if p.is_dir():
            student = p.name
        elif p.is_file() and archive_stem(p.name):
            student = archive_stem(p.name)
        elif p.is_file():  # a row of its own, named by the whole file name (never merged with a student's)
            strays.append(Submission(p.name, p, stray=True))
            continue
        else:
            notes.append(f"skipped {p.name}: neither a folder nor an archive ({', '.join(ARCHIVES)})")
            continue
        found.setdefault(student, []).append(p)
    subs = [Submission(s, ps[0], tuple(ps) if len(ps) > 1 else ()) for s, ps in sorted(found.items())]
    subs += [s for s in strays if s.student not in found]
    return sorted(subs, key=lambda s: s.student), notes


def fingerprint(sub: Submission, lab: Lab) -> str:
    """sha256 of the archive's bytes, or of the folder's lab module (``missing``
    when there is none; of every entry's name and fingerprint when ``ambiguous``):
    a changed submission is graded again on resume. Raises OSError when a file
    cannot be read."""
    h = hashlib.sha256()
    if sub.ambiguous:
        for p in sub.entries:
            h.update(f"{p.name}\0{fingerprint(Submission(sub.student, p), lab)}\0".encode())
        return "ambiguous:" + h.hexdigest()
    if sub.is_archive:
        path = sub.path
    else:
        try:
            path = _impl.locate(sub.path, lab)
        except _impl.ImplError:
            return "missing"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- grading one submission ---------------------------------------------------

@dataclass
class Row:
    """One student's line of the class table: the export of their ``Graded`` record
    (or the one kept in OUT from an earlier run), which the CSV, the gradebook and
    the next run's resume read."""
    student: str
    # one line, at most records.STATUS_MAX characters (see records.one_line)
    status: str
    results: dict  # Gradescope results.json, with extra_data.status and status_kind
    duration_s: float = 0.0
    skipped: bool = False
    kind: Status = Status.OK

    @property
    def ok(self) -> bool:
        return self.kind is Status.OK

    @property
    def retry(self) -> bool:
        """Not final: graded again on the next run."""
        return self.kind is Status.INFRA_ERROR


def _row(sub: Submission, graded: Graded, fp: str, **extra) -> Row:
    res = graded.to_gradescope(student=sub.student, fingerprint=fp, submission=str(sub.path), **extra)
    return Row(sub.student, graded.status, res, graded.duration_s, kind=graded.kind)


def grade_row(sub: Submission, lab: Lab, course: Course, *, timeout_s: float | None = None,
              sandbox: str | None = None, max_bytes: int = DEFAULT_MAX_UNPACKED_MB << 20,
              seed: int | None = None) -> Row:
    """Grade one entry of SUBMISSIONS/ (``grading.grade_one``) into its row; an
    ambiguous entry or a stray file is a row of its own, graded never. Never raises
    for a submission's fault: the reason goes into the row's status."""
    try:
        fp = fingerprint(sub, lab)
    except OSError as e:  # unreadable: not the submission's fault, graded again
        return _row(sub, Graded(lab.number, f"grading error: {type(e).__name__}: {e}", Status.INFRA_ERROR,
                                lab.points, scored=False), "")
    if sub.ambiguous:  # which one counts is the staff's call: neither is graded
        status = f"ambiguous submission: {', '.join(p.name for p in sub.entries)}"
        graded = Graded(lab.number, status, Status.STUDENT_ERROR, lab.points, scored=False)
        row = _row(sub, graded, fp, entries=[p.name for p in sub.entries])
        row.results["extra_data"]["submission"] = str(sub.path.parent)
        return row
    if sub.stray:
        status = (f"unrecognised submission: {sub.path.name} is neither a folder nor an archive "
                  f"({', '.join(ARCHIVES)}); submit {LabPaths.of(lab).stub} in one")
        return _row(sub, Graded(lab.number, status, Status.STUDENT_ERROR, lab.points), fp)
    return _row(sub, grading.grade_one(sub.path, lab, course, timeout_s=timeout_s, sandbox=sandbox,
                                       max_bytes=max_bytes, seed=seed), fp)


# --- results on disk ------------------------------------------------------------

def results_path(out: Path, student: str) -> Path:
    """``OUT/students/<student>/results.json``: apart from the class's own files."""
    return out / STUDENTS_DIR / student / RESULTS_NAME


def load_row(out: Path, student: str) -> Row | None:
    """The row kept in ``out`` for ``student`` (``results_path``, else where older
    versions kept it, ``OUT/<student>/results.json``), or None when there is none
    that can be read; without a known ``status_kind`` it counts as an
    infrastructure failure (so it is graded again), and so does one whose tests do not
    carry their part (``extra_data.part``: written by an older version)."""
    path = results_path(out, student)
    if not path.is_file():
        path = out / student / RESULTS_NAME
    try:
        res = json.loads(path.read_text())
        kind = Status(res["extra_data"].get("status_kind", Status.INFRA_ERROR.value))
        if not all("part" in (t.get("extra_data") or {}) for t in res.get("tests", [])):
            kind = Status.INFRA_ERROR
        return Row(student, res["extra_data"]["status"], res, res.get("execution_time", 0.0), skipped=True, kind=kind)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def score_text(results: dict) -> str:
    """A row's score for tables and the CSV: empty when it has none (infrastructure failure)."""
    return "" if results.get("score") is None else f"{results['score']:g}"


def test_column(test: dict) -> str:
    return test["name"]


def write_csv(path: Path, rows: list[Row], lab: Lab) -> None:
    """``grades.csv``: the fixed columns, a subtotal per part (``part A``, ...), then one
    column per grader test (points earned), in grader order; rewritten atomically."""
    columns: list[str] = []
    seen = set()
    for row in sorted(rows, key=lambda r: -len(r.results.get("tests", []))):
        for t in row.results.get("tests", []):
            c = test_column(t)
            if c not in seen:
                seen.add(c)
                columns.append(c)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FIXED_COLUMNS + [f"part {k}" for k in lab.parts] + columns)
    for row in sorted(rows, key=lambda r: r.student):
        res = row.results
        ed = res.get("extra_data", {})
        per_test = {test_column(t): t["score"] for t in res.get("tests", [])}
        parts = part_scores(res)  # each test's extra_data.part, never its name
        mr = ed.get("max_score_runnable")
        w.writerow([row.student, lab.number, score_text(res), f"{ed.get('max_score', lab.points):g}",
                    "" if mr is None else f"{mr:g}", row.status]
                   + [("" if res.get("score") is None else f"{parts.get(k, 0.0):g}") for k in lab.parts]
                   + [("" if c not in per_test else f"{per_test[c]:g}") for c in columns])
    files.write_atomic(path, buf.getvalue())


# --- the class run --------------------------------------------------------------

@dataclass
class ClassRun:
    """What ``grade_all`` did: every row (graded now or skipped), in student order."""
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    gradebook_error: str = ""  # why recording in the gradebook stopped, if it did

    @property
    def graded(self) -> list[Row]:
        return [r for r in self.rows if not r.skipped]

    @property
    def grading_errors(self) -> list[Row]:
        return [r for r in self.rows if r.retry]


def grade_all(submissions: Path, lab: Lab, course: Course, out: Path, *, jobs: int = 2,
              timeout_s: float | None = None, sandbox: str | None = None, force: bool = False,
              gradebook: str | None = None, max_bytes: int = DEFAULT_MAX_UNPACKED_MB << 20,
              on_start=None, on_row=None, stop: threading.Event | None = None) -> ClassRun:
    """Grade every submission in ``submissions`` into ``out`` (see the module
    docstring). ``on_start(total, skipped)`` and ``on_row(row)`` report progress;
    setting ``stop`` lets running gradings finish and starts no new one. Raises
    OutputError when ``out`` cannot hold the results, GradebookError when the
    gradebook cannot be opened; a submission's failure is its row's status."""
    subs, notes = discover(submissions)
    if out.exists() and any(s.path.resolve() == out.resolve() for s in subs):
        notes.append(f"skipped {out.name}: it is the output folder (--out)")
        subs = [s for s in subs if s.path.resolve() != out.resolve()]
    for sub in subs:
        if sub.ambiguous:
            notes.append(f"{sub.student}: ambiguous submission ({', '.join(p.name for p in sub.entries)}): "
                         f"graded neither; keep one and rerun")
    run = ClassRun(notes=notes)
    for path, is_dir in ((out, True), (out / CSV_NAME, False), (out / STUDENTS_DIR, True)):
        if path.exists() and path.is_dir() != is_dir:
            raise OutputError(f"{path} is in the way: it should be a {'folder' if is_dir else 'file'}")
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Row] = {}
    todo: list[Submission] = []
    for sub in subs:
        prev = None if force else load_row(out, sub.student)
        try:
            same = prev is not None and prev.results["extra_data"].get("fingerprint") == fingerprint(sub, lab)
        except OSError:  # unreadable: grade_row says so in the row
            same = False
        if same and not prev.retry and prev.results["extra_data"].get("lab") == lab.number:
            done[sub.student] = prev
            if not results_path(out, sub.student).is_file():  # kept by an older version: copy it under students/
                with contextlib.suppress(OSError):
                    files.write_json(results_path(out, sub.student), prev.results)
        else:
            todo.append(sub)
    book = None

    def push(row: Row):  # a gradebook that fails stops the pushes, never the grading
        nonlocal book
        try:
            book.record(row.student, row.results)
        except Exception as e:
            run.gradebook_error = f"gradebook {gradebook}: {type(e).__name__}: {e}"
            book = None

    if gradebook:
        try:
            book = GradebookWriter(gradebook, lab)
        except Exception as e:
            raise GradebookError(f"cannot open the gradebook {gradebook}: {type(e).__name__}: {e}") from None
        for row in done.values():
            if book is not None and row.results.get("tests"):
                push(row)
    if on_start:
        on_start(len(subs), len(done))
    # rows of students no longer in SUBMISSIONS/ stay out of this run's CSV
    csv_path = out / CSV_NAME
    write_csv(csv_path, list(done.values()), lab)

    def finish(row: Row):
        try:
            files.write_json(results_path(out, row.student), row.results)
        except (OSError, ValueError) as e:  # this row is retried on the next run; the others go on
            graded = Graded(lab.number, f"infra_error: cannot write {STUDENTS_DIR}/{row.student}/{RESULTS_NAME}: "
                                        f"{type(e).__name__}: {_short(str(e))}", Status.INFRA_ERROR, lab.points,
                            scored=False)
            res = graded.to_gradescope(student=row.student, fingerprint="",
                                       submission=row.results["extra_data"].get("submission", ""))
            row = Row(row.student, graded.status, res, row.duration_s, kind=Status.INFRA_ERROR)
        done[row.student] = row
        write_csv(csv_path, list(done.values()), lab)
        if book is not None and row.results.get("tests"):
            push(row)
        if on_row:
            on_row(row)

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="labs-grade") as pool:
            pending = set()
            queue = list(todo)
            while queue or pending:
                while queue and len(pending) < max(1, jobs) and not (stop and stop.is_set()):
                    sub = queue.pop(0)
                    pending.add(pool.submit(grade_row, sub, lab, course, timeout_s=timeout_s,
                                            sandbox=sandbox, max_bytes=max_bytes))
                if not pending:
                    break
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    finish(fut.result())
    finally:
        if book is not None:
            book.close()
    run.rows = [done[s.student] for s in subs if s.student in done]
    return run
