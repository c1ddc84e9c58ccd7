"""The staff commands of ``labs``: grade a class, export to nbgrader and Gradescope,
build the grading images, release the student repository, scaffold a lab.

Each command parses its options, calls one front end (plain functions, no click:
``harness.classroom``, ``harness.nbgrader_export``, ``harness.gradescope``,
``harness.release``, ``harness.container``) and prints what it did; errors are
``LabsError`` (harness.errors), shown by the ``labs`` group. A student release
has no such module (``harness.release.STAFF_HARNESS``).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import click
from rich.markup import escape  # names and statuses are the students' text, never markup
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import (archives, classroom, container, gradebook as gradebook_api, gradescope, grading, nbgrader_export,
               release, scaffold)
from ..errors import ExitCode, LabsError
from ..manifest import LabPaths
from .common import console, course_of
from .server import COMMANDS as SERVER_COMMANDS
from .runner import COMMANDS as RUNNER_COMMANDS


# --- labs grade-all ---------------------------------------------------------------

def _default_jobs() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


def _max_text(ed: dict, lab) -> str:
    """A row's maximum, and what of it could run here when GPU tests could not ("100 (43.6 here)")."""
    top, runnable = ed.get("max_score", lab.points), ed.get("max_score_runnable")
    return f"{top:g}" + (f" ({runnable:g} here)" if runnable is not None and runnable < top else "")


def _gpu_max(rows) -> float:
    """The points no row could earn here for want of a GPU (0 when every test ran)."""
    eds = [r.results["extra_data"] for r in rows]
    return max((ed["max_score"] - ed["max_score_runnable"] for ed in eds
                if ed.get("max_score") is not None and ed.get("max_score_runnable") is not None), default=0.0)


@click.command("grade-all")
@click.argument("submissions", type=click.Path(path_type=Path))
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--jobs", "-j", type=int, default=None,
              help="Submissions graded at once (default: half the CPU cores).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where results go: OUT/grades.csv and OUT/students/<student>/results.json "
                   "(default: .labs-staff/grades-labNN, git-ignored and never released).")
@click.option("--gradebook", default=None, metavar="URL",
              help="Also record part scores in an nbgrader gradebook (sqlite:///gradebook.db, postgresql://...).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Wall-clock limit per submission, seconds (default: labs.yaml).")
@click.option("--sandbox", type=click.Choice(grading.SANDBOXES), default=None,
              help="Where the graders run: docker or process (default: as for `labs grade`).")
@click.option("--force", is_flag=True, help="Regrade every submission, even those already graded in OUT.")
@click.option("--max-unpacked-mb", type=int, default=archives.DEFAULT_MAX_UNPACKED_MB, show_default=True,
              help="Refuse archives that unpack to more than this.")
@click.pass_context
def grade_all_command(ctx, submissions, lab_number, jobs, out_dir, gradebook, timeout_s, sandbox, force,
                      max_unpacked_mb):
    """Grade every student's submission in SUBMISSIONS/ with the hidden graders.

    One entry per student: a folder (a checkout, NN/<module>.py, or the lab files)
    or a .zip/.tar.gz of one. Results are written as each submission finishes, so
    a killed run picks up where it stopped. Exit status 0 whenever grading ran.
    """
    course = course_of(ctx)
    lab = course.lab(lab_number)
    if not submissions.is_dir():
        raise LabsError(f"submissions folder {submissions} is not a directory",
                        hint="pass a folder holding one folder or archive per student")
    out = course.staff_output(out_dir, f"grades-lab{lab.number}", "--out")
    jobs = jobs or _default_jobs()
    if sandbox is None:
        sandbox, why = container.choose_sandbox(course)
        if why:
            click.echo(f"labs: note: {why}", err=True)
    if gradebook:
        try:
            gradebook_api.require_nbgrader()
        except ImportError as e:
            raise LabsError(str(e), hint="pip install 'ai-infra-labs[nbgrader]'") from None

    con = console()
    err = console(stderr=True)
    tty = con.is_terminal
    state = {"total": 0, "skipped": 0, "done": 0, "failed": 0}
    progress = task = None
    if tty:
        progress = Progress(TextColumn("[bold]lab {task.fields[lab]}[/]"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("ok {task.fields[ok]}  [red]failed {task.fields[failed]}[/]"),
                            TimeElapsedColumn(), console=console, transient=False)

    def on_start(total, skipped):
        state.update(total=total, skipped=skipped)
        if skipped:
            err.print(escape(f"labs: note: skipping {skipped} submission(s) already graded in {out} "
                             f"(--force regrades)"))
        if progress is not None:
            nonlocal task
            progress.start()
            task = progress.add_task("grading", total=total - skipped, lab=lab.number, ok=0, failed=0)
        else:
            con.print(f"grading {total - skipped} of {total} submission(s) of lab {lab.number}, "
                          f"{jobs} at a time")

    def on_row(row: classroom.Row):
        state["done"] += 1
        if not row.ok:
            state["failed"] += 1
        if progress is not None:
            progress.update(task, advance=1, ok=state["done"] - state["failed"], failed=state["failed"])
        else:
            ed = row.results["extra_data"]
            con.print(escape(f"[{state['done']}/{state['total'] - state['skipped']}] {row.student}: "
                                 f"{classroom.score_text(row.results) or '-'}/{_max_text(ed, lab)} {row.status} "
                                 f"({row.duration_s:.1f} s)"))

    stop = threading.Event()
    try:
        run = classroom.grade_all(submissions, lab, course, out, jobs=jobs, timeout_s=timeout_s, sandbox=sandbox,
                        force=force, gradebook=gradebook, max_bytes=max_unpacked_mb << 20,
                        on_start=on_start, on_row=on_row, stop=stop)
    except classroom.GradebookError as e:
        raise LabsError(str(e), hint="pass an SQLAlchemy URL: sqlite:///gradebook.db or postgresql://...") from None
    except classroom.OutputError as e:
        raise LabsError(str(e), hint="pass another --out, or move that path away") from None
    finally:
        if progress is not None:
            progress.stop()
    for note in run.notes:
        err.print(escape(f"labs: note: {note}"))
    if not run.rows:
        err.print(escape(f"labs: warning: {submissions} holds no submission (one folder or archive per student): "
                         f"nothing was graded"))

    table = Table(title=f"Lab {lab.number} — {lab.title}: {len(run.rows)} submission(s)")
    for col, kw in (("Student", {}), ("Score", {"justify": "right"}), ("Max", {"justify": "right"}),
                    ("Status", {}), ("Time", {"justify": "right"})):
        table.add_column(col, **kw)
    for r in run.rows:
        ed = r.results["extra_data"]
        style = "green" if r.ok else "red"
        table.add_row(escape(r.student), classroom.score_text(r.results) or "-", _max_text(ed, lab),
                      f"[{style}]{escape(r.status[:90])}[/]", "skipped" if r.skipped else f"{r.duration_s:.1f} s")
    con.print(table)
    scores = [r.results["score"] for r in run.rows if r.results.get("score") is not None]
    mean = sum(scores) / len(scores) if scores else 0.0
    ambiguous = sum(bool(r.results["extra_data"].get("entries")) for r in run.rows)
    con.print(escape(f"{len(run.graded)} graded now, {len(run.rows) - len(run.graded)} skipped (already graded), "
                         f"{sum(not r.ok for r in run.rows)} not ok"
                         + (f" ({ambiguous} ambiguous: keep one entry each and rerun)" if ambiguous else "")
                         + f"; mean {mean:.2f} / {lab.points:g}"
                         + (f" ({lab.points - gpu:g} runnable without a GPU)" if (gpu := _gpu_max(run.rows)) else "")
                         + "; "
                         f"results in {out}/ ({classroom.CSV_NAME}, {classroom.STUDENTS_DIR}/<student>/{classroom.RESULTS_NAME})"))
    if run.gradebook_error:
        raise LabsError(f"grades.csv and results.json are complete, but recording in the gradebook stopped: "
                        f"{run.gradebook_error}", ExitCode.GRADING_FAILED,
                        hint="fix the gradebook and rerun with the same --out and --gradebook: "
                             "graded submissions are skipped and recorded again")
    if run.grading_errors:
        first = run.grading_errors[0].status
        raise LabsError(f"grading failed for {len(run.grading_errors)} submission(s): {first}",
                        ExitCode.GRADING_FAILED, hint="check graders/ and labs.yaml; rerun to retry those")


# --- labs nbgrader ---------------------------------------------------------------

@click.group("nbgrader")
def nbgrader_group():
    """nbgrader: export the labs as an nbgrader course; collect the submitted modules for `grade-all --gradebook`."""


@nbgrader_group.command("export")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path), required=False)
@click.option("--lab", "lab_numbers", multiple=True, help="Export only this lab (repeatable; default: all).")
@click.pass_context
def export_command(ctx, dest, lab_numbers):
    """Write an nbgrader course to DEST (default: .labs-staff/nbgrader; never elsewhere
    inside the course tree): nbgrader_config.py, source/labNN/labNN.ipynb per lab (the
    reference in a solution region, feedback cells that do not count) and the hidden
    graders in DEST/labs_course/. A lab whose stub looks solved is refused, before
    anything is written.

    Grades: `nbgrader generate_assignment labNN`, `nbgrader collect labNN`, then
    `labs nbgrader collect-modules DEST --lab NN` and `labs grade-all ... --gradebook`.
    """
    course = course_of(ctx)
    labs = [course.lab(n) for n in lab_numbers] or None
    dest = course.staff_output(dest, "nbgrader", "DEST")
    try:
        notes = nbgrader_export.export_course(course, dest, labs)
    except nbgrader_export.ExportError as e:
        raise LabsError(str(e), hint="restore the stub (git checkout -- labs/NN/<module>.py, or git stash), "
                                     "then export again; nothing was written") from None
    for note in notes:
        click.echo(f"labs: note: {note}", err=True)
    written = sorted(p.relative_to(dest) for p in (dest / "source").glob("*/*.ipynb"))
    for p in written:
        click.echo(f"wrote {dest / p}")
    click.echo(f"hidden graders in {dest / nbgrader_export.COURSE_DIR}; next: cd {dest} && nbgrader generate_assignment "
               f"{written[0].parent.name if written else 'labNN'}")


@nbgrader_group.command("collect-modules")
@click.argument("nb_course", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Where to write STUDENT/NN/<module>.py (default: NB_COURSE/{nbgrader_export.MODULES_DIR}/labNN).")
@click.pass_context
def collect_modules_command(ctx, nb_course, lab_number, out_dir):
    """Extract the module cell of each notebook in NB_COURSE/submitted/*/labNN/
    (after `nbgrader collect labNN`) into OUT/STUDENT/NN/<module>.py, as text:
    nothing is run. Then grade them: `labs grade-all OUT --lab NN --gradebook URL`."""
    lab = course_of(ctx).lab(lab_number)
    out = out_dir or nb_course / nbgrader_export.MODULES_DIR / nbgrader_export.assignment_name(lab)
    try:
        students, notes = nbgrader_export.collect_modules(nb_course, lab, out)
    except FileNotFoundError as e:
        raise LabsError(str(e)) from None
    for note in notes:
        click.echo(f"labs: note: {note}", err=True)
    db = (nb_course / "gradebook.db").resolve()
    click.echo(f"wrote {len(students) - len(notes)} of {len(students)} modules into {out}; next: labs grade-all "
               f"{out} --lab {lab.number} --gradebook sqlite:///{db}")


# --- labs gradescope -------------------------------------------------------------

@click.group("gradescope")
def gradescope_group():
    """Gradescope: build the autograder zip for a lab."""


@gradescope_group.command("build")
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Zip to write (default: .labs-staff/gradescope-labNN.zip; never inside the course "
                   "tree elsewhere: the zip holds the hidden graders).")
@click.option("--visibility", type=click.Choice(gradescope.VISIBILITIES), default="after_published", show_default=True,
              help="Gradescope visibility of the hidden grader tests.")
@click.option("--server", default=None, help="the course server's URL: forward each submission there for its "
                                             "GPU tests (needs a bridge token)")
@click.option("--server-token", envvar="LABS_BRIDGE_TOKEN", default=None,
              help="a bridge account's token (labs account add gradescope --role bridge; or LABS_BRIDGE_TOKEN)")
@click.pass_context
def build_command(ctx, lab_number, out, visibility, server, server_token):
    """Write the Gradescope autograder zip for a lab (setup.sh, run_autograder, the
    harness and the lab's hidden graders; never solutions/)."""
    course = course_of(ctx)
    lab = course.lab(lab_number)
    out = course.staff_output(out, f"gradescope-lab{lab.number}.zip", "--out")
    try:
        names = gradescope.build_zip(course, lab, out, visibility, server=server, server_token=server_token)
    except ValueError as e:
        raise LabsError(str(e), ExitCode.USAGE) from None
    except FileNotFoundError as e:
        raise LabsError(str(e), ExitCode.USAGE, hint="graders/NN/ must exist to build an autograder") from None
    click.echo(f"wrote {out} ({len(names)} files, {out.stat().st_size / 1024:.0f} KiB): upload it as the "
               f"autograder of lab {lab.number}")
    gpu = grading.gpu_points(course, lab)
    if gpu and server:
        click.echo(f"{gpu:g} GPU points are graded on the course server {server}")
    elif gpu:
        click.echo(f"labs: warning: {gpu:g} of lab {lab.number}'s {lab.points:g} points need a GPU, and "
                   f"Gradescope's workers have none: those tests show as not run and score 0. Either rescale "
                   f"the assignment to the runnable maximum ({lab.points - gpu:g} points; results.json "
                   f"extra_data.max_score_runnable), or grade the GPU tests on the course's GPU runners.",
                   err=True)


@gradescope_group.command("finalize", hidden=True)
@click.argument("raw", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--status", type=int, default=0, help="Exit status of `labs grade`.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--lab", "lab_number", required=True)
@click.option("--visibility", type=click.Choice(gradescope.VISIBILITIES), default="after_published")
@click.option("--server-results", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="what `gradescope forward` wrote (when the zip names a course server)")
@click.pass_context
def finalize_command(ctx, raw, out, status, log_path, lab_number, visibility, server_results):
    """(run_autograder) Write Gradescope's results.json from `labs grade --json` output."""
    course = course_of(ctx)
    lab = course.lab(lab_number)
    log = log_path.read_text(errors="replace") if log_path and log_path.is_file() else ""
    try:
        gpu = grading.gpu_points(course, lab)
    except grading.GradingError:
        gpu = 0.0
    res = gradescope.finalize(raw, out, status=status, log=log, lab=lab, visibility=visibility,
                              server_results=server_results, gpu_points=gpu)
    click.echo(f"results.json: score {res['score']:g}, {len(res['tests'])} tests")


@gradescope_group.command("forward", hidden=True)
@click.argument("submission", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lab", "lab_number", required=True)
@click.option("--metadata", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Gradescope's submission_metadata.json (names the student)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--wait", "wait_s", type=float, default=gradescope.FORWARD_WAIT_S, show_default=True)
@click.pass_context
def forward_command(ctx, submission, lab_number, metadata, out, wait_s):
    """(run_autograder) Forward the submission to the course server named in server.json
    and wait for its GPU runners' grade."""
    course = course_of(ctx)
    got = gradescope.forward(course, submission, course.lab(lab_number), metadata, out, wait_s=wait_s)
    click.echo(f"forward: {got.get('error') or 'graded on ' + str(got.get('gpu_model'))}")


# --- labs image ------------------------------------------------------------------

@click.group()
def image():
    """Build the grading images (docker/: one locked environment, CPU and CUDA)."""


@image.command("build")
@click.option("--gpu", is_flag=True, help="Build the CUDA image (labs.yaml images.gpu) instead of the CPU one.")
@click.option("--base-image", default=None, metavar="IMG",
              help="Base image (default python:3.11-slim, or an NVIDIA CUDA base with --gpu). When the "
                   "default is neither present nor pullable, a Debian base is made with debootstrap.")
@click.option("--tag", default=None, help="Image name (default: labs.yaml images.cpu / images.gpu).")
@click.pass_context
def image_build(ctx, gpu, base_image, tag):
    """Build the grading image that `labs grade --sandbox docker` runs.

    It holds the locked environment, the harness, the lab stubs and the hidden
    graders (readable by root only), never the solutions or a submission."""
    course = course_of(ctx)
    try:
        built = container.build_image(course, gpu=gpu, base_image=base_image, tag=tag,
                                      log=lambda m: click.echo(f"labs: {m}", err=True))
    except container.ContainerError as e:
        if ctx.obj["traceback"]:
            raise
        first, *rest = str(e).splitlines()
        for line in rest:
            click.echo(line, err=True)
        raise LabsError(first, ExitCode.GRADING_FAILED,
                        hint="start the Docker engine; see docker/ and `labs image build --help`") from None
    for note in built.notes:
        click.echo(f"labs: note: {note}", err=True)
    v = built.versions
    click.echo(f"built {built.tag} on {built.base}: {built.size_bytes / 1e9:.2f} GB, {built.build_s:.0f} s; its "
               f"Python {v['python']}: torch {v['torch']} (CUDA {v['cuda'] or 'none'}), triton {v['triton']}, "
               f"harness importable")


# --- labs release ----------------------------------------------------------------

@click.command("release")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--lab", "labs", multiple=True, help="Release only this lab's folder (repeatable; default: all).")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Leave out more paths (fnmatch on the posix path).")
@click.option("--force", is_flag=True, help="Replace OUT when it is not empty.")
@click.pass_context
def release_command(ctx, out, labs, exclude, force):
    """Write the student repository to OUT: only the student-facing files git tracks
    (labs.yaml, labs/NN/, the harness students run, the lock), a student README and
    Makefile; every check runs before anything is written.

    In OUT, `make setup` and `pytest labs/NN` run the visible tests on the stubs.
    """
    course = course_of(ctx)
    numbers = [course.lab(n).number for n in labs] or None
    try:
        p = release.release(course, out, labs=numbers, exclude=list(exclude), force=force)
    except release.ReleaseError as e:
        raise LabsError(str(e), hint=e.hint) from None
    click.echo(f"wrote {len(p.files)} files to {out}:")
    for n in sorted(p.files):
        click.echo(f"  {n}")
    groups: dict[tuple[str, str], int] = {}
    for n, why in p.refused.items():
        top = n.split("/")[0] + ("/" if "/" in n else "")
        key = (top if why in release.GROUPED else n, why)
        groups[key] = groups.get(key, 0) + 1
    click.echo(f"refused {len(p.refused)} files (not student-facing):")
    for (what, why), count in sorted(groups.items()):
        click.echo(f"  {what}" + (f" ({count} files)" if count > 1 else "") + f": {why}")


# --- labs new ----------------------------------------------------------------------

@click.command("new")
@click.argument("number", metavar="NN")
@click.option("--module", required=True, help="The lab's module (a lower-case Python identifier), e.g. kv_cache.")
@click.option("--title", default=None, help="The lab's title (default: the module name in words).")
@click.pass_context
def new_command(ctx, number, module, title):
    """Scaffold lab NN from the templates: stub, handout and visible test in labs/NN/,
    the reference in solutions/NN/, a grader suite in graders/NN/, one mutant in
    tests/mutants/NN/ and its labs.yaml entry. Nothing is overwritten: every file is
    written, or none."""
    course = course_of(ctx)
    written = scaffold.new_lab(course.root, number, module, title)
    for path in written:
        click.echo(f"wrote {path.relative_to(course.root)}")
    click.echo(f"next: write the task in {LabPaths(Path(), number, f'{module}.py').stub} and its reference, then "
               f"`labs grade solutions --lab {number}` (full marks) and `labs grade labs --lab {number}` (0)")


COMMANDS = [grade_all_command, nbgrader_group, gradescope_group, image, new_command, release_command, *SERVER_COMMANDS,
            *RUNNER_COMMANDS]
