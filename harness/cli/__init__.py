"""``labs``: the command line for students and course staff.

Verb first (``labs list``, ``labs test 04``, ``labs grade PATH --lab 04``).
Data goes to stdout (or ``--json FILE``); errors are one line on stderr,
``labs: error: <what> (<where>)`` plus a hint, tracebacks only with
``--traceback``. Exit codes are ``ExitCode``.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import click
from rich import box
from rich.markup import escape
from rich.table import Table

from .. import container, files, grading, manifest, progress, progress_report, records
from ..errors import LabsError
from .common import console, course_of
from .submit import COMMANDS as SUBMIT_COMMANDS


class _Labs(click.Group):
    """The ``labs`` group: every ``LabsError`` (harness.errors) a command raises is one
    line on stderr, ``labs: error: <message>``, its hint below, and its exit code;
    ``--traceback`` shows the Python traceback instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LabsError as e:
            if (ctx.obj or {}).get("traceback"):
                raise
            click.echo(f"labs: error: {e.message}", err=True)
            if e.hint:
                click.echo(f"  hint: {e.hint}", err=True)
            ctx.exit(int(e.code))


@click.group(cls=_Labs, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--course", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Course root holding labs.yaml (default: search upwards from the current directory).")
@click.option("--traceback", is_flag=True, help="Show Python tracebacks for errors.")
@click.pass_context
def main(ctx, course, traceback):
    """Auto-graded AI-infrastructure labs: test, grade and track your work."""
    ctx.ensure_object(dict)
    ctx.obj.update(course=course, traceback=traceback)


@main.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the labs as JSON.")
@click.pass_context
def list_labs(ctx, as_json):
    """List the labs with their parts, points and GPU needs."""
    course = course_of(ctx)
    rows = []
    for num, lab in sorted(course.labs.items()):
        try:
            gpu = grading.gpu_points(course, lab)
        except grading.GradingError:
            gpu = None
        paths = course.paths(lab)
        rows.append({"lab": num, "title": lab.title, "module": paths.relative.stub.as_posix(),
                     "parts": {k: p.points for k, p in lab.parts.items()}, "points": lab.points,
                     "gpu_points": gpu, "gpu": "unknown (graders fail to collect)" if gpu is None else
                     f"{gpu:g} pts need a GPU" if gpu else "none",
                     "stub": paths.stub.is_file()})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=course.name)
    for col in ("Lab", "Title", "Parts (points)", "Total", "GPU", "Module"):
        table.add_column(col)
    for r in rows:
        parts = ", ".join(f"{k} {v:g}" + (" bonus" if course.labs[r["lab"]].parts[k].bonus else "")
                          for k, v in r["parts"].items())
        table.add_row(r["lab"], r["title"], parts, f"{r['points']:g}", r["gpu"],
                      r["module"] if r["stub"] else f"{r['module']} (missing)")
    console().print(table)


@main.command("test", context_settings={"ignore_unknown_options": True})
@click.argument("lab")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def test(ctx, lab, pytest_args):
    """Run a lab's visible tests: the same as `pytest labs/NN [PYTEST_ARGS]`."""
    course = course_of(ctx)
    lab = course.lab(lab)
    cmd = [sys.executable, "-m", "pytest", manifest.LabPaths.of(lab).folder.as_posix(), *pytest_args]
    ctx.exit(subprocess.call(cmd, cwd=course.root))


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write Gradescope's results.json schema to this file.")
@click.option("--seed", type=int, default=None, help="Replay a run seed (default: a fresh secret seed).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Wall-clock limit in seconds for the whole run (default: labs.yaml).")
@click.option("--sandbox", type=click.Choice(grading.SANDBOXES), default=None,
              help="Where the graders run: docker (the course's grading image: no network, resource "
                   "limits) or process (a local child process). Default: docker when a Docker engine "
                   "answers and holds this course's image, else process, with a note saying why.")
@click.pass_context
def grade(ctx, path, lab_number, json_path, seed, timeout_s, sandbox):
    """Grade the code at PATH with the hidden graders.

    PATH is a checkout root holding labs/NN/ or a directory holding NN/<module>.py
    (`solutions` for the reference, `labs` for the stubs). Exit status 0 whenever
    grading ran, whatever the score.
    """
    course = course_of(ctx)
    lab = course.lab(lab_number)
    if not path.is_dir():
        raise LabsError(f"submission {path} is not a directory", hint="pass a checkout or a folder holding NN/<module>.py")
    why = ""  # why the default sandbox is a local process: a note after grading (errors come first)
    if sandbox is None:
        sandbox, why = container.choose_sandbox(course)
    manifest.require_folder(json_path, "--json")
    result = grading.grade(path, lab, course, seed=seed, timeout_s=timeout_s, sandbox=sandbox)
    cause = _one_cause(result, path, lab)
    for note in ([why] if why else []) + [n for n in result.notes if n not in cause]:
        click.echo(f"labs: note: {note}", err=True)
    if cause:  # every test failed the same way: one line, not a row per test
        click.echo(f"Lab {lab.number} — {lab.title}: {result.submission}: score {result.score:g} / "
                   f"{result.max_score:g}: {cause}")
    else:
        _print_result(result, lab)
    problem = progress.record_grade(result, lab, course)  # local history for `labs progress`
    if problem:
        click.echo(f"labs: warning: progress not recorded ({problem})", err=True)
    if json_path:
        files.write_json(json_path, result.to_gradescope())


def _one_cause(result: records.GradeResult, path: Path, lab) -> str:
    """Why no test could load the implementation, when each that ran failed the same way
    (``impl_error``): the first message, and for a missing module the near misses in the
    submission (``GQA.py``, ``gqa_solution.py``). Empty otherwise."""
    ran = [t for t in result.tests if t.runnable]
    kinds = {t.impl_error for t in ran}
    if not ran or len(kinds) != 1 or (kind := kinds.pop()) not in records.IMPL_ERRORS:
        return ""
    first = ran[0].output.splitlines()[0] if ran[0].output else kind
    text = f"{records.IMPL_ERRORS[kind]}: {first.removeprefix(records.IMPL_ERRORS[kind] + ': ')}"
    if kind == "missing":
        import difflib
        in_path = manifest.LabPaths.of(lab, path)
        found = sorted({p.relative_to(path).as_posix() for d in (path, in_path.in_impl(path).parent, in_path.folder)
                        for p in d.glob("*.py") if p.is_file()})
        near = [f for f in found if lab.module.lower() in Path(f).stem.lower()
                or difflib.get_close_matches(Path(f).name.lower(), [lab.filename], n=1, cutoff=0.6)]
        if near:
            text += f"; found {', '.join(near)}: the file must be named {lab.filename} exactly"
    return text


MESSAGE_CHARS = 400  # of a message's first line in the table (it wraps); --json keeps every line


def _print_result(result: records.GradeResult, lab) -> None:
    """The grade table; readable in an 80-column terminal: long test names fold (never
    cut), a parametrized test's case id goes on its own line, messages wrap."""
    table = Table(title=f"Lab {lab.number} — {lab.title}: {result.submission}")
    table.add_column("Part", no_wrap=True)
    table.add_column("Test", overflow="fold", min_width=16, ratio=3)
    table.add_column("Result", no_wrap=True)
    table.add_column("Points", justify="right", no_wrap=True)
    table.add_column("Message", overflow="fold", ratio=4)
    style = {"passed": "green", "failed": "red", "error": "red", "not_run": "yellow", "not run": "red"}
    for t in result.tests:
        msg = t.output.splitlines()[0] if t.output else ""  # the headline: it names the bug class
        msg = msg if len(msg) <= MESSAGE_CHARS else msg[:MESSAGE_CHARS - 1] + "…"
        base, bracket, case = t.name.partition("[")
        table.add_row(t.part, escape(base + (f"\n[{case}" if bracket else "")),
                      f"[{style.get(t.outcome, '')}]{t.outcome}[/]", f"{t.score:.2f}/{t.max_score:.2f}", escape(msg))
    out = console()
    out.print(table)
    out.print(f"score {result.score:g} / {result.max_score:g} "
                  f"(runnable here: {result.max_score_runnable:g}); seed {result.seed}; "
                  f"{result.duration_s:.1f} s")


# --- your progress (harness.progress: the local store) ----------------------------

@main.command("progress")
@click.argument("lab_number", required=False, metavar="[NN]")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a self-contained HTML report with plots to this file.")
@click.pass_context
def progress_command(ctx, lab_number, as_json, html_path):
    """Your local progress per lab and part: visible tests, local grades, perf, attempts.

    Recorded on this machine by `pytest labs/NN` and `labs grade` (nothing is sent
    anywhere); the store is $LABS_PROGRESS_DB or the user data directory.
    """
    course = course_of(ctx)
    manifest.require_folder(html_path, "--html")
    lab = course.lab(lab_number).number if lab_number else None
    try:
        summary = progress_report.summarize(course, lab=lab)
    except progress.ProgressError as e:
        raise LabsError(str(e), hint="set LABS_PROGRESS_DB to another file, or `labs reset`") from None
    if html_path:
        files.write_atomic(html_path, progress_report.render_html(summary, course), perms=files.SHARED)
        click.echo(f"labs: wrote {html_path}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    if html_path:
        return
    table = Table(title=f"{course.name}: local progress", box=box.SIMPLE_HEAD, pad_edge=False)
    for c in progress_report.SHORT_COLUMNS:
        table.add_column(c, justify="right" if c in ("Runs", "Grades") else "left", no_wrap=c != "Best perf")
    for is_lab, cells in progress_report.table_rows(summary, short=True):
        table.add_row(*cells, style="bold" if is_lab else None)
    console().print(table)
    missing = progress_report.not_run_lines(summary)
    if missing:
        click.echo("Not run on this hardware (not verified here: neither passed nor failed):")
        for line in missing:
            click.echo(f"  {line}")
    click.echo(f"Visible: tests passed at the last `pytest labs/NN`; grades: local `labs grade` scores; "
               f"perf ratio: your time / baseline (lower is better). Recorded in {summary['db']}; "
               "`labs progress --html FILE` plots your attempts.")


@main.command("reset")
@click.argument("lab_number", required=False, metavar="[NN]")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
def reset_command(ctx, lab_number, yes):
    """Delete your recorded progress (all labs, or lab NN)."""
    course = course_of(ctx)
    lab = course.lab(lab_number).number if lab_number else None
    what = f"lab {lab}" if lab else f"every lab of {course.name}"
    try:
        n = len(progress.load_runs(progress.checkout(course), lab))
    except progress.ProgressError as e:
        raise LabsError(str(e)) from None
    if n == 0:
        click.echo(f"nothing recorded for {what}")
        return
    if not yes:
        click.confirm(f"Delete {n} recorded run(s) of {what} from {progress.db_path()}?", abort=True)
    try:
        deleted = progress.delete_runs(progress.checkout(course), lab)
    except progress.ProgressError as e:
        raise LabsError(str(e)) from None
    click.echo(f"deleted {deleted} recorded run(s) of {what}")



for _command in SUBMIT_COMMANDS:  # labs login, submit, status: the course server
    main.add_command(_command)

# --- staff commands (harness.cli.staff); a student release has none of them --------

try:
    _staff = importlib.import_module(f"{__package__}.staff")
except ModuleNotFoundError as _e:  # harness.release.STAFF_HARNESS: left out of a student release
    if _e.name != f"{__package__}.staff":
        raise
else:
    for _command in _staff.COMMANDS:
        main.add_command(_command)
