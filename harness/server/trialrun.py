"""What a runner runs for a trial (``trials``): the lab's visible tests (``labs/NN/``)
and the graders' performance tests only (``-k perf``), on the stored module in the
worker sandbox, never the hidden correctness graders. Returns each visible test's
outcome and each perf figure beside the thresholds it would be graded against."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .. import grading
from ..manifest import Course, LabPaths
from ..progress import NOT_RUN_MARK


def _visible(course: Course, lab, impl_root: Path, work: Path) -> list[dict]:
    results = work / "visible.json"
    argv = [sys.executable, "-m", "pytest", str(course.paths(lab).folder), "--impl", str(impl_root), "--sandbox",
            "worker", "--labs-results", str(results), "--rootdir", str(course.root), "-q", "-p", "no:cacheprovider",
            "-o", "addopts=--import-mode=importlib", f"--timeout={lab.limits.test_timeout_s}"]
    env = {**os.environ, "LABS_COURSE": str(course.root), "LABS_PROGRESS": "off", "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run(argv, cwd=course.root, env=env, capture_output=True, timeout=lab.limits.timeout_s)
    raw = json.loads(results.read_text()) if results.is_file() else {"tests": []}
    return [_test(t) for t in raw["tests"]]


def _test(t: dict) -> dict:
    message = t.get("message") or ""
    if t["outcome"] == "skipped":
        return {"name": t["name"], "outcome": "not_run", "message": message.partition(NOT_RUN_MARK)[2] or message}
    return {"name": t["name"], "outcome": t["outcome"], "message": message[:1000]}


def _perf(course: Course, lab, impl_root: Path, work: Path, seed: int) -> list[dict]:
    raw, _note = grading.run(course, lab, impl_root, work / "perf.json", seed, select="perf")
    rows = []
    for t in raw["tests"]:
        if not t.get("perf_test"):
            continue
        base = {"test": t["name"], **{k: v for k, v in _test(t).items() if k != "name"}}
        figures = [p for p in t["perf"] if p["name"] in lab.perf] or [{"name": t.get("perf_key") or "", "ratio": None}]
        for p in figures:
            th = lab.perf.get(p["name"])
            ratio = p.get("ratio")
            rows.append({**base, "key": p["name"], "ratio": ratio,
                         "baseline": th.baseline if th else "", "full_credit": th.full_credit if th else None,
                         "zero_credit": th.zero_credit if th else None,
                         "credit": th.credit(ratio) if th and ratio is not None and t["outcome"] == "passed" else None})
    return rows


def run(course: Course, lab_number: str, module: bytes, host: dict) -> dict:
    """Run a trial of ``module``: ``{"visible": [...], "perf": [...], "gpu_model", "duration_s"}``."""
    lab = course.lab(lab_number)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="labs-trial-") as tmp:
        work = Path(tmp)
        impl_root = grading.stage(grading.Module(module, LabPaths.of(lab).in_impl("").as_posix()), lab, work)
        visible = _visible(course, lab, impl_root, work)
        perf = _perf(course, lab, impl_root, work, seed=int.from_bytes(os.urandom(4), "big"))
    return {"visible": visible, "perf": perf, "gpu_model": host.get("gpu_model", "cpu"),
            "duration_s": round(time.monotonic() - t0, 2)}
