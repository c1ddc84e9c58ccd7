"""Demo: grade real submissions of lab 04 with the hidden graders.

Grades the reference, the stub and two mutants (realistic buggy student
submissions from tests/mutants/04) exactly as `labs grade` does, and prints
each score. Run with `make demo`.
"""
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import grading, manifest  # noqa: E402
from tests.conftest import materialize_mutant  # noqa: E402

MUTANTS = ["causal_top_left", "no_rescale_accumulator"]


def main() -> int:
    course = manifest.load(ROOT)
    lab = course.lab("04")
    console = Console()
    table = Table(title="Lab 04 (Flash Attention): hidden-grader scores")
    for col in ("Submission", "Score", "Runnable max", "Max", "Failed tests", "Time"):
        table.add_column(col)
    not_run = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        subs = {"reference (solutions/)": ROOT / "solutions", "stub (labs/)": ROOT / "labs"}
        for name in MUTANTS:
            path = ROOT / "tests" / "mutants" / "04" / f"{name}.py"
            subs[f"mutant: {name}"] = materialize_mutant(path, lab, Path(tmp) / name)
        for label, path in subs.items():
            console.print(f"grading {label} ...")
            r = grading.grade(path, lab, course)
            failed = sum(t.outcome in ("failed", "error", "not run") for t in r.tests)
            not_run = r.max_score - r.max_score_runnable
            table.add_row(label, f"{r.score:.1f}", f"{r.max_score_runnable:.1f}", f"{r.max_score:.1f}",
                          str(failed), f"{r.duration_s:.0f} s")
    console.print(table)
    if not_run:  # a legend: the totals are capped here, not silently
        console.print(f"Runnable max: the points this machine can award. {not_run:g} of the {lab.points:g} points "
                      f"need a CUDA GPU (tests marked gpu): they are skipped here and graded on a GPU runner.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
