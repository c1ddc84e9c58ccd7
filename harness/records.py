"""The typed record of grading, from ``grading`` to every front end and the course server.

``TestResult`` is one grader test's outcome and points; ``GradeResult`` one run of the
hidden graders (``grading.grade``); ``Graded`` one submission's grading whatever
happened (``grading.grade_one``): a grade, the student's error, a timeout or an
infrastructure failure, told apart by its ``Status`` (from records in the results,
never from messages). Front ends carry these records; Gradescope's ``results.json``
is an export of them (``to_gradescope``), never read back as an interface, and the
course server stores ``Graded.to_json()``.
"""
from __future__ import annotations

import dataclasses
import enum
import statistics
from dataclasses import asdict, dataclass, field

NOT_RUN = "not_run"  # a test this hardware could not run (no GPU, an uncalibrated model): neither passed nor failed
STATUS_MAX = 300  # characters of a status: one CSV-friendly line
IMPL_ERRORS = {"import": "import error", "api": "api mismatch", "missing": "no module", "timeout": "timeout"}


class Status(str, enum.Enum):
    """What a grading means for the grade (``extra_data.status_kind`` in results.json)."""
    OK = "ok"
    STUDENT_ERROR = "student_error"  # the submission's fault: final, 0 for what could not run
    TIMEOUT = "timeout"              # stopped at its time limit: final, what was graded counts
    INFRA_ERROR = "infra_error"      # not the submission's fault: no score, graded again


def one_line(text: str) -> str:
    """A status as one CSV-friendly line of at most ``STATUS_MAX`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= STATUS_MAX else text[: STATUS_MAX - 3] + "..."


@dataclass
class TestResult:
    """One grader test: its part, points and outcome."""
    name: str
    nodeid: str
    part: str
    max_score: float
    score: float
    outcome: str  # passed, failed, error, not_run (this hardware could not run it), not run (never reached)
    output: str = ""
    duration_s: float = 0.0
    tags: list[str] = field(default_factory=list)
    perf: list[dict] = field(default_factory=list)
    bonus: bool = False  # counts in score, not in max_score
    impl_error: str = ""  # "missing", "import", "api" or "timeout": the implementation could not be loaded

    def __post_init__(self):
        """A test the grading pipeline reports ``skipped`` (it needs what this machine
        lacks) is ``not_run``, with its reason: in every record, old ones read back too."""
        if self.outcome == "skipped":
            self.outcome = NOT_RUN
            self.tags = [NOT_RUN if t == "skipped" else t for t in self.tags]
            reason = self.output.removeprefix("skipped: ").removeprefix("not verified here: ")
            self.output = f"not verified here: {reason}"

    @property
    def runnable(self) -> bool:
        return self.outcome != NOT_RUN

    @property
    def not_run_reason(self) -> str:
        """Why this hardware could not run the test ("" when it ran)."""
        return self.output.removeprefix("not verified here: ") if self.outcome == NOT_RUN else ""


def _gradescope_test(t: TestResult, visibility: str) -> dict:
    """One test of Gradescope's ``results.json``. A test not run here (``not_run``: it
    needs a GPU this machine lacks, or perf on a model not calibrated) is neither passed
    nor failed: no ``status`` and ``max_score`` 0 (Gradescope shows it neutral, not as a
    failure), ``extra_data.status`` ``not_run``, its worth in ``extra_data.not_run_points``
    and the reason in ``extra_data.not_run_reason`` and its output."""
    entry = {"name": f"{t.part}: {t.name}", "score": t.score, "max_score": t.max_score,
             "output": t.output, "visibility": visibility, "tags": t.tags, "extra_data": {"part": t.part}}
    if not t.runnable:
        entry.update(max_score=0.0, output=f"not run here, worth {t.max_score:.4g} points: {t.not_run_reason}")
        entry["extra_data"].update(status=NOT_RUN, not_run_points=t.max_score, not_run_reason=t.not_run_reason)
    else:
        entry["status"] = "passed" if t.outcome == "passed" and t.score >= t.max_score - 1e-9 else "failed"
    return entry


@dataclass
class GradeResult:
    """One run of a lab's hidden graders on one submission."""
    lab: str
    submission: str
    seed: int
    tests: list[TestResult]
    duration_s: float
    notes: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    module: str = ""   # the graded file, relative to the submission ("" when none): impl.locate
    stopped: str = ""  # why the run was stopped at its time limit (tests not reached score 0)

    @property
    def score(self) -> float:
        """The sum of the tests' scores, rounded to 4 places once (results.json keeps each
        test's score unrounded, so every total -- grades.csv, the gradebook, results.json
        -- is the same sum, without per-test rounding drift)."""
        return round(sum(t.score for t in self.tests), 4)

    @property
    def max_score(self) -> float:
        """Points of every non-bonus test (bonus tests add to ``score`` only)."""
        return round(sum(t.max_score for t in self.tests if not t.bonus), 4)

    @property
    def max_score_runnable(self) -> float:
        return round(sum(t.max_score for t in self.tests if t.runnable and not t.bonus), 4)

    @property
    def bonus_runnable(self) -> float:
        """Bonus points this hardware could grade (a GPU bonus is not run on a CPU)."""
        return round(sum(t.max_score for t in self.tests if t.runnable and t.bonus), 4)

    def leaderboard(self) -> list[dict]:
        """The perf figures, as Gradescope's leaderboard lists them (ratios to 4 places; a
        name recorded by several cases gets the case id, so names stay unique)."""
        figures = [(p["name"], t.name.partition("[")[2].rstrip("]"), p["ratio"])
                   for t in self.tests for p in t.perf if p.get("ratio") is not None]
        names = [n for n, _, _ in figures]
        return [{"name": f"{n} [{case}]" if names.count(n) > 1 and case else n, "value": round(r, 4),
                 "order": "asc"} for n, case, r in figures]

    def to_gradescope(self, visibility: str = "visible") -> dict:
        """Gradescope's autograder ``results.json`` schema."""
        return {"score": self.score, "execution_time": round(self.duration_s, 2),
                "output": "\n".join(self.notes), "visibility": visibility, "stdout_visibility": "hidden",
                "tests": [_gradescope_test(t, visibility) for t in self.tests], "leaderboard": self.leaderboard(),
                "extra_data": {"lab": self.lab, "max_score": self.max_score,
                               "max_score_runnable": self.max_score_runnable,
                               "bonus_score": round(sum(t.score for t in self.tests if t.bonus), 4),
                               "ignored_files": self.ignored, "module": self.module}}

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(score=self.score, max_score=self.max_score, max_score_runnable=self.max_score_runnable)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "GradeResult":
        """The record ``to_json`` wrote (its totals are recomputed, never read)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"tests"}
        return cls(**{k: v for k, v in d.items() if k in known}, tests=[TestResult(**t) for t in d["tests"]])


def part_scores(results: dict) -> dict[str, float]:
    """Points per part of a Gradescope ``results.json`` written by ``to_gradescope``
    (each test's ``extra_data.part``; a test without one, such as the autograder's
    "Submission check", counts for no part), summed as the score is."""
    out: dict[str, float] = {}
    for t in results.get("tests", []):
        part = (t.get("extra_data") or {}).get("part")
        if part is not None:
            out[part] = out.get(part, 0.0) + float(t["score"])
    return {k: round(v, 4) for k, v in out.items()}


def status_of(result: GradeResult) -> str:
    """``ok``, or the reason a submission did not grade normally, from the records
    in its result: ``stopped`` (timeout) and the tests' ``impl_error`` (every test
    that ran failed to load the implementation the same way)."""
    if result.stopped:
        return f"timeout: {result.stopped}"
    ran = [t for t in result.tests if t.runnable]
    hung = [t for t in ran if t.impl_error == "timeout"]
    if hung:  # a call that hung (or an import): what was graded counts, the status says why the rest did not
        first = hung[0].output.splitlines()[0] if hung[0].output else "a call timed out"
        return f"timeout: {first.removeprefix('timeout: ')}"
    kinds = {t.impl_error for t in ran}
    if ran and len(kinds) == 1 and (kind := kinds.pop()) in IMPL_ERRORS:
        first = ran[0].output.splitlines()[0] if ran[0].output else kind
        return f"{IMPL_ERRORS[kind]}: {first.removeprefix(IMPL_ERRORS[kind] + ': ')}"
    return "ok"


def kind_of(result: GradeResult, status: str) -> Status:
    """The ``Status`` of a graded result whose status text is ``status``."""
    if result.stopped or status.startswith("timeout"):
        return Status.TIMEOUT
    return Status.OK if status == "ok" else Status.STUDENT_ERROR


@dataclass
class Graded:
    """One submission's grading, whatever happened: the record ``grading.grade_one``
    returns and the course server stores. ``result`` is the grader run (None when
    none ran: an unpack error, no module, an infrastructure failure); ``scored`` False:
    no score at all (an infrastructure failure, a submission staff must choose)."""
    lab: str
    status: str             # one line: "ok", or why not ("import error: ...", "infra_error: ...")
    kind: Status
    lab_points: float       # the lab's points: the maximum when no test ran
    result: GradeResult | None = None
    duration_s: float = 0.0
    scored: bool = True

    def __post_init__(self):
        self.status, self.kind = one_line(self.status), Status(self.kind)

    @classmethod
    def of(cls, result: GradeResult, lab_points: float, duration_s: float = 0.0) -> "Graded":
        """The record of a grader run: its status and kind read from the result's records."""
        status = status_of(result)
        return cls(result.lab, status, kind_of(result, status), lab_points, result, duration_s)

    @property
    def ok(self) -> bool:
        return self.kind is Status.OK

    @property
    def retry(self) -> bool:
        """Not final: graded again (an infrastructure failure)."""
        return self.kind is Status.INFRA_ERROR

    @property
    def score(self) -> float | None:
        return None if not self.scored else self.result.score if self.result else 0.0

    @property
    def max_score(self) -> float:
        """The run's maximum (its non-bonus tests), else the lab's points."""
        return self.result.max_score if self.result else self.lab_points

    @property
    def max_score_runnable(self) -> float | None:
        return self.result.max_score_runnable if self.result else None

    def part_scores(self) -> dict[str, float]:
        """Points per part, summed as the score is."""
        return part_scores(self.to_gradescope())

    def perf_ratio(self) -> float | None:
        """The median of the run's perf ratios (the leaderboard's figure); None without
        any, or when the grade is not ``ok``."""
        ratios = [e["value"] for e in self.result.leaderboard()] if self.ok and self.result else []
        return float(statistics.median(ratios)) if ratios else None

    def to_gradescope(self, **extra) -> dict:
        """Gradescope's ``results.json`` of this grading (an export), with the status in
        its output and ``extra_data`` (``status``, ``status_kind``, the seed) and
        ``extra`` added to ``extra_data`` (the student, the submission's fingerprint)."""
        if self.result is None:
            res = {"score": self.score, "execution_time": 0.0, "output": self.status, "visibility": "visible",
                   "stdout_visibility": "hidden", "tests": [], "leaderboard": [],
                   "extra_data": {"lab": self.lab, "max_score": self.lab_points, "max_score_runnable": None,
                                  "seed": None, "ignored_files": []}}
        else:
            res = self.result.to_gradescope()
            res["extra_data"]["seed"] = self.result.seed  # staff output: replay a disputed grade with --seed
            if self.status != "ok":
                res["output"] = "\n".join(x for x in (self.status, res["output"]) if x)
        res["extra_data"].update(extra, status=self.status, status_kind=self.kind.value)
        return res

    def to_json(self) -> dict:
        """The record as JSON (what a runner sends and the course server stores)."""
        return {**asdict(self), "kind": self.kind.value,
                "result": None if self.result is None else self.result.to_json()}

    @classmethod
    def from_json(cls, d: dict) -> "Graded":
        """The record ``to_json`` wrote. Raises KeyError, TypeError or ValueError for
        anything else."""
        known = {f.name for f in dataclasses.fields(cls)} - {"result"}
        result = None if d.get("result") is None else GradeResult.from_json(d["result"])
        return cls(**{k: v for k, v in d.items() if k in known}, result=result)
