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
(table, ``--json``, ``--html FILE``) and ``labs reset [NN]``.
"""
from __future__ import annotations

import html
import io
import json
import os
import random
import re
import socket
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from .errors import LabsError

SCHEMA_VERSION = 2  # 2: the runs_checkout_lab index (progress keyed by checkout)
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
    outcome     TEXT NOT NULL,            -- passed, failed, error, skipped, not run
    duration_s  REAL NOT NULL DEFAULT 0,
    score       REAL,                     -- grades only
    max_score   REAL
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
        out = {k: sum(t.outcome == k for t in self.tests) for k in ("passed", "skipped")}
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
                "INSERT INTO results (run_id, part, nodeid, name, outcome, duration_s, score, max_score)"
                " VALUES (?,?,?,?,?,?,?,?)",
                [(run_id, t.part, t.nodeid, t.name, t.outcome, t.duration_s, t.score, t.max_score)
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
                        score=t.score, max_score=t.max_score,
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


# --- the summary ---------------------------------------------------------------

def _best_perf(rows: list[dict]) -> dict:
    best: dict[str, float] = {}
    for p in rows:
        best[p["metric"]] = min(best.get(p["metric"], float("inf")), p["ratio"])
    return best


def _status(runs: list[dict], part: str | None, max_points: float) -> dict:
    """Status of one lab (part None) or one part across ``runs`` (oldest first)."""
    def tests(r):
        return [t for t in r["tests"] if part is None or t["part"] == part]

    mine = [r for r in runs if tests(r)]
    visible = [r for r in mine if r["kind"] == "visible"]
    grades = [r for r in mine if r["kind"] == "grade"]
    out = {"visible": None, "last_grade": None, "best_grade": None, "best_perf": {},
           "attempts": {"visible": len(visible), "grade": len(grades)},
           "first": mine[0]["started"] if mine else None, "last": mine[-1]["started"] if mine else None}
    if visible:
        ts = tests(visible[-1])
        out["visible"] = {"passed": sum(t["outcome"] == "passed" for t in ts), "total": len(ts),
                          "at": visible[-1]["started"]}

    def grade_score(r):
        if part is None:
            return {"score": r["score"], "max_score": r["max_score"], "at": r["started"]}
        return {"score": round(sum(t["score"] or 0 for t in tests(r)), 4), "max_score": max_points,
                "at": r["started"]}

    if grades:
        scored = [grade_score(r) for r in grades]
        out["last_grade"] = scored[-1]
        out["best_grade"] = max(scored, key=lambda s: s["score"])
    out["best_perf"] = _best_perf([p for r in mine for p in r["perf"] if part is None or p["part"] == part])
    return out


def summarize(course, path: Path | None = None, lab: str | None = None) -> dict:
    """Per lab and part: visible tests passed/total at the last run, last and best
    local grade, best perf ratio per metric (lower is better), attempts, first and
    last attempt (unix seconds). Also each lab's ``history`` for the plots."""
    path = Path(path) if path is not None else db_path()
    runs = load_runs(checkout(course), lab, path)
    labs = []
    for num, spec in sorted(course.labs.items()):
        if lab is not None and num != lab:
            continue
        lab_runs = [r for r in runs if r["lab"] == num]
        entry = {"lab": num, "title": spec.title, "points": spec.points, **_status(lab_runs, None, spec.points),
                 "parts": [{"part": p, "title": ps.title, "points": ps.points, **_status(lab_runs, p, ps.points)}
                           for p, ps in spec.parts.items()],
                 "history": [{"kind": r["kind"], "at": r["started"], "passed": r["passed"], "total": r["total"],
                              "score": r["score"], "max_score": r["max_score"],
                              "perf": _best_perf(r["perf"])} for r in lab_runs]}
        labs.append(entry)
    return {"course": course.name, "checkout": checkout(course), "db": str(path), "labs": labs}


def _cells(s: dict, short: bool = False) -> list[str]:
    v = s["visible"]
    vis = f"{v['passed']}/{v['total']}" if v else "-"

    def g(x):
        return f"{x['score']:.4g}/{x['max_score']:.4g}" if x else "-"

    perf = ", ".join(f"{k} {r:.3g}x" for k, r in sorted(s["best_perf"].items())) or "-"
    a = s["attempts"]
    fmt = "%m-%d %H:%M" if short else "%Y-%m-%d %H:%M"
    when = [datetime.fromtimestamp(t).strftime(fmt) if t else "-" for t in (s["first"], s["last"])]
    return [vis, g(s["last_grade"]), g(s["best_grade"]), perf, str(a["visible"]), str(a["grade"]), *when]


COLUMNS = ["Lab", "Part", "Visible (last run)", "Last grade", "Best grade", "Best perf ratio",
           "Runs", "Grades", "First", "Last"]
SHORT_COLUMNS = ["Lab", "Part", "Visible", "Last grade", "Best grade", "Best perf", "Runs", "Grades", "First", "Last"]


def table_rows(summary: dict, short: bool = False) -> list[tuple[bool, list[str]]]:
    """(is_lab_row, cells) for the table shown by the CLI and the HTML page: one
    row per lab (all its tests) followed by one row per part."""
    rows = []
    for lab in summary["labs"]:
        rows.append((True, [lab["lab"], "all" if short else f"all: {lab['title']}", *_cells(lab, short)]))
        for p in lab["parts"]:
            label = p["part"] if short else f"{p['part']}: {p['title']} ({p['points']:g} pts)"
            rows.append((False, ["", label, *_cells(p, short)]))
    return rows


# --- the HTML report -------------------------------------------------------------

def _plot_svg(lab: dict, perf_specs: dict) -> str:
    """Score (% of points) and perf ratio over attempts for one lab, as inline SVG."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    hist = lab["history"]
    x = list(range(1, len(hist) + 1))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2), sharex=True)
    vis = [(i, 100 * h["passed"] / h["total"]) for i, h in zip(x, hist) if h["kind"] == "visible" and h["total"]]
    grd = [(i, 100 * h["score"] / h["max_score"]) for i, h in zip(x, hist)
           if h["kind"] == "grade" and h["max_score"]]
    if vis:
        ax1.plot(*zip(*vis), "o-", color="#4c78a8", label="visible tests passed")
    if grd:
        ax1.plot(*zip(*grd), "s-", color="#e45756", label="hidden-grade score")
    ax1.set(title=f"Lab {lab['lab']}: score over attempts", xlabel="attempt", ylabel="% of points", ylim=(-5, 105))
    ax1.grid(alpha=0.3)
    if vis or grd:
        ax1.legend(loc="lower right", fontsize=8)
    metrics = sorted({m for h in hist for m in h["perf"]})
    for m in metrics:
        pts = [(i, h["perf"][m]) for i, h in zip(x, hist) if m in h["perf"]]
        ax2.plot(*zip(*pts), "o-", label=m)
        spec = perf_specs.get(m)
        if spec is not None:
            ax2.axhline(spec.full_credit, color="green", ls="--", lw=1, label=f"full credit ≤ {spec.full_credit:g}")
            ax2.axhline(spec.zero_credit, color="red", ls=":", lw=1, label=f"no credit ≥ {spec.zero_credit:g}")
    ax2.set(title="perf ratio over attempts (lower is better)", xlabel="attempt", ylabel="your time / baseline")
    ax2.grid(alpha=0.3)
    if metrics:
        ax2.legend(loc="upper right", fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no perf figures recorded", ha="center", va="center", transform=ax2.transAxes)
    for ax in (ax1, ax2):
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path"}):  # text as paths: no font needed by the viewer
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE (its DTD is a remote URL)
    return re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; } tr.lab td { background: #fafafa; font-weight: bold; border-top: 2px solid #888; }
.note { color: #666; font-size: 0.85em; } svg { max-width: 100%; height: auto; }
"""


def render_html(summary: dict, course) -> str:
    """A self-contained page: the progress table and, per attempted lab, the plots
    (inline SVG). No scripts, no external stylesheets, fonts or images."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "\n".join(f"<tr class='{'lab' if is_lab else 'part'}'>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                     + "</tr>" for is_lab, cells in table_rows(summary))
    plots = []
    for lab in summary["labs"]:
        if lab["history"]:
            plots.append(f"<h2>Lab {esc(lab['lab'])} — {esc(lab['title'])}</h2>\n"
                         f"<figure>{_plot_svg(lab, course.labs[lab['lab']].perf)}</figure>")
    if not plots:
        plots.append("<p class='note'>No attempts recorded yet: run <code>pytest labs/NN</code> or "
                     "<code>labs grade . --lab NN</code>.</p>")
    generated = datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>Progress — {esc(summary['course'])}</title><style>{_CSS}</style></head><body>\n"
            f"<h1>Progress — {esc(summary['course'])}</h1>\n"
            f"<p class='note'>Generated {generated} from {esc(summary['db'])}. Recorded locally; nothing is sent "
            f"anywhere. Perf ratios are your time / the baseline's (lower is better).</p>\n"
            f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
            + "\n".join(plots) + "\n</body></html>\n")
