"""``labs runner``: a GPU host's side of the runner pool (``harness.server.pool``).

``labs runner --broker URL --server URL --token-file F --gpus 0,1`` starts one Celery worker
per GPU (or ``cpu:N`` slots) and keeps them running in the foreground: a worker that
dies is started again; Ctrl-C or SIGTERM stops them (the first lets each finish the
job it grades, a second stops them at once: their jobs go back to the queue when their
leases expire). ``labs runner doctor`` prints what this host grades on.

The runner token never goes on a command line (``/proc/PID/cmdline`` is readable by every
process of the host, a submission's included): it comes from ``$LABS_RUNNER_TOKEN`` or a
file only its owner can read (``--token-file``, mode 0600).
"""
from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from .. import grading
from ..errors import ExitCode, LabsError
from .common import console, course_of

RESTART_DELAY_S = 2.0    # a dead worker is started again after this, doubling while it keeps dying
STEADY_S = 60.0          # a worker that ran this long is healthy again (its delay resets)


def read_token_file(path: Path) -> str:
    """The token in ``path``, a file only its owner may read (mode 0600 or 0400: a token
    another user can read is a leaked token). Raises LabsError naming the file otherwise."""
    try:
        mode = path.stat().st_mode
        token = path.read_text().strip()
    except OSError as e:
        raise LabsError(f"--token-file {path}: {e.strerror}", hint="write the runner token into it, mode 0600") from None
    if mode & 0o077:
        raise LabsError(f"--token-file {path}: mode {stat.S_IMODE(mode):04o} lets other users read the token",
                        hint=f"chmod 600 {path}")
    if not token:
        raise LabsError(f"--token-file {path} is empty", hint="write the runner token into it, mode 0600")
    return token


def _course_or_none(ctx):
    try:
        return course_of(ctx)
    except LabsError:
        return None


def _default_gpus() -> str:
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ",".join(str(i) for i in range(n)) if n else "cpu:1"


@click.group("runner", invoke_without_command=True)
@click.option("--broker", envvar="LABS_BROKER", default=None, help="the Celery broker, redis://HOST:PORT/0 "
              "(default: $LABS_BROKER)")
@click.option("--server", envvar="LABS_SERVER", default=None, help="the course server's URL (default: $LABS_SERVER)")
@click.option("--token-file", "token_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="a file (mode 0600) holding this host's runner token (default: $LABS_RUNNER_TOKEN; "
                   "staff: labs account add HOST --role runner)")
@click.option("--gpus", default=None, help="worker slots: GPU indices (0,1), one worker each, or cpu:N "
              "(default: every visible GPU, else cpu:1)")
@click.option("--gpu-model", "gpu_model", default="default", show_default=True,
              help="the queue family to consume (the same name as `labs serve --gpu-model`)")
@click.option("--lease", "lease_s", default=60.0, show_default=True, type=float,
              help="seconds a job's lease lasts without renewal (renewed every quarter of it)")
@click.option("--sandbox", type=click.Choice(grading.SANDBOXES), default=None,
              help="where the graders run (default: docker when the course's image is here, else process)")
@click.pass_context
def runner_group(ctx, broker, server, token_file, gpus, gpu_model, lease_s, sandbox):
    """Grade the course server's jobs on this host: one Celery worker per GPU (or CPU
    slot), consuming the interactive queue of --gpu-model first, then its regrades."""
    if ctx.invoked_subcommand is not None:
        return
    from ..server import pool, runner as _runner
    course = course_of(ctx)
    token = read_token_file(token_file) if token_file else os.environ.get("LABS_RUNNER_TOKEN", "").strip()
    missing = [n for n, v in (("--broker", broker), ("--server", server), ("--token-file", token)) if not v]
    if missing:
        raise LabsError(f"labs runner needs {', '.join(missing)}",
                        hint="e.g. labs runner --broker redis://HOST:6379/0 --server http://HOST:8000 "
                             "--token-file ~/.labs-runner-token --gpus 0,1 (or LABS_BROKER, LABS_SERVER, "
                             "LABS_RUNNER_TOKEN)")
    if not gpu_model or any(c.isspace() for c in gpu_model):
        raise LabsError(f"--gpu-model {gpu_model!r}: give a name without spaces (it names the queues)",
                        hint="e.g. --gpu-model h100, the same as the server's")
    if lease_s <= 0 or lease_s > 3600:
        raise LabsError(f"--lease {lease_s:g}: give 0 < seconds <= 3600", hint="the default is 60")
    gpus = gpus or _default_gpus()
    try:
        slots = _runner.check_gpus(gpus)
    except ValueError as e:
        raise LabsError(str(e), code=ExitCode.USAGE) from None
    pool.check_server(server, token)
    pool.publisher(broker, gpu_model)  # the broker answers, and both queues exist before any worker
    info = _runner.doctor(course)
    click.echo(f"labs runner: {len(slots)} worker(s) ({gpus}) on {info['host']}, grading on {info['gpu_model']}; "
               f"queues {', '.join(pool.queue_names(gpu_model))}; server {server}", err=True)

    stopping = {"n": 0}

    def on_signal(signum, _frame):
        stopping["n"] += 1
        if stopping["n"] == 1:
            click.echo("labs runner: stopping: each worker finishes the job it grades (again: stop now)", err=True)
            for p in procs.values():
                _signal(p, signal.SIGTERM)
        else:
            for p in procs.values():
                _signal(p, signal.SIGKILL)

    def start(slot):
        return pool.start_worker(broker, server, token, slot, gpu_model, course.root, lease_s=lease_s,
                                 sandbox=sandbox)

    procs = {slot[0]: start(slot) for slot in slots}
    started = {name: time.monotonic() for name in procs}
    delay = {name: RESTART_DELAY_S for name in procs}
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            if stopping["n"] and all(p.poll() is not None for p in procs.values()):
                break
            for slot in slots:
                name = slot[0]
                p = procs[name]
                if stopping["n"] or p.poll() is None:
                    continue
                ran = time.monotonic() - started[name]
                if ran >= STEADY_S:
                    delay[name] = RESTART_DELAY_S
                click.echo(f"labs runner: worker {name} (pid {p.pid}) exited with {p.returncode} after {ran:.0f} s; "
                           f"starting it again in {delay[name]:.0f} s", err=True)
                time.sleep(delay[name])
                delay[name] = min(delay[name] * 2, 60.0)
                if not stopping["n"]:
                    procs[name], started[name] = start(slot), time.monotonic()
            time.sleep(0.5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                _signal(p, signal.SIGKILL)
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)
    click.echo("labs runner: stopped", err=True)


def _signal(p, signum) -> None:
    """Signal a worker's whole process group (the worker, its pool child)."""
    try:
        os.killpg(p.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@runner_group.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="print the host's info as JSON")
@click.pass_context
def doctor_command(ctx, as_json):
    """What this host grades on (recorded into every result it grades): GPU model,
    driver, CUDA, clocks, persistence and compute mode, MIG, the grading image."""
    from ..server import runner as _runner
    info = _runner.doctor(_course_or_none(ctx))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    c = console()
    if info["gpu_model"] == "cpu":
        c.print(escape(f"no GPU on {info['host']}: {info.get('gpu', '')}; results graded here are recorded as "
                       "gpu_model cpu and GPU tests are skipped (labs runner --gpus cpu:N)"))
    t = Table(title=f"labs runner doctor: {info['host']}")
    t.add_column("what")
    t.add_column("value")
    for k, v in info.items():
        t.add_row(escape(k), escape(str(v)))
    c.print(t)
    if info["gpu_model"] != "cpu" and info.get("clocks_locked") is False:
        c.print("note: the SM clock is not locked: perf ratios vary more (nvidia-smi -lgc)")


COMMANDS = [runner_group]
