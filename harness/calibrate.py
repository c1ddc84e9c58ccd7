"""``labs calibrate``: the reference's performance ratios on this machine, and the
thresholds they suggest (design: "Performance grading").

A perf threshold is a time ratio, yours / baseline, measured in one run (labs.yaml
``perf``: full credit at or below ``full_credit``, none at or above ``zero_credit``).
Whether the reference earns full credit depends on the GPU model, so staff run this on
each model the runners have and set the thresholds from what it prints: the reference's
ratio times a margin for full credit, and a multiple of that for none.
"""
from __future__ import annotations

import statistics
from pathlib import Path

from . import grading
from .manifest import Course, Lab

FULL_MARGIN = 1.3   # full credit up to 30% slower than the reference (run-to-run noise, honest variants)
ZERO_FACTOR = 3.0   # no credit from 3x the full-credit ratio


def suggest(ratio: float, speedup: bool = False) -> tuple[float, float]:
    """(full_credit, zero_credit) for a reference ``ratio``, rounded to 2 places:
    ``max(1, ratio) * FULL_MARGIN`` and ``ZERO_FACTOR`` times that; for a ``speedup`` key
    (``PerfThreshold.speedup``: the baseline is the same work without the technique) the
    reference's own ratio times ``FULL_MARGIN`` and 1.0, since doing no better than the
    baseline earns nothing. Raises ValueError for a speedup key whose reference is not faster
    than ``1 / FULL_MARGIN`` of its baseline here: no thresholds would tell the technique from
    its absence on this machine."""
    if speedup:
        full = round(ratio * FULL_MARGIN, 2)
        if full >= 1.0:
            raise ValueError(f"the reference's ratio {ratio:.3g} is not below 1/{FULL_MARGIN} on this machine: "
                             "its speed-up is within the noise, so no thresholds can be suggested")
        return full, 1.0
    full = round(max(1.0, ratio) * FULL_MARGIN, 2)
    return full, round(full * ZERO_FACTOR, 2)


def calibrate(course: Course, lab: Lab, gpu_model: str, *, timeout_s: float | None = None) -> dict:
    """Grade the reference (``solutions/``) on this machine, only the perf tests (pytest
    ``-k perf``: their marker), and return per perf key of ``lab``: the median ratio over
    the recorded cases, each case's ratio, the labs.yaml thresholds, the credit the
    reference earns under them, and the suggested thresholds; keys whose test could not
    run here (a GPU test on a CPU host) have ``ratio`` None, and ``not_run`` lists those
    tests with why. Raises GradingError when grading cannot run."""
    result = grading.grade(Path(course.root) / "solutions", lab, course, timeout_s=timeout_s, select="perf")
    keys: dict[str, dict] = {k: {"baseline": t.baseline, "full_credit": t.full_credit, "zero_credit": t.zero_credit,
                                 "cases": [], "ratio": None} for k, t in lab.perf.items()}
    for test in result.tests:
        for entry in test.perf:
            if entry["name"] in keys and entry.get("ratio") is not None:
                keys[entry["name"]]["cases"].append({"test": test.name, "ratio": entry["ratio"]})
    for k, row in keys.items():
        if row["cases"]:
            row["ratio"] = statistics.median(c["ratio"] for c in row["cases"])
            row["credit"] = lab.perf[k].credit(row["ratio"])
            try:
                row["suggested_full_credit"], row["suggested_zero_credit"] = suggest(row["ratio"], lab.perf[k].speedup)
            except ValueError as e:
                row["suggested_full_credit"] = row["suggested_zero_credit"] = None
                row["problem"] = str(e)
    not_run = [f"{t.name}: {t.outcome}: {t.output[:200]}" for t in result.tests if not t.perf]
    return {"lab": lab.number, "gpu_model": gpu_model, "duration_s": round(result.duration_s, 1), "perf": keys,
            "not_run": not_run}
