"""Student commands of the course server: ``labs login``, ``labs submit NN``,
``labs status [ID]``.

The server and token come from ``--server``/``--token``, else ``LABS_SERVER``/
``LABS_TOKEN``, else what ``labs login`` saved (the user's config folder, mode 0600).
``labs submit`` packs only the lab's module (``labs/NN/<module>.py``): nothing else of
the checkout leaves the machine.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click
import httpx
import platformdirs
from rich.markup import escape
from rich.table import Table

from .. import files, grading, impl as _impl
from ..errors import ExitCode, LabsError
from .common import console, course_of

CONFIG = Path(platformdirs.user_config_dir("ai-infra-labs")) / "server.json"
TIMEOUT_S = 60.0


class ServerError(LabsError):
    """The course server refused a request or could not be reached."""


def _config(server: str | None, token: str | None) -> tuple[str, str]:
    saved = json.loads(CONFIG.read_text()) if CONFIG.is_file() else {}
    server = server or os.environ.get("LABS_SERVER") or saved.get("server")
    token = token or os.environ.get("LABS_TOKEN") or saved.get("token")
    if not server or not token:
        raise ServerError("no course server or token", hint="run `labs login --server URL --token TOKEN` "
                                                            "(the token came with your course's roster e-mail)")
    return server.rstrip("/"), token


def _request(method: str, server: str, token: str, path: str, **kw) -> httpx.Response:
    try:
        r = httpx.request(method, f"{server}{path}", headers={"Authorization": f"Bearer {token}"},
                          timeout=TIMEOUT_S, **kw)
    except httpx.HTTPError as e:
        raise ServerError(f"cannot reach the course server {server}: {type(e).__name__}: {e}",
                          code=ExitCode.GRADING_FAILED) from None
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail", r.text)
        except ValueError:
            detail = r.text[:300]
        wait = r.headers.get("retry-after")
        raise ServerError(f"the server said {r.status_code}: {detail}",
                          hint=f"try again in {wait} s" if wait else "",
                          code=ExitCode.GRADING_FAILED if r.status_code >= 500 else ExitCode.USAGE)
    return r


@click.command("login")
@click.option("--server", required=True, help="the course server's URL")
@click.option("--token", required=True, help="your token")
def login_command(server, token):
    """Save the course server and your token for `labs submit` and `labs status`."""
    server, token = server.strip().rstrip("/"), token.strip()  # a pasted token often carries a newline
    if not token or any(c.isspace() for c in token):
        raise ServerError("--token: a token is one word without spaces", hint="paste the token from your roster e-mail")
    _request("GET", server, token, "/api/submissions")  # a wrong token fails here, not later
    files.write_json(CONFIG, {"server": server, "token": token})
    click.echo(f"signed in to {server}; saved to {CONFIG}")


@click.command("submit")
@click.argument("lab_number")
@click.option("--server", default=None, help="course server URL (default: LABS_SERVER or `labs login`)")
@click.option("--token", default=None, help="your token (default: LABS_TOKEN or `labs login`)")
@click.option("--trial", is_flag=True, help="a trial run: the visible and perf tests on the grading hardware, not "
                                            "graded and not a submission (a quota per lab, run after submissions)")
@click.option("--wait", is_flag=True, help="with --trial: wait for it and print the timings beside the thresholds")
@click.pass_context
def submit_command(ctx, lab_number, server, token, trial, wait):
    """Upload lab LAB_NUMBER's module (labs/NN/<module>.py) for grading on the course's
    GPU runners; prints the submission id (`labs status ID` follows it). With --trial,
    only the visible and performance tests run, on the grading hardware: nothing counts."""
    course = course_of(ctx)
    lab = course.lab(lab_number)
    server, token = _config(server, token)
    try:
        path = _impl.locate(course.paths(lab).folder.parent, lab)
    except _impl.ImplError as e:
        raise LabsError(str(e)) from None
    blob = grading.pack_module(path, lab)
    if trial:
        return _trial(server, token, lab, blob, wait)
    r = _request("POST", server, token, "/api/submissions", data={"lab": lab.number},
                 files={"file": (f"{lab.number}.tar.gz", blob, "application/gzip")})
    sub = r.json()
    note = " (the same module as an earlier submission: not queued again)" if sub.get("duplicate") else ""
    click.echo(f"submitted lab {lab.number}: {sub['id']}{note}")
    click.echo(f"  state {sub['state']}" + (f", position {sub['position']}" if sub.get("position") else "")
               + (f", about {sub['eta_s'] / 60:.1f} min" if sub.get("eta_s") is not None else ""))
    click.echo(f"  `labs status {sub['id']}` shows it")


def _trial(server: str, token: str, lab, blob: bytes, wait: bool) -> None:
    got = _request("POST", server, token, "/api/trials", data={"lab": lab.number},
                   files={"file": (f"{lab.number}.tar.gz", blob, "application/gzip")}).json()
    click.echo(f"trial run of lab {lab.number}: {got['id']} ({got['state']}; not graded, not a submission; "
               f"{got['quota_left']} trial(s) of lab {lab.number} left)")
    while wait and got["state"] in ("queued", "running"):
        time.sleep(2.0)
        got = _request("GET", server, token, f"/api/trials/{got['id']}").json()
    if wait:
        print_trial(got)


def print_trial(got: dict) -> None:
    """A finished trial: each visible test, then each perf figure beside its thresholds."""
    c = console()
    if got["state"] == "failed":
        c.print(escape(f"the trial could not run: {got['error']} (it does not count against your quota)"))
        return
    res = got.get("result")
    if not res:
        c.print(escape(f"trial {got['id']}: {got['state']}"))
        return
    t = Table(title=f"Trial {got['id'][:12]} of lab {got['lab']}: visible tests on {res['gpu_model']}")
    for col in ("test", "outcome", "message"):
        t.add_column(col)
    for x in res["visible"]:
        t.add_row(escape(x["name"]), x["outcome"], escape(x["message"].splitlines()[0] if x["message"] else ""))
    c.print(t)
    p = Table(title="Performance (ratio: your time / baseline; lower is faster)")
    for col in ("perf key", "ratio", "full credit at", "none at", "credit", "baseline"):
        p.add_column(col)
    for x in res["perf"]:
        ran = x["ratio"] is not None
        p.add_row(escape(x["key"]), f"{x['ratio']:.3f}" if ran else escape(f"{x['outcome']}: {x['message']}"),
                  "" if x["full_credit"] is None else f"<= {x['full_credit']:g}",
                  "" if x["zero_credit"] is None else f">= {x['zero_credit']:g}",
                  "" if x["credit"] is None else f"{x['credit']:.2f}", escape(x["baseline"]))
    c.print(p)


@click.command("status")
@click.argument("sub_id", required=False)
@click.option("--lab", "lab_number", default=None, help="only this lab's submissions")
@click.option("--wait", is_flag=True, help="wait until the submission is graded")
@click.option("--server", default=None, help="course server URL (default: LABS_SERVER or `labs login`)")
@click.option("--token", default=None, help="your token (default: LABS_TOKEN or `labs login`)")
@click.option("--json", "as_json", is_flag=True, help="print the server's JSON")
def status_command(sub_id, lab_number, wait, server, token, as_json):
    """Your submissions (or one, by ID): queue position, state and ETA, then the graded
    table (each hidden test as the course's policy shows it)."""
    server, token = _config(server, token)
    if not sub_id:
        subs = _request("GET", server, token, "/api/submissions", params={"lab": lab_number} if lab_number else {})
        subs = subs.json()
        if as_json:
            click.echo(json.dumps(subs, indent=2))
            return
        t = Table(title="Your submissions")
        t.add_column("id", no_wrap=True, overflow="ignore", min_width=32)  # whole: `labs status ID` takes it
        for col in ("lab", "state", "score", "status"):
            t.add_column(col)
        for s in subs:
            res = s.get("result") or {}
            t.add_row(s["id"], s["lab"], s["state"] + (f" ({s['position']})" if s.get("position") else ""),
                      f"{res['score']:.4g} / {res['max_score']:.4g}" if res else "", escape(res.get("status", s["error"])))
        console().print(t)
        return
    while True:
        sub = _request("GET", server, token, f"/api/submissions/{sub_id}").json()
        if not wait or sub["state"] in ("done", "failed", "cancelled"):
            break
        time.sleep(2.0)
    if as_json:
        click.echo(json.dumps(sub, indent=2))
        return
    _print(sub)


def _print(sub: dict) -> None:
    c = console()
    line = f"lab {sub['lab']} submission {sub['id']}: {sub['state']}"
    if sub.get("position"):
        line += f", position {sub['position']} in the queue"
    if sub.get("eta_s") is not None:
        line += f", about {sub['eta_s'] / 60:.1f} min"
    if sub.get("late_days"):
        line += f", {sub['late_days']} day(s) late"
    c.print(escape(line))
    if sub.get("late_budget"):
        b = sub["late_budget"]
        c.print(escape(f"late days: {b['left']} of {b['budget']} left ({b['spent']} spent)"))
    if sub.get("error"):
        c.print(escape(f"not graded: {sub['error']} (an infrastructure failure: it costs you nothing)"))
    res = sub.get("result")
    if not res:
        return
    c.print(escape(f"score {res['score']:.4g} / {res['max_score']:.4g} ({res['max_score_runnable']:.4g} runnable "
                   f"on {res['gpu_model']}); {res['status']}"))
    if res.get("not_run_points"):
        c.print(escape(f"GPU tests not run yet: {res['not_run_points']:.4g} points, not verified here (no GPU, or "
                       "perf on a model the thresholds were not calibrated on): not a 0, they count once a "
                       "calibrated GPU runner grades them"))
    parts = Table(title="Parts")
    parts.add_column("part")
    parts.add_column("points")
    for p, v in sorted(res.get("parts", {}).items()):
        parts.add_row(escape(p), f"{v:.4g}")
    c.print(parts)
    if "tests" in res:
        t = Table(title="Tests")
        for col in ("test", "score", "message"):
            t.add_column(col)
        for x in res["tests"]:
            if x.get("status") == "not_run":  # this hardware could not run it: neither passed nor failed
                t.add_row(escape(x["name"]), f"not_run ({x.get('not_run_points', 0):.4g} points)",
                          escape(f"not verified here: {x.get('not_run_reason', '')}"[:300]))
                continue
            t.add_row(escape(x["name"]), f"{x['score']:.4g} / {x['max_score']:.4g}", escape((x.get("output") or "")[:300]))
        c.print(t)
    else:
        c.print(escape(sub.get("policy") or "each hidden test's result is shown per the course's policy"))
    if len(sub.get("runs") or []) > 1:
        t = Table(title="Every run (a regrade adds one; none is overwritten)")
        for col in ("run", "graded", "score", "status", "why"):
            t.add_column(col)
        for i, x in enumerate(sub["runs"], 1):
            t.add_row(str(i), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(x["graded_at"])),
                      f"{x['score']:.4g} / {x['max_score']:.4g}", escape(x["status"]), escape(x["reason"]))
        c.print(t)
    for q in sub.get("regrade_requests") or []:
        c.print(escape(f"regrade request {q['id']} ({q['state']}): {q['reason']}"
                       + (f"; answer: {q['answer']}" if q["answer"] else "")))


@click.command("regrade-request")
@click.argument("sub_id", metavar="ID")
@click.option("--reason", required=True, help="what should be looked at again, and why")
@click.option("--server", default=None, help="course server URL (default: $LABS_SERVER or `labs login`)")
@click.option("--token", default=None, help="your token (default: $LABS_TOKEN or `labs login`)")
def regrade_request_command(sub_id, reason, server, token):
    """Ask staff to regrade your graded submission ID, saying why. Staff answer on the
    server; a regrade adds a run beside the old one (`labs status ID` shows both)."""
    server, token = _config(server, token)
    got = _request("POST", server, token, f"/api/submissions/{sub_id}/regrade-requests", json={"reason": reason})
    q = got.json()
    click.echo(f"regrade request {q['id']} for submission {q['submission']} is {q['state']}: staff will answer it")


COMMANDS = [login_command, submit_command, status_command, regrade_request_command]
