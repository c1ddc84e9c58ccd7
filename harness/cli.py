"""``labs``: the command line for students and course staff.

Verb first (``labs list``, ``labs test 04``, ``labs grade PATH --lab 04``).
Data goes to stdout (or ``--json FILE``); errors are one line on stderr,
``labs: error: <what> (<where>)`` plus a hint, tracebacks only with
``--traceback``. Exit codes are ``ExitCode``.
"""
from __future__ import annotations

import enum
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import grading, manifest, progress


class ExitCode(enum.IntEnum):
    OK = 0              # the command ran (for grade: grading ran, whatever the score)
    GRADING_FAILED = 1  # grading itself could not run (graders broken, the sandbox or grader failed)
    USAGE = 2           # bad arguments: unknown lab, missing path, invalid labs.yaml


class LabsError(click.ClickException):
    """One-line error with an exit code and an optional hint."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE, hint: str = ""):
        super().__init__(message)
        self.exit_code = int(code)
        self.hint = hint

    def show(self, file=None):
        click.echo(f"labs: error: {self.message}", err=True)
        if self.hint:
            click.echo(f"  hint: {self.hint}", err=True)


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _course(ctx) -> manifest.Course:
    try:
        return manifest.load(ctx.obj.get("course"))
    except manifest.ManifestError as e:
        raise LabsError(str(e), hint=e.hint or "run inside the course repository or pass --course DIR") from None


def staff_output(course: manifest.Course, path: Path | None, default: str, option: str) -> Path:
    """Where a staff command writes (grades, autograder zips, nbgrader courses): ``path``,
    else ``<course>/.labs-staff/<default>``. Refused (a usage error naming ``option``): a
    path inside the course tree but outside ``.labs-staff/`` (a commit or a copy of the
    tree would take hidden graders or grades along), and a path whose parent folder does
    not exist (a typo is not silently created)."""
    root = course.root.resolve()
    staff = root / manifest.STAFF_DIR
    if path is None:
        staff.mkdir(mode=0o700, exist_ok=True)
        return staff / default
    out = path.resolve()
    if (out == root or root in out.parents) and not (out == staff or staff in out.parents):
        raise LabsError(f"{option} {path} is inside the course tree {root}",
                        hint=f"staff outputs go to {manifest.STAFF_DIR}/ (the default: git-ignored, never "
                             f"released) or a folder outside the course")
    if not out.parent.is_dir():
        raise LabsError(f"{option} {path}: the folder {out.parent} does not exist",
                        hint="create it first, or pass a path in an existing folder")
    return out


def _lab(course, number):
    try:
        return course.lab(number)
    except (KeyError, ValueError):
        raise LabsError(f"no lab {number!r} (labs.yaml lists {', '.join(sorted(course.labs))})",
                        hint="`labs list` shows the labs") from None


def gpu_points(course: manifest.Course, lab) -> float:
    """Points of ``lab`` (bonus parts aside) that only a GPU can earn: its grader tests
    marked ``gpu``, weighted as ``grading.score`` does. 0 without graders (a student
    checkout). One ``pytest --collect-only`` of every lab's graders, cached in
    ``.labs-staff/gpu-points.json`` by the graders' and labs.yaml's bytes."""
    import hashlib
    import tempfile
    root = course.root
    graders = sorted(p for p in (root / "graders").rglob("*.py") if "__pycache__" not in p.parts) \
        if (root / "graders").is_dir() else []
    if not (root / "graders" / lab.number).is_dir():
        return 0.0
    key = hashlib.sha256((root / manifest.MANIFEST).read_bytes())
    for p in graders:
        key.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    cache = root / manifest.STAFF_DIR / "gpu-points.json"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key.hexdigest():
            return cached["points"].get(lab.number, 0.0)
    except (OSError, ValueError, AttributeError):
        pass
    points = {}
    with tempfile.TemporaryDirectory(prefix="labs-collect-") as tmp:
        out = Path(tmp) / "collected.json"
        cmd = [sys.executable, "-m", "pytest", str(root / "graders"), "--collect-only", "-q", "--labs-results",
               str(out), "--rootdir", str(root), "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib"]
        env = {**os.environ, "LABS_COURSE": str(root), "LABS_PROGRESS": "off"}
        subprocess.run(cmd, cwd=root, env=env, capture_output=True, timeout=600)
        try:
            raw = json.loads(out.read_text())
        except (OSError, ValueError):
            return 0.0
    for num, spec in course.labs.items():
        tests = [t for t in raw["tests"] if f"/graders/{num}/" in "/" + t["nodeid"]]
        try:
            scored = grading.score({"tests": tests}, spec)
        except grading.GradingError:
            continue
        points[num] = round(sum(t.max_score for t in scored if "gpu" in t.tags and not t.bonus), 1)
    try:
        cache.parent.mkdir(mode=0o700, exist_ok=True)
        cache.write_text(json.dumps({"key": key.hexdigest(), "points": points}))
    except OSError:
        pass
    return points.get(lab.number, 0.0)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
    course = _course(ctx)
    rows = []
    for num, lab in sorted(course.labs.items()):
        gpu = gpu_points(course, lab)
        rows.append({"lab": num, "title": lab.title, "module": f"labs/{num}/{lab.filename}",
                     "parts": {k: p.points for k, p in lab.parts.items()}, "points": lab.points,
                     "gpu_points": gpu, "gpu": f"{gpu:g} pts need a GPU" if gpu else "none",
                     "stub": (course.root / "labs" / num / lab.filename).is_file()})
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
    _console().print(table)


@main.command("test", context_settings={"ignore_unknown_options": True})
@click.argument("lab")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def test(ctx, lab, pytest_args):
    """Run a lab's visible tests: the same as `pytest labs/NN [PYTEST_ARGS]`."""
    course = _course(ctx)
    lab = _lab(course, lab)
    cmd = [sys.executable, "-m", "pytest", f"labs/{lab.number}", *pytest_args]
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
    course = _course(ctx)
    lab = _lab(course, lab_number)
    if not path.is_dir():
        raise LabsError(f"submission {path} is not a directory", hint="pass a checkout or a folder holding NN/<module>.py")
    why = ""  # why the default sandbox is a local process: a note after grading (errors come first)
    if sandbox is None:
        from . import container
        sandbox, why = container.choose_sandbox(course)
    try:
        result = grading.grade(path, lab, course, seed=seed, timeout_s=timeout_s, sandbox=sandbox)
    except grading.GradingError as e:
        if ctx.obj["traceback"]:
            raise
        hint = ("not the submission's fault: fix the grading environment, then grade again"
                if isinstance(e, grading.InfraFailure) else "check graders/ and labs.yaml")
        raise LabsError(str(e), ExitCode.GRADING_FAILED, hint=hint) from None
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
        grading.write_json_atomic(json_path, result.to_gradescope())


@main.group()
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
    from . import container
    course = _course(ctx)
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
    click.echo(f"built {built.tag} on {built.base}: {built.size_bytes / 1e9:.2f} GB, {built.build_s:.0f} s")


IMPL_ERRORS = {"missing": "no module", "import": "import error", "api": "api mismatch"}


def _one_cause(result: grading.GradeResult, path: Path, lab) -> str:
    """Why no test could load the implementation, when each that ran failed the same way
    (``impl_error``): the first message, and for a missing module the near misses in the
    submission (``GQA.py``, ``gqa_solution.py``). Empty otherwise."""
    ran = [t for t in result.tests if t.outcome != "skipped"]
    kinds = {t.impl_error for t in ran}
    if not ran or len(kinds) != 1 or (kind := kinds.pop()) not in IMPL_ERRORS:
        return ""
    text = f"{IMPL_ERRORS[kind]}: {ran[0].output.splitlines()[0] if ran[0].output else kind}"
    if kind == "missing":
        import difflib
        found = sorted({p.relative_to(path).as_posix() for d in (path, path / lab.number, path / "labs" / lab.number)
                        for p in d.glob("*.py") if p.is_file()})
        near = [f for f in found if lab.module.lower() in Path(f).stem.lower()
                or difflib.get_close_matches(Path(f).name.lower(), [lab.filename], n=1, cutoff=0.6)]
        if near:
            text += f"; found {', '.join(near)}: the file must be named {lab.filename} exactly"
    return text


def _print_result(result: grading.GradeResult, lab) -> None:
    """The grade table; readable in an 80-column terminal: long test names fold (never
    cut), a parametrized test's case id goes on its own line, messages wrap."""
    table = Table(title=f"Lab {lab.number} — {lab.title}: {result.submission}")
    table.add_column("Part", no_wrap=True)
    table.add_column("Test", overflow="fold", min_width=16, ratio=3)
    table.add_column("Result", no_wrap=True)
    table.add_column("Points", justify="right", no_wrap=True)
    table.add_column("Message", overflow="fold", ratio=4)
    style = {"passed": "green", "failed": "red", "error": "red", "skipped": "yellow", "not run": "red"}
    for t in result.tests:
        msg = t.output.splitlines()[0][:110] if t.output else ""
        base, bracket, case = t.name.partition("[")
        table.add_row(t.part, escape(base + (f"\n[{case}" if bracket else "")),
                      f"[{style.get(t.outcome, '')}]{t.outcome}[/]", f"{t.score:.2f}/{t.max_score:.2f}", escape(msg))
    console = _console()
    console.print(table)
    console.print(f"score {result.score:g} / {result.max_score:g} "
                  f"(runnable here: {result.max_score_runnable:g}); seed {result.seed}; "
                  f"{result.duration_s:.1f} s")


for _command in progress.COMMANDS:  # labs progress, labs reset
    main.add_command(_command)

# the staff commands; a student release has no such modules (harness.release.STAFF_HARNESS)
for _module, _command in (("classroom", "grade_all_command"),        # labs grade-all
                          ("nbgrader_export", "nbgrader_group"),     # labs nbgrader export
                          ("gradescope", "gradescope_group"),        # labs gradescope build
                          ("release", "release_command")):           # labs release
    try:
        main.add_command(getattr(importlib.import_module(f"{__package__}.{_module}"), _command))
    except ModuleNotFoundError as _e:
        if _e.name != f"{__package__}.{_module}":
            raise
