"""Demo: grade real submissions of lab 04 with the hidden graders.

Grades the reference, the stub and two mutants (realistic buggy student
submissions from tests/mutants/04) exactly as `labs grade` does, and prints
each score. Run with `make demo`. Each submission takes a minute or more on a
CPU (the Triton interpreter): a progress line says which one is being graded, a
line every 30 s that it still is, and each buggy version's line names its bug
and what the graders said about it.
"""
import ast
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.cli.common import console as cli_console  # noqa: E402
from harness import grading, manifest  # noqa: E402
from tests.conftest import materialize_mutant  # noqa: E402

MUTANTS = ["causal_top_left", "no_rescale_accumulator"]
TICK_S = 30.0


def bug_of(mutant: Path) -> str:
    """The bug a mutant plants: the first sentence of its docstring, on one line."""
    doc = ast.get_docstring(ast.parse(mutant.read_text())) or mutant.stem
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")


def first_failure(result) -> str:
    """The first failed test and its message, on one line."""
    for t in result.tests:
        if t.outcome in ("failed", "error"):
            return f"{t.name}: {' '.join(t.output.split())[:160]}"
    return "no test failed"


def main(console: Console | None = None) -> int:
    course = manifest.load(ROOT)
    lab = course.lab("04")
    console = console or cli_console()
    table = Table(title="Lab 04 (Flash Attention): hidden-grader scores")
    for col in ("Submission", "Score", "Runnable max", "Max", "Failed tests", "Time"):
        table.add_column(col)
    not_run = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        subs = {"reference (solutions/)": (ROOT / "solutions", None), "stub (labs/)": (ROOT / "labs", None)}
        for name in MUTANTS:
            path = ROOT / "tests" / "mutants" / "04" / f"{name}.py"
            subs[f"mutant: {name}"] = (materialize_mutant(path, lab, Path(tmp) / name), bug_of(path))
        bugs = []
        for i, (label, (path, bug)) in enumerate(subs.items(), 1):
            console.print(escape(f"[{i}/{len(subs)}] grading {label} ..."))
            start, done = time.monotonic(), threading.Event()

            def tick(label=label, start=start, done=done):
                while not done.wait(TICK_S):
                    console.print(escape(f"      still grading {label}: {time.monotonic() - start:.0f} s"))

            threading.Thread(target=tick, daemon=True).start()
            try:
                r = grading.grade(path, lab, course)
            finally:
                done.set()
            failed = sum(t.outcome in ("failed", "error", "not run") for t in r.tests)
            not_run = r.max_score - r.max_score_runnable
            console.print(escape(f"[{i}/{len(subs)}] {label}: {r.score:.1f} / {r.max_score_runnable:.1f} runnable "
                                 f"points, {failed} test(s) failed, {time.monotonic() - start:.0f} s"))
            if bug:
                bugs.append(f"{label}: the bug: {bug}; the graders said: {first_failure(r)}")
            table.add_row(label, f"{r.score:.1f}", f"{r.max_score_runnable:.1f}", f"{r.max_score:.1f}",
                          str(failed), f"{r.duration_s:.0f} s")
    console.print(table)
    for line in bugs:
        console.print(escape(line), soft_wrap=True)
    if not_run:  # a legend: the totals are capped here, not silently
        console.print(f"Runnable max: the points this machine can award. {not_run:g} of the {lab.points:g} points "
                      f"need a CUDA GPU (tests marked gpu): they are skipped here and graded on a GPU runner.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
