"""`make demo` (scripts/demo.py) says what it is doing and what each buggy version gets
wrong (issue 33.8): a progress line per submission, one line per buggy version naming
its bug and the graders' message. The grading itself is replaced by a quick stand-in."""
from __future__ import annotations

import importlib.util
import io
from pathlib import Path

from rich.console import Console

from harness.records import GradeResult, TestResult

ROOT = Path(__file__).resolve().parents[1]


def test_demo_prints_progress_per_submission_and_each_bug(monkeypatch):
    spec = importlib.util.spec_from_file_location("labs_demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    graded = []

    def grade(path, lab, course):
        graded.append(path)
        bad = "mutant" in str(path) or "causal" in str(path) or "rescale" in str(path)
        t = TestResult("test_part_b_matches_float64_attention[x]", "n", "B", 10.0, 0.0 if bad else 10.0,
                       "failed" if bad else "passed", "AssertionError: causal mask looks top-left aligned")
        return GradeResult(lab.number, str(path), 1, [t], 0.1)

    monkeypatch.setattr(demo.grading, "grade", grade)
    out = io.StringIO()
    assert demo.main(Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert len(graded) == 4
    for i in range(1, 5):
        assert f"[{i}/4] grading " in text and f"[{i}/4] " in text.split(f"[{i}/4] grading ")[1]
    lines = [ln for ln in text.splitlines() if "the bug:" in ln]
    assert len(lines) == 2, text
    assert lines[0].startswith("mutant: causal_top_left: the bug: Triton kernel masks causally top-left aligned")
    assert "the accumulator" in lines[1].lower() or "rescal" in lines[1].lower(), lines[1]
    assert all("the graders said: test_part_b_matches_float64_attention[x]" in ln for ln in lines)
