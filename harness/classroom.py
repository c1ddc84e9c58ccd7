"""Grade a whole class: ``labs grade-all SUBMISSIONS/ --lab NN``.

One entry of ``SUBMISSIONS/`` per student, named for the student:

* a folder: a checkout (``labs/NN/<module>.py``), a folder holding
  ``NN/<module>.py``, or a plain folder of lab files (``<module>.py``);
* an archive of either (``.zip``, ``.tar.gz``/``.tgz``, ``.tar``, ``.tar.bz2``,
  ``.tar.xz``), unpacked safely into a temporary folder: no absolute paths, no
  ``..``, no links, devices or sparse files, at most ``MAX_MEMBERS`` entries and
  ``--max-unpacked-mb`` bytes in all (counted while reading, so a lying header
  cannot blow the disk up). Metadata is capped before it is read into memory: a
  tar's GNU long name/link and pax headers at ``TAR_HEADER_MAX`` bytes each and
  ``TAR_HEADERS_TOTAL`` in all, a zip's central directory at ``ZIP_DIRECTORY_MAX``.

Two entries for one student (a folder and an archive, or two archives with the
same stem: ``alice/`` and ``alice.zip``, ``alice.tar`` and ``alice.zip``) are one
row, ``ambiguous submission: alice.tar, alice.zip``, graded neither and without a
score until staff keep one of them.

Each submission is graded by ``harness.grading.grade`` (one grading subprocess
or container per submission) in a bounded thread pool (``--jobs``). As each one
finishes, the trusted parent writes ``OUT/students/<student>/results.json``
(Gradescope's schema plus ``extra_data.status``; atomically; under ``students/``,
so that no student's name can be one of the class's own files), rewrites
``OUT/grades.csv`` (one row per student, one column per grader test;
atomically) and, with
``--gradebook URL``, records the part scores in an nbgrader gradebook. A run
that is killed resumes: a student whose ``results.json`` is there for the same
lab and the same submission bytes (``extra_data.fingerprint``) is skipped
(``--force`` regrades everyone).

Every student gets a row; ``status`` says what happened, and its kind
(``Status``, ``extra_data.status_kind``, from records in the results, never
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
import enum
import hashlib
import io
import json
import stat
import tarfile
import tempfile
import threading
import time
import zipfile
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath


from . import files, grading, impl as _impl
from .manifest import Course, Lab, LabPaths
from .errors import LabsError
from .gradebook import GradebookWriter

ARCHIVES = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".zip")
MAX_MEMBERS = 10_000
DEFAULT_MAX_UNPACKED_MB = 200
TAR_HEADER_MAX = 64 << 10       # bytes: one GNU long name/link or pax header
TAR_HEADERS_TOTAL = 2 << 20     # bytes: all of them in one archive
PAX_GLOBAL_KEYS_MAX = 64        # keys in pax global headers (copied into every member)
ZIP_DIRECTORY_MAX = 4 << 20     # bytes: a zip's central directory (read whole by zipfile)
ERROR_MAX = 200                 # characters of a name or an error quoted in a message
CSV_NAME = "grades.csv"         # OUT/grades.csv
STUDENTS_DIR = "students"       # OUT/students/<student>/results.json
RESULTS_NAME = "results.json"
FIXED_COLUMNS = ["student", "lab", "score", "max", "max_runnable", "status"]


class GradebookError(LabsError):
    """The nbgrader gradebook given with ``--gradebook`` cannot be opened."""


class UnpackError(LabsError):
    """An archive is corrupt, unsafe or too large; the message says which and why."""


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


def archive_stem(name: str) -> str | None:
    """``alice.tar.gz`` -> ``alice``; ``None`` for a name that is no archive."""
    low = name.lower()
    for ext in ARCHIVES:
        if low.endswith(ext) and len(name) > len(ext):
            return name[: -len(ext)]
    return None


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


# --- unpacking safely --------------------------------------------------------

def _safe_member(name: str) -> PurePosixPath:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or name.startswith(("/", "\\")) or (p.parts and ":" in p.parts[0]):
        raise UnpackError(f"absolute path {_short(repr(name))} in the archive")
    if ".." in p.parts:
        raise UnpackError(f"path traversal {_short(repr(name))} in the archive")
    return p


def _copy_capped(src, dest: Path, budget: list[int], limit: int) -> None:
    with open(dest, "wb") as out:
        while chunk := src.read(1 << 16):
            budget[0] += len(chunk)
            if budget[0] > limit:
                raise UnpackError(f"unpacks to more than {limit // 2**20} MiB")
            out.write(chunk)


_TAR_EXTENDED = {tarfile.GNUTYPE_LONGNAME: "GNU long name", tarfile.GNUTYPE_LONGLINK: "GNU long link",
                 tarfile.XHDTYPE: "pax", tarfile.XGLTYPE: "pax global", tarfile.SOLARIS_XHDTYPE: "pax"}


class _GuardedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long name/link or pax header whole (``_proc_gnulong``,
    ``_proc_pax``) and copies pax global headers into every member; this checks the
    size a header declares before it is read and the global keys before the next
    header, so a small archive cannot fill the memory. Sparse files are refused."""

    @classmethod
    def fromtarfile(cls, tf):
        if len(tf.pax_headers) > PAX_GLOBAL_KEYS_MAX:
            raise UnpackError(f"pax global headers with more than {PAX_GLOBAL_KEYS_MAX} keys")
        return super().fromtarfile(tf)

    def _proc_member(self, tf):
        if self.type in _TAR_EXTENDED:
            tf.labs_header_bytes = getattr(tf, "labs_header_bytes", 0) + self.size
            if self.size > TAR_HEADER_MAX:
                raise UnpackError(f"a {_TAR_EXTENDED[self.type]} header of {self.size} bytes "
                                  f"(at most {TAR_HEADER_MAX >> 10} KiB)")
            if tf.labs_header_bytes > TAR_HEADERS_TOTAL:
                raise UnpackError(f"long-name and pax headers of more than {TAR_HEADERS_TOTAL >> 20} MiB in all")
        return super()._proc_member(tf)

    def _refuse_sparse(self, *args):
        raise UnpackError("sparse file in the archive")

    _proc_sparse = _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _unpack_tar(archive: Path, dest: Path, budget: list[int], max_bytes: int) -> None:
    with tarfile.open(archive, "r:*", tarinfo=_GuardedTarInfo) as tf:
        count = 0
        for m in tf:
            count += 1
            if count > MAX_MEMBERS:
                raise UnpackError(f"more than {MAX_MEMBERS} entries")
            rel = _safe_member(m.name)
            if not (m.isfile() or m.isdir()):
                raise UnpackError(f"{'link' if m.issym() or m.islnk() else 'special file'} "
                                  f"{_short(repr(m.name))} in the archive")
            target = dest.joinpath(*rel.parts) if rel.parts else dest
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            _copy_capped(tf.extractfile(m), target, budget, max_bytes)


def _unpack_zip(archive: Path, dest: Path, budget: list[int], max_bytes: int) -> None:
    with open(archive, "rb") as f:  # zipfile reads the whole central directory first
        end = zipfile._EndRecData(f)
    if end and end[zipfile._ECD_SIZE] > ZIP_DIRECTORY_MAX:
        raise UnpackError(f"a zip directory of {end[zipfile._ECD_SIZE]} bytes (at most {ZIP_DIRECTORY_MAX >> 20} MiB)")
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise UnpackError(f"{len(infos)} entries (at most {MAX_MEMBERS})")
        for info in infos:
            rel = _safe_member(info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise UnpackError(f"link {_short(repr(info.filename))} in the archive")
            target = dest.joinpath(*rel.parts) if rel.parts else dest
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src:
                _copy_capped(src, target, budget, max_bytes)


def unpack(archive: Path, dest: Path, max_bytes: int = DEFAULT_MAX_UNPACKED_MB << 20) -> Path:
    """Unpack ``archive`` (zip or tar, any compression) into ``dest`` (created) and
    return ``dest``: regular files and folders only, at most ``max_bytes`` bytes in
    all and ``MAX_MEMBERS`` entries, metadata capped before it is read (see the
    module docstring). Raises UnpackError saying why (at most a few hundred
    characters, whatever the archive's names)."""
    dest.mkdir(parents=True, exist_ok=True)
    try:
        (_unpack_zip if archive.name.lower().endswith(".zip") else _unpack_tar)(archive, dest, [0], max_bytes)
    except UnpackError:
        raise
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, ValueError, RuntimeError) as e:
        raise UnpackError(f"not a readable archive ({type(e).__name__}: {_short(str(e))})") from None
    return dest


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

class Status(str, enum.Enum):
    """What a row's status means for its grade (``extra_data.status_kind``)."""
    OK = "ok"
    STUDENT_ERROR = "student_error"  # the submission's fault: final, 0 for what could not run
    TIMEOUT = "timeout"              # stopped at its time limit: final, what was graded counts
    INFRA_ERROR = "infra_error"      # not the submission's fault: no score, retried on the next run


@dataclass
class Row:
    student: str
    # one line, at most STATUS_MAX characters (see one_line)
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


STATUS_MAX = 300


def one_line(text: str) -> str:
    """A status as one CSV-friendly line of at most ``STATUS_MAX`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= STATUS_MAX else text[: STATUS_MAX - 3] + "..."


IMPL_ERRORS = {"import": "import error", "api": "api mismatch", "missing": "no module"}


def status_of(result: grading.GradeResult) -> str:
    """``ok``, or the reason a submission did not grade normally, from the records
    in its result: ``stopped`` (timeout) and the tests' ``impl_error`` (every test
    that ran failed to load the implementation the same way)."""
    if result.stopped:
        return f"timeout: {result.stopped}"
    ran = [t for t in result.tests if t.outcome != "skipped"]
    kinds = {t.impl_error for t in ran}
    if ran and len(kinds) == 1 and (kind := kinds.pop()) in IMPL_ERRORS:
        first = ran[0].output.splitlines()[0] if ran[0].output else kind
        return f"{IMPL_ERRORS[kind]}: {first.removeprefix(IMPL_ERRORS[kind] + ': ')}"
    return "ok"


def kind_of(result: grading.GradeResult, status: str) -> Status:
    """The ``Status`` of a graded result whose status text is ``status``."""
    if result.stopped:
        return Status.TIMEOUT
    return Status.OK if status == "ok" else Status.STUDENT_ERROR


def _empty_results(lab: Lab, student: str, status: str, fp: str, source: Path, scored: bool = True) -> dict:
    """A row without tests; ``scored=False`` (an infrastructure failure): no score at all."""
    return {"score": 0.0 if scored else None, "execution_time": 0.0, "output": one_line(status),
            "visibility": "visible", "stdout_visibility": "hidden", "tests": [], "leaderboard": [],
            "extra_data": {"lab": lab.number, "max_score": lab.points, "max_score_runnable": None,
                           "seed": None, "ignored_files": [], "student": student, "status": status,
                           "fingerprint": fp, "submission": str(source)}}


def grade_one(sub: Submission, lab: Lab, course: Course, *, timeout_s: float | None = None,
              sandbox: str | None = None, max_bytes: int = DEFAULT_MAX_UNPACKED_MB << 20,
              seed: int | None = None) -> Row:
    """Unpack (if needed), locate and grade one submission; never raises for a
    submission's fault: the reason goes into the row's status."""
    try:
        row = _grade_one(sub, lab, course, timeout_s=timeout_s, sandbox=sandbox, max_bytes=max_bytes, seed=seed)
    except Exception as e:  # a harness failure: this row is retried on the next run
        status = f"grading error: {type(e).__name__}: {e}"
        row = Row(sub.student, status, _empty_results(lab, sub.student, status, "", sub.path, scored=False),
                  kind=Status.INFRA_ERROR)
    row.status = one_line(row.status)
    row.results["extra_data"].update(status=row.status, status_kind=row.kind.value)
    return row


def _grade_one(sub: Submission, lab: Lab, course: Course, *, timeout_s, sandbox, max_bytes, seed) -> Row:
    t0 = time.monotonic()
    fp = fingerprint(sub, lab)
    if sub.ambiguous:  # which one counts is the staff's call: neither is graded
        status = f"ambiguous submission: {', '.join(p.name for p in sub.entries)}"
        res = _empty_results(lab, sub.student, status, fp, sub.path.parent, scored=False)
        res["extra_data"]["entries"] = [p.name for p in sub.entries]
        return Row(sub.student, status, res, kind=Status.STUDENT_ERROR)
    if sub.stray:
        status = (f"unrecognised submission: {sub.path.name} is neither a folder nor an archive "
                  f"({', '.join(ARCHIVES)}); submit {LabPaths.of(lab).stub} in one")
        return Row(sub.student, status, _empty_results(lab, sub.student, status, fp, sub.path),
                   time.monotonic() - t0, kind=Status.STUDENT_ERROR)
    with tempfile.TemporaryDirectory(prefix=f"labs-class-{lab.number}-") as tmp:
        work = Path(tmp)
        root = sub.path
        if sub.is_archive:
            try:
                root = unpack(sub.path, work / "unpacked", max_bytes)
            except UnpackError as e:
                status = f"unpack error: {sub.path.name}: {e}"
                return Row(sub.student, status, _empty_results(lab, sub.student, status, fp, sub.path),
                           time.monotonic() - t0, kind=Status.STUDENT_ERROR)
        try:  # none, two equally deep, a link (to a reference, a secret), a huge file: refused
            grading.read_module(_impl.locate(root, lab), root)
        except _impl.ImplError as e:
            status = f"no module: {e}"
            return Row(sub.student, status, _empty_results(lab, sub.student, status, fp, sub.path),
                       time.monotonic() - t0, kind=Status.STUDENT_ERROR)
        kwargs = {"seed": seed, "timeout_s": timeout_s}
        if sandbox is not None:
            kwargs["sandbox"] = sandbox
        try:
            result = grading.grade(root, lab, course, **kwargs)  # stages the module impl.locate finds
        except grading.GradingError as e:  # not the student's fault: no score, retried next run
            if isinstance(e, grading.InfraFailure):
                status = f"infra_error: {e.reason}"
            else:
                status = f"grading error: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
            return Row(sub.student, status, _empty_results(lab, sub.student, status, fp, sub.path, scored=False),
                       time.monotonic() - t0, kind=Status.INFRA_ERROR)
        # messages name the student's submission, not our temporary copy
        for t in result.tests:
            t.output = t.output.replace(str(work), f"<{sub.path.name}>")
        result.submission = str(sub.path)
    status = status_of(result)
    res = result.to_gradescope()
    res["extra_data"].update(student=sub.student, status=status, fingerprint=fp, submission=str(sub.path),
                             seed=result.seed)  # staff output: replay a disputed grade with --seed
    if status != "ok":
        res["output"] = "\n".join(x for x in (status, res["output"]) if x)
    return Row(sub.student, status, res, time.monotonic() - t0, kind=kind_of(result, status))


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
        parts = grading.part_scores(res)  # each test's extra_data.part, never its name
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
        except OSError:  # unreadable: grade_one says so in the row
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
            status = one_line(f"infra_error: cannot write {STUDENTS_DIR}/{row.student}/{RESULTS_NAME}: "
                              f"{type(e).__name__}: {_short(str(e))}")
            res = _empty_results(lab, row.student, status, "", row.results["extra_data"].get("submission", ""),
                                 scored=False)
            res["extra_data"].update(status_kind=Status.INFRA_ERROR.value)
            row = Row(row.student, status, res, row.duration_s, kind=Status.INFRA_ERROR)
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
                    pending.add(pool.submit(grade_one, sub, lab, course, timeout_s=timeout_s,
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
