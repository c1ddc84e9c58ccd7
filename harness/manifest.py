"""The course manifest, ``labs.yaml``: labs, parts, points, perf thresholds, limits.

Loaded into typed pydantic models and validated once; a bad file fails with
its path, the key and what was expected (the ``configurator.py`` habit:
unknown keys are refused, not ignored). The harness knows labs only through
this file: adding lab NN changes no harness code.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from .errors import LabsError

MANIFEST = "labs.yaml"
STAFF_DIR = ".labs-staff"  # staff outputs and the grading secret: git-ignored, never released


class ManifestError(LabsError):
    """``labs.yaml`` is missing or invalid, or names no such lab; the message (one
    line) names file and key, ``hint`` says what to fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    """Resources for grading one submission of a lab."""

    timeout_s: int = Field(1200, gt=0, description="wall-clock limit for the whole grader run, seconds")
    test_timeout_s: int = Field(300, gt=0, description="limit for one grader test, seconds")
    call_timeout_s: float = Field(30.0, gt=0, description=(
        "wall-clock seconds one call into the sandboxed submission may wait without computing (a sleep, a "
        "deadlock; also its import): a hanging submission fails fast, two timeouts end its grading"))
    call_cpu_s: float = Field(60.0, gt=0, description=(
        "CPU seconds one call may use (the worker's own CPU time, which the machine's load cannot inflate): a "
        "generous multiple of the reference's slowest call; a call still computing past call_timeout_s goes on "
        "until this, or six times call_timeout_s"))
    memory_mb: int = Field(8192, gt=0, description="memory limit of the grading worker, MiB")
    cpus: float = Field(2.0, gt=0)
    pids: int = Field(512, gt=0)


class Part(_Strict):
    title: str
    points: float = Field(gt=0)
    bonus: bool = Field(False, description="bonus points: earned on top of the lab's maximum score")


class PerfThreshold(_Strict):
    """Partial credit for a time ratio (student / baseline, lower is better).

    Full credit at or below ``full_credit``, none at or above ``zero_credit``, and
    ``bands`` equal steps in between (the credit at the middle of each band's linear
    share): a ratio measured until its interval lies inside one band
    (``harness.sandbox.timing.timed``) gets the same credit on a regrade, where a linear
    rule would follow the timing noise. A wrong answer earns no performance credit at all.
    """

    full_credit: float = Field(gt=0)
    zero_credit: float = Field(gt=0)
    baseline: str = Field(description="what the ratio is measured against, in words")
    bands: int = Field(4, ge=1, le=20, description="credit steps between full_credit and zero_credit")
    speedup: bool = Field(False, description="the baseline is the same work without the technique graded "
                                             "(speculative decoding, continuous batching): no credit from 1.0, "
                                             "and `labs calibrate` suggests thresholds below it")

    @model_validator(mode="after")
    def _ordered(self):
        if self.zero_credit <= self.full_credit:
            raise ValueError(f"zero_credit ({self.zero_credit}) must exceed full_credit ({self.full_credit})")
        if self.speedup and self.zero_credit > 1.0:
            raise ValueError(f"a speedup key earns nothing from 1.0 (no faster than its baseline): zero_credit "
                             f"({self.zero_credit}) must be at most 1.0")
        return self

    def edges(self) -> list[float]:
        """The band edges: ``full_credit``, the ``bands - 1`` between, ``zero_credit``."""
        step = (self.zero_credit - self.full_credit) / self.bands
        return [self.full_credit + k * step for k in range(self.bands + 1)]

    def credit(self, ratio: float) -> float:
        """Fraction of the test's points earned at time ratio ``ratio``: 1 up to ``full_credit``,
        0 from ``zero_credit``, ``1 - (j - 1/2) / bands`` in band ``j`` (1-based) between."""
        if ratio != ratio or ratio <= 0:  # NaN or nonsense: no credit
            return 0.0
        if ratio <= self.full_credit:
            return 1.0
        if ratio >= self.zero_credit:
            return 0.0
        j = sum(1 for e in self.edges()[1:-1] if e < ratio) + 1
        return 1.0 - (j - 0.5) / self.bands


class Lab(_Strict):
    number: str = ""  # filled from the key
    title: str
    module: str = Field(description="module file name without .py, in labs/NN/ and solutions/NN/")
    api: List[str] = Field(description="public names every implementation must define")
    given: List[str] = Field([], description="api names the stub gives finished (the reference's own "
                                              "definition, e.g. lab 05's decoder), or a task class's methods "
                                              "as Class.method (lab 08's __init__); every other api name and "
                                              "every other method of a task class is a task")
    parts: Dict[str, Part]
    perf: Dict[str, PerfThreshold] = {}
    requires: List[str] = Field([], description="optional packages the lab needs, e.g. triton")
    limits: Limits = Limits()
    deadline: Optional[datetime] = Field(None, description="submissions to the course server (`labs submit`) "
                                         "after it are late (see `submissions.late`); ISO 8601 with a time zone")

    @field_validator("deadline")
    @classmethod
    def _aware(cls, v):
        if v is not None and v.tzinfo is None:
            raise ValueError(f"deadline {v.isoformat()} has no time zone (write e.g. 2026-12-18T23:59:00+00:00)")
        return v

    @field_validator("module")
    @classmethod
    def _identifier(cls, v):
        if not v.isidentifier():
            raise ValueError(f"module must be a Python identifier, got {v!r}")
        return v

    @model_validator(mode="after")
    def _given_in_api(self):
        extra = [n for n in self.given if n.split(".")[0] not in self.api or n.count(".") > 1
                 or not all(part.isidentifier() for part in n.split("."))]
        if extra:
            raise ValueError(f"given names {extra} are not in api {self.api} (or Class.method of one)")
        if not self.tasks:
            raise ValueError(f"every api name is given ({self.given}): a lab needs at least one task")
        return self

    @property
    def tasks(self) -> list[str]:
        """The api names students write: every one but the ``given`` ones."""
        return [n for n in self.api if n not in self.given]

    def given_methods(self, cls: str) -> list[str]:
        """The methods of task class ``cls`` the stub gives finished (``given: [Class.method]``)."""
        return [n.split(".")[1] for n in self.given if n.startswith(cls + ".")]

    @property
    def points(self) -> float:
        """Maximum score: the points of every part but the bonus ones."""
        return sum(p.points for p in self.parts.values() if not p.bonus)

    @property
    def bonus_points(self) -> float:
        return sum(p.points for p in self.parts.values() if p.bonus)

    @property
    def filename(self) -> str:
        return f"{self.module}.py"


@dataclasses.dataclass(frozen=True)
class LabPaths:
    """Where one lab's files lie in a course tree: the one place that spells
    ``labs/NN/<module>.py`` (nbgrader's ``CourseDirectory.format_path``). ``root`` is the
    course root (``Course.paths(lab)``), a checkout or an unpacked submission, or
    ``Path()`` for the paths as messages name them (``relative``)."""

    root: Path
    number: str
    filename: str  # <module>.py

    @classmethod
    def of(cls, lab: "Lab", root: Path | str = Path()) -> "LabPaths":
        """The paths of ``lab`` under ``root`` (default: relative to the course root)."""
        return cls(Path(root), lab.number, lab.filename)

    @property
    def relative(self) -> "LabPaths":
        """The same paths relative to the root (``labs/04/flash_attention.py``): for messages."""
        return dataclasses.replace(self, root=Path())

    @property
    def folder(self) -> Path:
        """``labs/NN/``: what students get (handout, stub, visible tests)."""
        return self.root / "labs" / self.number

    @property
    def stub(self) -> Path:
        """``labs/NN/<module>.py``: the stub in the course, the student's module in a checkout."""
        return self.folder / self.filename

    @property
    def handout(self) -> Path:
        return self.folder / "README.md"

    @property
    def reference(self) -> Path:
        """``solutions/NN/<module>.py``."""
        return self.root / "solutions" / self.number / self.filename

    @property
    def folders(self) -> tuple[Path, ...]:
        """The folders the lab owns (``labs new`` makes them, all or none): ``labs/NN``,
        ``solutions/NN``, ``graders/NN``, ``tests/mutants/NN``."""
        return self.folder, self.root / "solutions" / self.number, self.graders, self.mutants

    @property
    def graders(self) -> Path:
        """``graders/NN/``: the hidden graders."""
        return self.root / "graders" / self.number

    @property
    def mutants(self) -> Path:
        return self.root / "tests" / "mutants" / self.number

    @property
    def exploits(self) -> Path:
        return self.root / "tests" / "exploits" / self.number

    @property
    def variants(self) -> Path:
        return self.root / "tests" / "variants" / self.number

    def in_impl(self, impl_root: Path | str) -> Path:
        """``IMPL/NN/<module>.py``: the module in an implementation folder (``--impl PATH``,
        a staged submission, an upload's one member)."""
        return Path(impl_root) / self.number / self.filename


class RateLimit(_Strict):
    """A token bucket per student and lab (the course server's intake): ``burst``
    submissions at once, refilled at ``per_hour``; over it a submission gets HTTP 429
    with ``Retry-After``."""

    burst: int = Field(5, gt=0)
    per_hour: float = Field(12.0, gt=0)


class Late(_Strict):
    """What the course server does with a submission after its lab's ``deadline``."""

    grace_minutes: float = Field(0, ge=0, description="still on time this long after the deadline")
    max_days: float = Field(0, ge=0, description="accepted, marked late, up to this many days after; refused later")
    penalty_per_day: float = Field(0, ge=0, le=1, description="fraction of the score taken per started late day")


class Submissions(_Strict):
    """The course server's intake (`labs serve`, `labs submit`)."""

    max_kb: int = Field(512, gt=0, description="largest upload, KiB (the packed module)")
    rate: RateLimit = RateLimit()
    late: Late = Late()
    hidden_results: Literal["always", "after_deadline", "never"] = Field(
        "after_deadline", description="when a student sees each hidden test's name and message (the score and "
                                      "part subtotals always)")


class LateDays(_Strict):
    """A course-wide budget of late days (``late_days: {budget: 5}``): each student's
    late days across all labs are free until the budget is spent; the days past it cost
    ``submissions.late.penalty_per_day`` each (the course server, its exports)."""

    budget: int = Field(0, ge=0, description="late days each student may spend across labs without a penalty")


class Trials(_Strict):
    """Trial runs (``labs submit NN --trial``): the visible and perf tests on the grading
    hardware, not a submission; ``per_lab`` of them per student and lab."""

    per_lab: int = Field(3, ge=0, description="trial runs each student may make of each lab (0: none)")


class Images(_Strict):
    cpu: str = "ai-infra-labs:cpu"
    gpu: str = "ai-infra-labs:gpu"


class Course(_Strict):
    name: str
    images: Images = Images()
    submissions: Submissions = Submissions()
    late_days: LateDays = LateDays()
    trials: Trials = Trials()
    perf_calibrated_on: List[str] = Field([], description="the device models (`labs runner doctor`'s gpu_model, "
                                          "or cpu) the perf thresholds were calibrated on (`labs calibrate`); a perf "
                                          "test on another model is not_run, not graded (empty: every model)")
    labs: Dict[str, Lab]
    gpu_points: Dict[str, float] = Field({}, description="points per lab that only a GPU can earn, as `labs "
                                         "release` writes them into a student checkout (which has no graders "
                                         "to count them from); a staff tree leaves it out")
    root: Optional[Path] = None  # directory holding labs.yaml

    @model_validator(mode="after")
    def _gpu_points_of_labs(self):
        extra = sorted(set(self.gpu_points) - set(self.labs))
        if extra:
            raise ValueError(f"gpu_points names labs {extra} that labs does not list")
        return self

    @field_validator("labs", mode="before")
    @classmethod
    def _numbers(cls, labs):
        if not isinstance(labs, dict):
            return labs
        out = {}
        for key, lab in labs.items():
            key = str(key)
            if not re.fullmatch(r"\d\d", key):
                raise ValueError(f"lab keys are two-digit strings such as '04', got {key!r}")
            out[key] = {**lab, "number": key} if isinstance(lab, dict) else lab
        return out

    def lab(self, number: str | int) -> Lab:
        """The lab numbered ``number`` ('4', 4 or '04'). Raises ManifestError naming the
        number given and the labs ``labs.yaml`` lists."""
        key = f"{int(number):02d}" if str(number).isdigit() else str(number)
        if key not in self.labs:
            raise ManifestError(f"no lab {number!r} ({MANIFEST} lists {', '.join(sorted(self.labs))})",
                                hint="`labs list` shows the labs")
        return self.labs[key]

    def paths(self, lab: Lab) -> LabPaths:
        """Every path of ``lab`` in this course (stub, handout, reference, graders, mutants,
        exploits, variants)."""
        return LabPaths.of(lab, self.root or Path())

    def staff_output(self, path: Path | None, default: str, option: str) -> Path:
        """Where a staff command writes (grades, autograder zips, nbgrader courses):
        ``path``, else ``<course>/.labs-staff/<default>`` (created, mode 0700). Raises
        LabsError naming ``option`` (the command-line option that gave ``path``) for a
        path inside the course tree but outside ``.labs-staff/`` (a commit or a copy of
        the tree would take hidden graders or grades along), and for a path whose parent
        folder does not exist (a typo is not silently created)."""
        root = self.root.resolve()
        staff = root / STAFF_DIR
        if path is None:
            staff.mkdir(mode=0o700, exist_ok=True)
            return staff / default
        out = Path(path).resolve()
        if (out == root or root in out.parents) and not (out == staff or staff in out.parents):
            raise LabsError(f"{option} {path} is inside the course tree {root}",
                            hint=f"staff outputs go to {STAFF_DIR}/ (the default: git-ignored, never "
                                 f"released) or a folder outside the course")
        require_folder(path, option)
        return out


def require_folder(path: Path | str | None, option: str) -> None:
    """An output path's folder must exist: a typo is not silently created. Raises LabsError
    naming ``option`` (the command-line option that gave ``path``); ``None``: nothing to check."""
    if path is None:
        return
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise LabsError(f"{option} {path}: the folder {parent} does not exist",
                        hint="create it first, or pass a path in an existing folder")


def find_root(start: Path | str | None = None) -> Path:
    """The course root: ``$LABS_COURSE``, else the first directory at or above
    ``start`` (default: cwd) that holds ``labs.yaml``. Raises ManifestError."""
    env = os.environ.get("LABS_COURSE")
    if env:
        p = Path(env).resolve()
        if not (p / MANIFEST).is_file():
            raise ManifestError(f"LABS_COURSE={env} holds no {MANIFEST}")
        return p
    here = Path(start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        if (d / MANIFEST).is_file():
            return d
    raise ManifestError(f"no {MANIFEST} in {here} or any parent (run inside the course repository, or set LABS_COURSE)")


def _format_error(path: Path, err: ValidationError) -> ManifestError:
    """One line naming every bad key (``labs.04.parts.A.points: ...``), and a hint naming the first."""
    errors = [(".".join(str(x) for x in e["loc"]) or "(top level)", e["msg"]) for e in err.errors()]
    listed = "; ".join(f"{loc}: {msg}" for loc, msg in errors)
    return ManifestError(f"{path}: invalid course manifest: {listed}",
                         hint=f"fix `{errors[0][0]}` in {path.name}")


def _check_tree(course: Course, path: Path) -> None:
    """A lab whose folder ``labs/NN/`` is in this tree must hold the module ``labs.yaml``
    names (a tree may hold only some labs: a Gradescope zip, a release with ``--lab``)."""
    for num, lab in sorted(course.labs.items()):
        paths = course.paths(lab)
        if paths.folder.is_dir() and not paths.stub.is_file():
            there = sorted(p.name for p in paths.folder.glob("*.py") if not p.name.startswith("test_"))
            raise ManifestError(f"{path}: invalid course manifest: labs.{num}.module: {lab.module!r} names "
                                f"{paths.relative.stub}, which does not exist (labs/{num} holds "
                                f"{', '.join(there) or 'no module'})",
                                hint=f"fix `labs.{num}.module` in {path.name} or rename the file")


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> Course:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ManifestError(f"{path}: not valid YAML{where}: {what}",
                            hint=f"fix the YAML syntax of {path.name}{where}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a mapping at the top level, got {type(data).__name__}",
                            hint=f"{path.name} holds `name:` and `labs:` keys")
    try:
        course = Course(**data, root=path.parent)
    except ValidationError as e:
        raise _format_error(path, e) from None
    _check_tree(course, path)
    return course


# --- the stub check (release, nbgrader export) ---------------------------------

def load(root: Path | str | None = None) -> Course:
    """Load and validate ``labs.yaml`` from ``root`` (default: ``find_root()``)."""
    root = Path(root).resolve() if root else find_root()
    path = root / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path}: no such file")
    return _load(path, path.stat().st_mtime)
