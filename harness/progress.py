"""Self-paced progress: a local record of every visible-test run and local grade.

What is recorded
  * each ``pytest labs/NN`` run of the student's code (one row per lab touched,
    with every test's part, outcome, duration and perf ratios), written by
    ``ProgressRecorder``, which the pytest plugin registers;
  * each local ``labs grade PATH --lab NN`` (the final ``GradeResult``: score,
    max score, per-test points and perf ratios), written by ``record_grade``
    from the CLI once -- the grader child process records nothing.

Progress is the student's own: keyed by the checkout (the course root), so two
checkouts of one course keep separate histories, and recorded only for the
checkout's own code. Not recorded: the hidden graders' own pytest runs
(``--labs-results``), runs of any other implementation (``--impl solution``,
``--impl PATH``), ``labs grade`` of any path but the checkout (``.`` or ``labs``),
runs with no test under ``labs/NN``, and pytest runs spawned from inside another test run
(``PYTEST_CURRENT_TEST`` inherited: the framework's own tests) unless
``LABS_PROGRESS_DB`` names a store explicitly.

Where: SQLite at ``platformdirs.user_data_dir("ai-infra-labs")/progress.sqlite3``;
``LABS_PROGRESS_DB=FILE`` overrides it, ``LABS_PROGRESS=off`` turns recording
off. Nothing is sent anywhere. Concurrent writers (parallel pytest processes,
an xdist controller, ``labs grade``) are safe: WAL journal, a busy timeout,
one ``BEGIN IMMEDIATE`` transaction per record and retries with backoff. A
store that cannot be written never fails the student's run: one warning line.

Commands (registered on ``labs`` by ``harness.cli``): ``labs progress``
(table, ``--json``, ``--html FILE``: ``harness.progress_report``) and ``labs reset [NN]``.
"""
from __future__ import annotations

import os
import random
import re
import socket
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from .errors import LabsError

NOT_RUN_MARK = "not verified here: "  # a skip reason the labs plugin gives a test this hardware cannot run


def not_run_reason(report) -> str | None:
    """Why a test did not run on this hardware (a skip carrying ``NOT_RUN_MARK``), or None."""
    if report.skipped and isinstance(report.longrepr, tuple) and NOT_RUN_MARK in str(report.longrepr[2]):
        return str(report.longrepr[2]).partition(NOT_RUN_MARK)[2]
    return None

SCHEMA_VERSION = 3  # 2: the runs_checkout_lab index (progress keyed by checkout); 3: results.reason
APP_NAME = "ai-infra-labs"
DB_FILENAME = "progress.sqlite3"
BUSY_TIMEOUT_S = 5.0   # per attempt; a transaction holds the lock for milliseconds
RETRIES = 6

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id          INTEGER PRIMARY KEY,
    course      TEXT NOT NULL,            -- labs.yaml `name`
    course_root TEXT,                     -- the checkout: progress is keyed by it
    lab         TEXT NOT NULL,            -- "04"
    kind        TEXT NOT NULL CHECK (kind IN ('visible', 'grade')),
    started     REAL NOT NULL,            -- unix seconds
    duration_s  REAL NOT NULL DEFAULT 0,
    impl        TEXT,                     -- --impl spec (visible) or the graded path (grade)
    seed        INTEGER,
    passed      INTEGER NOT NULL DEFAULT 0,
    failed      INTEGER NOT NULL DEFAULT 0,
    skipped     INTEGER NOT NULL DEFAULT 0,
    total       INTEGER NOT NULL DEFAULT 0,
    score       REAL,                     -- grades only
    max_score   REAL,
    max_score_runnable REAL,
    host        TEXT,
    pid         INTEGER
);
CREATE TABLE IF NOT EXISTS results (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    part        TEXT,                     -- the test's part marker, NULL when it has none
    nodeid      TEXT NOT NULL,
    name        TEXT NOT NULL,
    outcome     TEXT NOT NULL,            -- passed, failed, error, skipped, not_run (not on this hardware), not run
    duration_s  REAL NOT NULL DEFAULT 0,
    score       REAL,                     -- grades only
    max_score   REAL,
    reason      TEXT                      -- not_run: why this hardware could not run it
);
CREATE TABLE IF NOT EXISTS perf (
    run_id      INTEGER NOT NULL REFERENCES runs(id),
    part        TEXT,
    nodeid      TEXT NOT NULL,
    metric      TEXT NOT NULL,            -- record_perf name, e.g. gqa_vs_sdpa
    ratio       REAL NOT NULL             -- student time / baseline time: lower is better
);
CREATE INDEX IF NOT EXISTS runs_course_lab ON runs (course, lab, started);
CREATE INDEX IF NOT EXISTS runs_checkout_lab ON runs (course_root, lab, started);
CREATE INDEX IF NOT EXISTS results_run ON results (run_id);
CREATE INDEX IF NOT EXISTS perf_run ON perf (run_id);
"""


class ProgressError(LabsError):
    """The progress store could not be read or written."""


# --- where the store is ----------------------------------------------------------

def db_path() -> Path:
    """The SQLite file: ``$LABS_PROGRESS_DB`` or the user data directory."""
    env = os.environ.get("LABS_PROGRESS_DB")
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)) / DB_FILENAME


def recording_enabled() -> bool:
    """False when ``LABS_PROGRESS`` is off/0/no, or when this process was spawned
    from inside a pytest test (``PYTEST_CURRENT_TEST`` inherited) and no store was
    named explicitly: the framework's own tests must not fill a student's history."""
    if os.environ.get("LABS_PROGRESS", "").strip().lower() in ("0", "off", "no", "false"):
        return False
    if os.environ.get("PYTEST_CURRENT_TEST") and not os.environ.get("LABS_PROGRESS_DB"):
        return False
    return True


# --- the store -------------------------------------------------------------------

@dataclass
class TestRecord:
    nodeid: str
    name: str
    part: str | None = None
    outcome: str = "pending"
    duration_s: float = 0.0
    score: float | None = None
    max_score: float | None = None
    perf: list[dict] = field(default_factory=list)  # [{"name": ..., "ratio": ...}]
    reason: str | None = None  # not_run: why this hardware could not run it


@dataclass
class RunRecord:
    course: str
    lab: str
    kind: str  # "visible" | "grade"
    started: float
    duration_s: float = 0.0
    course_root: str | None = None
    impl: str | None = None
    seed: int | None = None
    score: float | None = None
    max_score: float | None = None
    max_score_runnable: float | None = None
    tests: list[TestRecord] = field(default_factory=list)

    def counts(self) -> dict:
        out = {k: sum(t.outcome == k for t in self.tests) for k in ("passed", "skipped", "not_run")}
        out["skipped"] += out.pop("not_run")  # the store's column: tests that did not run here
        out["total"] = len(self.tests)
        out["failed"] = out["total"] - out["passed"] - out["skipped"]
        return out


def _is_busy(e: sqlite3.OperationalError) -> bool:
    msg = str(e).lower()
    return "locked" in msg or "busy" in msg


def _connect(path: Path, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    con = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    con.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
    return con


def _write(path: Path, fn, *, timeout: float = BUSY_TIMEOUT_S, retries: int = RETRIES):
    """Run ``fn(con)`` in one ``BEGIN IMMEDIATE`` transaction; retry when busy."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(retries):
        try:
            con = _connect(path, timeout)
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    con.execute("PRAGMA journal_mode = WAL")  # persistent: set once per file
                con.execute("PRAGMA synchronous = NORMAL")
                con.execute("BEGIN IMMEDIATE")
                try:
                    if con.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                        for stmt in filter(str.strip, _SCHEMA.split(";")):  # not executescript: it COMMITs
                            con.execute(stmt)
                        if "reason" not in {c[1] for c in con.execute("PRAGMA table_info(results)")}:
                            con.execute("ALTER TABLE results ADD COLUMN reason TEXT")  # a version 2 store
                        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                    out = fn(con)
                    con.execute("COMMIT")
                    return out
                except BaseException:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    raise
            finally:
                con.close()
        except sqlite3.OperationalError as e:
            if not _is_busy(e) or attempt == retries - 1:
                raise
            time.sleep(random.uniform(0.02, 0.1) * 2 ** min(attempt, 5))


def record_runs(records: list[RunRecord], path: Path | None = None) -> list[int]:
    """Insert ``records`` (all in one transaction). Returns the new run ids.
    Raises ProgressError when the store cannot be written."""
    path = Path(path) if path is not None else db_path()
    records = [r for r in records if r.tests]
    if not records:
        return []

    def insert(con):
        ids = []
        for r in records:
            c = r.counts()
            cur = con.execute(
                "INSERT INTO runs (course, course_root, lab, kind, started, duration_s, impl, seed, passed, failed,"
                " skipped, total, score, max_score, max_score_runnable, host, pid)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (r.course, r.course_root, r.lab, r.kind, r.started, r.duration_s, r.impl, r.seed, c["passed"],
                 c["failed"], c["skipped"], c["total"], r.score, r.max_score, r.max_score_runnable,
                 socket.gethostname(), os.getpid()))
            run_id = cur.lastrowid
            con.executemany(
                "INSERT INTO results (run_id, part, nodeid, name, outcome, duration_s, score, max_score, reason)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                [(run_id, t.part, t.nodeid, t.name, t.outcome, t.duration_s, t.score, t.max_score,
                  t.reason if t.outcome == "not_run" else None)
                 for t in r.tests])
            con.executemany(
                "INSERT INTO perf (run_id, part, nodeid, metric, ratio) VALUES (?,?,?,?,?)",
                [(run_id, t.part, t.nodeid, p["name"], float(p["ratio"]))
                 for t in r.tests for p in t.perf if p.get("ratio") is not None])
            ids.append(run_id)
        return ids

    try:
        return _write(path, insert)
    except (sqlite3.Error, OSError) as e:
        raise ProgressError(f"cannot write {path}: {e}") from None


def checkout(course) -> str:
    """The key of a student's progress: their checkout (the course root, resolved), not
    the course's name: two checkouts of one course keep two histories."""
    return str(Path(course.root).resolve())


def load_runs(checkout_root: str, lab: str | None = None, path: Path | None = None) -> list[dict]:
    """Every recorded run in the checkout ``checkout_root`` (optionally one lab), oldest
    first, each with its ``tests`` (part, nodeid, name, outcome, ...) and ``perf`` rows."""
    path = Path(path) if path is not None else db_path()
    if not path.is_file():
        return []
    try:
        con = _connect(path)
        con.row_factory = sqlite3.Row
        try:
            if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs'").fetchone():
                return []
            where, args = "course_root = ?", [checkout_root]
            if lab is not None:
                where += " AND lab = ?"
                args.append(lab)
            runs = [dict(r) for r in con.execute(f"SELECT * FROM runs WHERE {where} ORDER BY started, id", args)]
            by_id = {r["id"]: r for r in runs}
            for r in runs:
                r["tests"], r["perf"] = [], []
            if runs:
                marks = f"SELECT id FROM runs WHERE {where}"
                for row in con.execute(f"SELECT * FROM results WHERE run_id IN ({marks})", args):
                    by_id[row["run_id"]]["tests"].append(dict(row))
                for row in con.execute(f"SELECT * FROM perf WHERE run_id IN ({marks})", args):
                    by_id[row["run_id"]]["perf"].append(dict(row))
            return runs
        finally:
            con.close()
    except sqlite3.Error as e:
        raise ProgressError(f"cannot read {path}: {e}") from None


def delete_runs(checkout_root: str, lab: str | None = None, path: Path | None = None) -> int:
    """Delete the recorded runs of the checkout ``checkout_root`` (optionally one lab). Returns how many."""
    path = Path(path) if path is not None else db_path()
    if not path.is_file():
        return 0
    where, args = "course_root = ?", [checkout_root]
    if lab is not None:
        where += " AND lab = ?"
        args.append(lab)

    def delete(con):
        ids = f"SELECT id FROM runs WHERE {where}"
        con.execute(f"DELETE FROM results WHERE run_id IN ({ids})", args)
        con.execute(f"DELETE FROM perf WHERE run_id IN ({ids})", args)
        return con.execute(f"DELETE FROM runs WHERE {where}", args).rowcount

    try:
        return _write(path, delete)
    except (sqlite3.Error, OSError) as e:
        raise ProgressError(f"cannot write {path}: {e}") from None


# --- recording a local grade (called by `labs grade`) ----------------------------

def record_grade(result, lab, course, path: Path | None = None) -> str | None:
    """Record a finished ``records.GradeResult`` of the student's own checkout (``labs grade .``
    or ``labs grade labs``). Returns None when recorded or deliberately skipped (recording
    off; any other path: the reference, a classmate's folder, staff grading a submission),
    else the reason it could not be recorded (the caller prints it as a warning)."""
    if not recording_enabled():
        return None
    submission = Path(result.submission).resolve()
    root = Path(checkout(course))
    if submission not in (root, root / "labs"):
        return None  # not this checkout's own code: not "your" grade
    tests = [TestRecord(nodeid=t.nodeid, name=t.name, part=t.part, outcome=t.outcome, duration_s=t.duration_s,
                        score=t.score, max_score=t.max_score, reason=t.not_run_reason or None,
                        perf=[{"name": p["name"], "ratio": p["ratio"]} for p in t.perf if p.get("ratio") is not None])
             for t in result.tests]
    rec = RunRecord(course=course.name, course_root=str(root), lab=lab.number, kind="grade",
                    started=time.time() - result.duration_s, duration_s=result.duration_s, impl=str(submission),
                    seed=result.seed, score=result.score, max_score=result.max_score,
                    max_score_runnable=result.max_score_runnable, tests=tests)
    try:
        record_runs([rec], path)
    except ProgressError as e:
        return str(e)
    return None


# --- recording visible-test runs (the pytest side) -------------------------------

recorder_key = pytest.StashKey["ProgressRecorder"]()


class PartAnnotator:
    """Copies each test's ``part`` marker onto its reports (``report.labs_part``),
    so an xdist controller, which never sees the items, still knows the part."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        rep = yield
        try:
            marker = item.get_closest_marker("part")
            if marker is not None and marker.args:
                rep.labs_part = str(marker.args[0])
        except Exception:  # never break a test run over bookkeeping
            pass
        return rep


def should_record(config, impl_spec: str) -> bool:
    """The plugin's test: record this pytest run's visible tests?"""
    if config.getoption("labs_results", None):
        return False  # the hidden-grader child of `labs grade`: the CLI records the grade
    if impl_spec != "student":
        return False  # the reference or another folder (--impl PATH): not the student's own code
    return recording_enabled()


class ProgressRecorder(PartAnnotator):
    """Collects the outcomes of tests under ``<course>/labs/NN/`` and writes one
    run per lab at the end of the session (one transaction). Never raises into
    pytest: a failure becomes one ``labs: warning`` line in the summary."""

    def __init__(self, config, course, impl_spec: str, seed: int | None, path: Path | None = None):
        self.config = config
        self.course = course
        self.impl_spec = impl_spec
        self.seed = seed
        self.path = path
        self.started = time.time()
        self.t0 = time.monotonic()
        self.tests: dict[str, tuple[str, TestRecord]] = {}  # nodeid -> (lab, record)
        self.run_ids: list[int] = []
        self.error: str | None = None
        self._labs_dir = (Path(course.root) / "labs").resolve()

    def _lab_of(self, nodeid: str) -> str | None:
        try:
            p = (Path(self.config.rootpath) / nodeid.split("::")[0]).resolve()
            rel = p.relative_to(self._labs_dir).parts
        except (ValueError, OSError):
            return None
        return rel[0] if len(rel) >= 2 and rel[0] in self.course.labs else None

    def pytest_collectreport(self, report):
        try:
            if report.failed and report.nodeid:
                lab = self._lab_of(report.nodeid)
                if lab is not None:
                    self.tests[report.nodeid] = (lab, TestRecord(nodeid=report.nodeid, name="(collection)",
                                                                 outcome="error"))
        except Exception:
            pass

    def pytest_runtest_logreport(self, report):
        try:
            lab = self._lab_of(report.nodeid)
            if lab is None:
                return
            if report.nodeid not in self.tests:
                name = report.nodeid.split("::")[-1]
                self.tests[report.nodeid] = (lab, TestRecord(nodeid=report.nodeid, name=name))
            t = self.tests[report.nodeid][1]
            t.duration_s += report.duration
            t.part = getattr(report, "labs_part", None) or t.part
            if report.when == "call" or report.outcome != "passed":
                if t.outcome in ("pending", "passed"):
                    t.outcome = "error" if (report.failed and report.when != "call") else report.outcome
                    if not_run_reason(report) is not None:
                        t.outcome = "not_run"  # this hardware could not run it: neither passed nor failed
                        t.reason = not_run_reason(report)
            perf = [{"name": e["name"], "ratio": e["ratio"]} for k, e in getattr(report, "user_properties", ())
                    if k == "labs_perf" and e.get("ratio") is not None]
            if perf or report.when == "call":  # each phase's report carries every figure so far
                t.perf = perf
        except Exception:
            pass

    def records(self) -> list[RunRecord]:
        by_lab: dict[str, RunRecord] = {}
        duration = time.monotonic() - self.t0
        for lab, t in self.tests.values():
            if t.outcome == "pending":
                t.outcome = "not run"
            rec = by_lab.setdefault(lab, RunRecord(
                course=self.course.name, course_root=checkout(self.course), lab=lab, kind="visible",
                started=self.started, duration_s=duration, impl=self.impl_spec, seed=self.seed))
            rec.tests.append(t)
        return list(by_lab.values())

    def pytest_sessionfinish(self, session):
        try:
            self.run_ids = record_runs(self.records(), self.path)
        except ProgressError as e:
            self.error = str(e)
        except Exception as e:  # pragma: no cover - belt and braces
            self.error = f"{type(e).__name__}: {e}"
        if self.error and self.config.pluginmanager.get_plugin("terminalreporter") is None:
            print(self.warning(), file=sys.stderr)

    def warning(self) -> str:
        return (f"labs: warning: progress not recorded ({self.error}); your test results are unaffected "
                f"(set LABS_PROGRESS_DB to a writable file, or LABS_PROGRESS=off)")

    def pytest_terminal_summary(self, terminalreporter):
        if self.error:
            terminalreporter.write_line(self.warning(), yellow=True)
