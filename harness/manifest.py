"""The course manifest, ``labs.yaml``: labs, parts, points, perf thresholds, limits.

Loaded into typed pydantic models and validated once; a bad file fails with
its path, the key and what was expected (the ``configurator.py`` habit:
unknown keys are refused, not ignored). The harness knows labs only through
this file: adding lab NN changes no harness code.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Dict, List, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MANIFEST = "labs.yaml"


class ManifestError(Exception):
    """``labs.yaml`` is missing or invalid; the message names file and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Limits(_Strict):
    """Resources for grading one submission of a lab."""

    timeout_s: int = Field(1200, gt=0, description="wall-clock limit for the whole grader run, seconds")
    test_timeout_s: int = Field(300, gt=0, description="limit for one grader test, seconds")
    call_timeout_s: float = Field(30.0, gt=0, description=(
        "limit for one call into the sandboxed submission, seconds: a generous multiple of the reference's "
        "slowest call plus a few seconds, so a hanging submission fails fast (two timeouts end its grading)"))
    memory_mb: int = Field(8192, gt=0, description="memory limit of the grading worker, MiB")
    cpus: float = Field(2.0, gt=0)
    pids: int = Field(512, gt=0)


class Part(_Strict):
    title: str
    points: float = Field(gt=0)
    bonus: bool = Field(False, description="bonus points: earned on top of the lab's maximum score")


class PerfThreshold(_Strict):
    """Partial credit for a time ratio (student / baseline, lower is better).

    Full credit at or below ``full_credit``, none at or above ``zero_credit``,
    linear in between. A wrong answer earns no performance credit at all.
    """

    full_credit: float = Field(gt=0)
    zero_credit: float = Field(gt=0)
    baseline: str = Field(description="what the ratio is measured against, in words")

    @model_validator(mode="after")
    def _ordered(self):
        if self.zero_credit <= self.full_credit:
            raise ValueError(f"zero_credit ({self.zero_credit}) must exceed full_credit ({self.full_credit})")
        return self

    def credit(self, ratio: float) -> float:
        """Fraction of the test's points earned at time ratio ``ratio``."""
        if ratio != ratio or ratio <= 0:  # NaN or nonsense: no credit
            return 0.0
        frac = (self.zero_credit - ratio) / (self.zero_credit - self.full_credit)
        return min(1.0, max(0.0, frac))


class Lab(_Strict):
    number: str = ""  # filled from the key
    title: str
    module: str = Field(description="module file name without .py, in labs/NN/ and solutions/NN/")
    api: List[str] = Field(description="public names every implementation must define")
    parts: Dict[str, Part]
    perf: Dict[str, PerfThreshold] = {}
    requires: List[str] = Field([], description="optional packages the lab needs, e.g. triton")
    world_sizes: List[int] = Field([1], description="process-group sizes the graders spawn")
    limits: Limits = Limits()

    @field_validator("module")
    @classmethod
    def _identifier(cls, v):
        if not v.isidentifier():
            raise ValueError(f"module must be a Python identifier, got {v!r}")
        return v

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


class Images(_Strict):
    cpu: str = "ai-infra-labs:cpu"
    gpu: str = "ai-infra-labs:gpu"


class Course(_Strict):
    name: str
    images: Images = Images()
    labs: Dict[str, Lab]
    root: Optional[Path] = None  # directory holding labs.yaml

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
        """The lab numbered ``number`` ('4', 4 or '04'); ``KeyError`` names the known labs."""
        key = f"{int(number):02d}" if str(number).isdigit() else str(number)
        try:
            return self.labs[key]
        except KeyError:
            raise KeyError(f"no lab {number!r} in {MANIFEST}; labs: {', '.join(sorted(self.labs))}") from None


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


def _format_error(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid course manifest"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime: float) -> Course:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ManifestError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return Course(**data, root=path.parent)
    except ValidationError as e:
        raise ManifestError(_format_error(path, e)) from None


def load(root: Path | str | None = None) -> Course:
    """Load and validate ``labs.yaml`` from ``root`` (default: ``find_root()``)."""
    root = Path(root).resolve() if root else find_root()
    path = root / MANIFEST
    if not path.is_file():
        raise ManifestError(f"{path}: no such file")
    return _load(path, path.stat().st_mtime)
