"""Staff commands of the course server: ``labs serve``, ``labs roster import``,
``labs account add``, ``labs regrade``, ``labs grant``, ``labs leaderboard``.

Each parses its options, calls ``harness.server`` and prints what it did. The database
is ``--db URL`` (or ``LABS_DB``), by default SQLite in the course's ``.labs-staff/``.
"""
from __future__ import annotations

import csv
import os
import signal
import time
from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from .. import calibrate, files, gradebook as gradebook_api, grading
from ..errors import ExitCode, LabsError
from .common import console, course_of

DB_HELP = "database URL (default: $LABS_DB, else SQLite in the course's .labs-staff/server.db)"


def _url(course, db: str | None) -> str:
    from ..server import db as _db
    return db or os.environ.get("LABS_DB") or _db.default_url(course.root)


def _sessions(course, db):
    from ..server import db as _db
    return _db.sessions(_url(course, db), course)


def _secret(course) -> bytes:
    return grading.course_secret(course) or b"labs-no-secret"


@click.command("serve")
@click.option("--db", default=None, help=DB_HELP)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--runner", "mode", type=click.Choice(["local", "pool", "none"]), default="local", show_default=True,
              help="local: dispatchers on this machine (--gpus); pool: Celery workers on GPU hosts (--broker); "
                   "none: only the API and pages")
@click.option("--gpus", default="cpu:1", show_default=True, help="local runner slots: GPU indices (0,1) or cpu:N")
@click.option("--broker", default=None, help="pool mode: the Celery broker URL (redis://host:port/0)")
@click.option("--gpu-model", "gpu_model", default="default", show_default=True,
              help="pool mode: the queue family to publish to (labs runner --gpu-model on the hosts)")
@click.option("--lease", "lease_s", default=60.0, show_default=True, type=float,
              help="seconds a runner's lease lasts without renewal")
@click.pass_context
def serve_command(ctx, db, host, port, mode, gpus, broker, gpu_model, lease_s):
    """Run the course server: the API `labs submit` talks to, the pages, and (with
    --runner local) one grading dispatcher per GPU or CPU slot. A killed server loses
    nothing: every submission is in the database before it is queued, and a restart
    re-queues what was left."""
    import uvicorn

    from ..server import app as _app, runner as _runner
    course = course_of(ctx)
    url = _url(course, db)
    publish = None
    if mode == "pool":
        if not broker:
            raise LabsError("--runner pool needs --broker URL", hint="e.g. --broker redis://127.0.0.1:6379/0",
                            code=ExitCode.USAGE)
        from ..server import pool
        publish = pool.publisher(broker, gpu_model)
    try:
        procs = _runner.start_dispatchers(url, course.root, gpus, lease_s=lease_s) if mode == "local" else []
    except ValueError as e:
        raise LabsError(str(e), code=ExitCode.USAGE) from None
    click.echo(f"labs: serving {course.name} on http://{host}:{port} (database {url.split('://')[0]}, "
               f"runner {mode}{' ' + gpus if mode == 'local' else ''})", err=True)
    app = _app.create_app(course, url, publish=publish)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    try:
        server.run()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except Exception:  # noqa: BLE001 - a dispatcher mid-job: its lease expires, the job is re-queued
                p.kill()


@click.group("roster")
def roster_group():
    """The course roster: accounts and their tokens."""


@roster_group.command("import")
@click.argument("csv_path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--db", default=None, help=DB_HELP)
@click.option("--tokens", "tokens_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="where to write the new tokens (name,token CSV, mode 0600; default .labs-staff/tokens-<time>.csv)")
@click.pass_context
def roster_import(ctx, csv_path, db, tokens_out):
    """Import a roster CSV (columns name[,email][,role]); every new name gets a token,
    stored hashed: the tokens are written once, to --tokens, for you to send out."""
    from ..server import service
    course = course_of(ctx)
    try:
        with csv_path.open(newline="", encoding="utf-8-sig") as f:  # Excel's BOM and CRLF line ends too
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        raise LabsError(f"{csv_path}: not a UTF-8 CSV file ({e})", hint="save it as CSV UTF-8",
                        code=ExitCode.USAGE) from None
    if not rows or not ({"name", "student"} & set(rows[0])):
        raise LabsError(f"{csv_path}: needs a header row with a 'name' column", code=ExitCode.USAGE)
    out = course.staff_output(tokens_out, f"tokens-{time.strftime('%Y%m%d-%H%M%S')}.csv", "--tokens")

    def write_tokens(got):  # before the accounts are committed: no account without its token written out
        if not any(tok for _, tok in got):
            return  # nothing new: no empty tokens file
        with files.atomic_open(out, newline="") as f:
            w = csv.writer(f)
            w.writerow(["name", "token"])
            w.writerows((n, tok) for n, tok in got if tok)

    with _sessions(course, db)() as s:
        try:
            got = service.import_roster(s, rows, _secret(course), now=time.time(), before_commit=write_tokens)
        except ValueError as e:
            raise LabsError(f"{csv_path}: {e}", hint="fix that row and import again", code=ExitCode.USAGE) from None
    new = [(n, t) for n, t in got if t]
    click.echo(f"{len(new)} new account(s), {len(got) - len(new)} existed (tokens unchanged)"
               + (f"; tokens in {out}" if new else "; no tokens file written"))


@click.group("account")
def account_group():
    """Single accounts: staff members, runner hosts, the Gradescope bridge; new tokens."""


@account_group.command("add")
@click.argument("name")
@click.option("--role", type=click.Choice(["student", "staff", "runner", "bridge"]), required=True,
              help="bridge: the Gradescope autograder's course-level token (labs gradescope build --server-token)")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def account_add(ctx, name, role, db):
    """Add one account and print its token (shown once)."""
    from ..server import service
    course = course_of(ctx)
    with _sessions(course, db)() as s:
        try:
            token = service.add_account(s, name, role, _secret(course), now=time.time())
        except (ValueError, service.Rejected) as e:
            raise LabsError(str(e), code=ExitCode.USAGE) from None
    click.echo(token)


@account_group.command("token")
@click.argument("name")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def account_token(ctx, name, db):
    """Issue NAME a new token and print it (shown once): the old token stops working."""
    from ..server import service
    course = course_of(ctx)
    with _sessions(course, db)() as s:
        try:
            token = service.reissue_token(s, name)
        except service.Rejected as e:
            raise LabsError(str(e), hint="`labs account add NAME --role ...` makes one", code=ExitCode.USAGE) from None
    click.echo(token)


@click.command("regrade")
@click.option("--lab", "lab_number", required=True)
@click.option("--student", default=None, help="only this student's newest submission")
@click.option("--reason", default="regrade after a grader change", show_default=True,
              help="why: kept with each new run and shown to staff and students beside the old result")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def regrade_command(ctx, lab_number, student, reason, db):
    """Queue a regrade of each student's newest submission (after a grader change), on
    the regrade queue: interactive submissions go first. The server publishes them on
    its next start (pool mode) or its dispatchers pick them up (local)."""
    from ..server import service
    course = course_of(ctx)
    lab = course.lab(lab_number)
    with _sessions(course, db)() as s:
        ids = service.regrade(s, lab.number, time.time(), student=student, reason=reason)
    click.echo(f"{len(ids)} regrade job(s) queued for lab {lab.number}")


@click.command("grant")
@click.argument("student")
@click.option("--lab", "lab_number", required=True)
@click.option("--submissions", "n", default=1, show_default=True, type=float)
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def grant_command(ctx, student, lab_number, n, db):
    """Staff override of the rate limit: give STUDENT extra submissions of a lab now."""
    from sqlalchemy import select

    from ..server import db as _db, service
    course = course_of(ctx)
    lab = course.lab(lab_number)
    with _sessions(course, db)() as s:
        acc = s.scalar(select(_db.Account).where(_db.Account.name == student))
        if acc is None:
            raise LabsError(f"no account {student!r}", code=ExitCode.USAGE)
        level = service.grant(s, acc, lab.number, n, time.time())
    click.echo(f"{student}: {level:g} submission(s) of lab {lab.number} available now")


@click.group("leaderboard")
def leaderboard_group():
    """The per-lab performance leaderboard."""


@leaderboard_group.command("show")
@click.option("--lab", "lab_number", required=True)
@click.option("--gpu-model", default=None)
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def leaderboard_show(ctx, lab_number, gpu_model, db):
    """Print the leaderboard as staff see it (names, invalid runs with their reasons)."""
    from ..server import service
    course = course_of(ctx)
    lab = course.lab(lab_number)
    if not lab.perf:
        click.echo(f"lab {lab.number} has no timed test: it has no leaderboard")
        return
    with _sessions(course, db)() as s:
        rows = service.leaderboard(s, lab.number, gpu_model, staff=True)
    t = Table(title=f"Lab {lab.number} leaderboard")
    for col in ("rank", "student", "pseudonym", "GPU", "perf ratio", "score", "result", "invalid"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["rank"] or "-"), escape(r["student"] or ""), r["name"], escape(r["gpu_model"]),
                  f"{r['perf_ratio']:.4g}", f"{r['score']:.4g}", str(r["result_id"]), escape(r["invalid"] or ""))
    console().print(t)


@leaderboard_group.command("invalid")
@click.argument("result_id", type=int)
@click.option("--reason", required=True)
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def leaderboard_invalid(ctx, result_id, reason, db):
    """Hide one run from the leaderboard, with a reason (kept, shown to staff)."""
    from ..server import service
    course = course_of(ctx)
    with _sessions(course, db)() as s:
        try:
            service.mark_invalid(s, result_id, reason)
        except (ValueError, service.Rejected) as e:
            raise LabsError(str(e), code=ExitCode.USAGE) from None
    click.echo(f"result {result_id} marked invalid: {reason}")


@leaderboard_group.command("verify")
@click.option("--lab", "lab_number", required=True)
@click.option("--top", default=10, show_default=True, type=int)
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def leaderboard_verify(ctx, lab_number, top, db):
    """Before a deadline closes: queue a re-run (regrade queue) of the top N runs, so
    the ranking rests on a second measurement."""
    from ..server import db as _db, service
    course = course_of(ctx)
    lab = course.lab(lab_number)
    now = time.time()
    with _sessions(course, db)() as s:
        rows = [r for r in service.leaderboard(s, lab.number, None, staff=True) if r["rank"]][:top]
        for r in rows:
            sub = s.get(_db.Submission, r["submission"])
            s.add(_db.Job(submission=sub, queue="regrade", state="queued", created_at=now))
        s.commit()
    click.echo(f"{len(rows)} top run(s) of lab {lab.number} queued for verification")



@click.command("calibrate")
@click.option("--lab", "lab_numbers", multiple=True, required=True, help="lab number (repeatable)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also write the figures as JSON")
@click.pass_context
def calibrate_command(ctx, lab_numbers, json_path):
    """Run the reference's perf tests on this machine (against the same baselines the
    graders use) and print each perf ratio with the thresholds it suggests for this GPU
    model. On a host without a GPU only the CPU perf tests run: it says so."""
    from ..server import runner as _runner
    course = course_of(ctx)
    info = _runner.doctor(course)
    model = info["gpu_model"]
    if model == "cpu":
        click.echo(f"labs: {info['gpu']}: only the CPU perf tests run here; GPU thresholds need a GPU host",
                   err=True)
    out = []
    c = console()
    for number in lab_numbers:
        lab = course.lab(number)
        got = calibrate.calibrate(course, lab, model)
        out.append(got)
        t = Table(title=f"Lab {lab.number} on {model} ({got['duration_s']} s)")
        for col in ("perf key", "baseline", "reference ratio", "labs.yaml full/zero", "credit", "suggested full/zero"):
            t.add_column(col)
        for key, row in got["perf"].items():
            ran = row["ratio"] is not None
            t.add_row(key, escape(row["baseline"]), f"{row['ratio']:.3f}" if ran else "not run here",
                      f"{row['full_credit']:g} / {row['zero_credit']:g}", f"{row['credit']:.2f}" if ran else "",
                      f"{row['suggested_full_credit']:g} / {row['suggested_zero_credit']:g}"
                      if ran and "problem" not in row else "")
        for key, row in got["perf"].items():
            if "problem" in row:
                c.print(escape(f"  {key}: {row['problem']}"))
        c.print(t)
        for line in got["not_run"]:
            c.print(escape(f"  not run: {line}"))
    if json_path:
        files.write_json(json_path, {"host": info, "labs": out})
        click.echo(f"figures in {json_path}")



@click.command("gradebook-push")
@click.option("--lab", "lab_number", required=True)
@click.option("--gradebook", required=True, help="the nbgrader gradebook URL (sqlite:///gradebook.db)")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def gradebook_push(ctx, lab_number, gradebook, db):
    """Record each student's newest server grade of a lab in an nbgrader gradebook (the
    same cells as `labs grade-all --gradebook`)."""
    from ..server import service
    course = course_of(ctx)
    lab = course.lab(lab_number)
    with _sessions(course, db)() as s:
        rows = [(name, service.results_json(course, res)) for name, res, _sub in service.newest_results(s, lab.number)]
    try:
        book = gradebook_api.GradebookWriter(gradebook, lab)
        try:
            for student, results in rows:
                book.record(student, results)
        finally:
            book.close()
    except Exception as e:  # noqa: BLE001 - nbgrader's errors: one line, with the gradebook named
        raise LabsError(f"gradebook {gradebook}: {type(e).__name__}: {e}", code=ExitCode.GRADING_FAILED) from None
    click.echo(f"{len(rows)} grade(s) of lab {lab.number} recorded in {gradebook}")



@click.command("similarity")
@click.argument("submissions", type=click.Path(path_type=Path))
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="where the report goes: OUT/similarity.html and OUT/similarity.csv "
                   "(default: .labs-staff/similarity-labNN)")
@click.option("--threshold", type=float, default=None,
              help="flag pairs whose score (the larger share of matched code) is at least this (default 0.5)")
@click.pass_context
def similarity_command(ctx, submissions, lab_number, out_dir, threshold):
    """Compare every pair of the lab's modules in SUBMISSIONS/ (grade-all's layout: one
    folder or archive per student) with copydetect's winnowing fingerprints, the stub
    and the handout's code snippets as boilerplate; write the ranked pairs with their
    matched regions side by side (HTML) and a CSV. Staff only."""
    from ..server import pages, similarity
    course = course_of(ctx)
    lab = course.lab(lab_number)
    threshold = similarity.check_threshold(similarity.THRESHOLD if threshold is None else threshold)
    sources, skipped = similarity.modules_in(submissions, lab)
    report = similarity.compare(sources, similarity.boilerplate(course, lab), lab, threshold=threshold,
                                skipped=skipped)
    out = course.staff_output(out_dir, f"similarity-lab{lab.number}", "--out")
    html, table = similarity.write(report, pages.similarity(course, report, standalone=True), out)
    for who, why in sorted(skipped.items()):
        click.echo(f"labs: note: {who} not compared: {why}", err=True)
    click.echo(f"{len(sources)} module(s) of lab {lab.number}, {len(report.pairs)} pair(s), "
               f"{len(report.flagged)} at or over {threshold:g}")
    for p in report.pairs[:5]:
        click.echo(f"  {p.score:.2f}  {p.a} / {p.b}" + ("  flagged" if p.score >= threshold else ""))
    click.echo(f"report: {html}\ncsv: {table}")


@click.command("extend")
@click.argument("student")
@click.argument("lab_number", metavar="NN")
@click.option("--days", required=True, type=float, help="days the student's deadline of lab NN moves (0 removes it)")
@click.option("--reason", default="", help="kept with the extension")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def extend_command(ctx, student, lab_number, days, reason, db):
    """Move STUDENT's deadline of lab NN by --days: their submissions of it are that much
    less late (fewer late days spent, less penalty), and it closes that much later."""
    from sqlalchemy import select

    from ..server import db as _db, latedays
    course = course_of(ctx)
    lab = course.lab(lab_number)
    with _sessions(course, db)() as s:
        acc = s.scalar(select(_db.Account).where(_db.Account.name == student, _db.Account.role == "student"))
        if acc is None:
            raise LabsError(f"no student account {student!r}", code=ExitCode.USAGE)
        try:
            latedays.extend(s, course, acc, lab, days, reason=reason, by=os.environ.get("USER", ""), now=time.time())
        except ValueError as e:
            raise LabsError(str(e), code=ExitCode.USAGE) from None
        left = latedays.standing(s, course, acc)
    click.echo(f"{student}: lab {lab.number} deadline extended by {days:g} day(s); "
               f"late days left: {left.left} of {left.budget}")


@click.command("regrade-requests")
@click.option("--all", "everything", is_flag=True, help="answered requests too")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def regrade_requests_command(ctx, everything, db):
    """The students' regrade requests, oldest first (open ones only without --all)."""
    from ..server import regrades
    course = course_of(ctx)
    with _sessions(course, db)() as s:
        rows = regrades.queue(s, everything=everything)
    t = Table(title=f"{len(rows)} regrade request(s)")
    for col in ("id", "student", "lab", "submission", "reason", "state", "answer"):
        t.add_column(col)
    for q in rows:
        t.add_row(str(q["id"]), escape(q["student"]), q["lab"], q["submission"], escape(q["reason"]), q["state"],
                  escape(q["answer"]))
    console().print(t)


@click.command("regrade-answer")
@click.argument("req_id", metavar="ID", type=int)
@click.option("--answer", required=True, help="the answer the student reads")
@click.option("--regrade", is_flag=True, help="also queue the submission again (a new run; the old result stays)")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def regrade_answer_command(ctx, req_id, answer, regrade, db):
    """Answer regrade request ID (and with --regrade queue the submission again)."""
    from ..server import regrades, service
    course = course_of(ctx)
    with _sessions(course, db)() as s:
        try:
            req = regrades.answer(s, req_id, os.environ.get("USER") or "staff", answer, regrade, time.time())
        except service.Rejected as e:
            raise LabsError(str(e), code=ExitCode.USAGE) from None
    click.echo(f"regrade request {req_id} {req.state}" + (f": job {req.job_id} queued" if req.job_id else ""))


@click.group("grades")
def grades_group():
    """Grades for the course's learning management system."""


@grades_group.command("export")
@click.option("--lab", "lab_number", required=True, help="Lab number, e.g. 04.")
@click.option("--format", "fmt", required=True, help="canvas (Gradebook import CSV), moodle (grade import CSV) or csv")
@click.option("--from", "from_dir", type=click.Path(path_type=Path), default=None,
              help="a `labs grade-all` output folder (default: the course server's newest grades)")
@click.option("--out", "out_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the file to write (default: .labs-staff/grades-labNN-FORMAT.csv)")
@click.option("--assignment", default=None,
              help="the LMS column or grade item (default: 'Lab NN: title'; Canvas: 'Name (id)' names an existing one)")
@click.option("--db", default=None, help=DB_HELP)
@click.pass_context
def grades_export(ctx, lab_number, fmt, from_dir, out_path, assignment, db):
    """Write one lab's grades as the file Canvas or Moodle imports (or a plain CSV),
    from the server's newest grades (late penalty applied) or a grade-all folder."""
    from ..server import lms
    course = course_of(ctx)
    lab = course.lab(lab_number)
    lms.check_format(fmt)
    if from_dir is not None:
        rows = lms.from_folder(from_dir, lab)
    else:
        with _sessions(course, db)() as s:
            rows = lms.from_server(s, course, lab)
    out = course.staff_output(out_path, f"grades-lab{lab.number}-{fmt}.csv", "--out")
    files.write_atomic(out, lms.render(rows, fmt, lab, assignment))
    click.echo(f"{len(rows)} grade(s) of lab {lab.number} written for {fmt}: {out}")


@click.group("lti")
def lti_group():
    """The course server as an LTI 1.3 tool: its platforms and the grades it posts back."""


@lti_group.command("platform")
@click.option("--issuer", required=True, help="the platform's issuer (Canvas: https://canvas.instructure.com)")
@click.option("--client-id", required=True, help="the client id the platform gave the tool (Canvas: its developer key)")
@click.option("--deployment-id", "deployment_ids", multiple=True, required=True, help="a deployment id (repeatable)")
@click.option("--auth-login-url", required=True, help="the platform's OIDC authorization endpoint")
@click.option("--auth-token-url", required=True, help="the platform's OAuth2 token endpoint (AGS access tokens)")
@click.option("--key-set-url", required=True, help="the platform's public key set (JWKS) URL")
@click.option("--auth-audience", default=None, help="the token endpoint's audience, when not its URL")
@click.option("--url", "base_url", default="https://labs.example.edu", show_default=True,
              help="this server's public URL, for the URLs printed")
@click.pass_context
def lti_platform(ctx, issuer, client_id, deployment_ids, auth_login_url, auth_token_url, key_set_url, auth_audience,
                 base_url):
    """Register an LTI 1.3 platform (.labs-staff/lti.json) and print the tool's URLs to enter there."""
    from ..server import lti
    course = course_of(ctx)
    lti.add_platform(course, {"issuer": issuer, "client_id": client_id, "deployment_ids": list(deployment_ids),
                              "auth_login_url": auth_login_url, "auth_token_url": auth_token_url,
                              "key_set_url": key_set_url, "auth_audience": auth_audience})
    lti.private_key(course)  # made now, so the JWKS is there before the platform asks
    base = base_url.rstrip("/")
    click.echo(f"platform {issuer} (client {client_id}) registered in {lti.CONFIG_FILE}")
    click.echo(f"  OIDC login URL:          {base}{lti.LOGIN_PATH}")
    click.echo(f"  target link / redirect:  {base}{lti.LAUNCH_PATH}")
    click.echo(f"  public JWKS URL:         {base}{lti.JWKS_PATH}")


@lti_group.command("status")
@click.option("--db", default=None, help=DB_HELP)
@click.option("--all", "everything", is_flag=True, help="the grades already posted too")
@click.pass_context
def lti_status(ctx, db, everything):
    """The registered platforms and the grades waiting to reach them (with why the last try failed)."""
    from ..server import lti
    course = course_of(ctx)
    for p in lti.platforms(course):
        click.echo(f"platform {p['issuer']} client {p['client_id']} deployments {', '.join(p['deployment_ids'])}")
    with _sessions(course, db)() as s:
        posts = lti.status(s)
    pending = [p for p in posts if p["state"] == "pending"]
    click.echo(f"{len(pending)} grade post(s) pending, {len(posts) - len(pending)} sent")
    table = Table("post", "student", "lab", "state", "score", "attempts", "last error")
    for p in posts if everything else pending:
        score = "" if p["score"] is None else f"{p['score']:g}/{p['max_score']:g}"
        table.add_row(str(p["id"]), escape(p["student"]), p["lab"], p["state"], score, str(p["attempts"]),
                      escape(p["error"][:200]))
    if everything or pending:
        console().print(table)


COMMANDS = [serve_command, roster_group, account_group, regrade_command, grant_command, leaderboard_group,
            calibrate_command, gradebook_push, similarity_command,
            grades_group, extend_command, regrade_requests_command, regrade_answer_command, lti_group]
