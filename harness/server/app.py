"""The course server's HTTP side (FastAPI): the JSON API under ``/api`` and the
server-rendered pages (no external assets, no static files: nothing on disk is served,
so no route can hand out graders or solutions).

Every request names its account by token: ``Authorization: Bearer <token>`` for the
API, the ``labs_token`` cookie (set by the login form) for pages. A student reads and
submits only as themselves; staff read everything; runner hosts use their own tokens
for the ``/api/runner`` routes. The server never runs student code: it stores uploads,
queues job ids and stores the results runners send back.
"""
from __future__ import annotations

import base64
import csv
import io
import math
import threading
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .. import grading
from ..manifest import Course
from . import db, pages, service
from .db import Account, Job, Submission
from .service import Rejected

COOKIE = "labs_token"
Publish = Callable[[int, str], None]  # (job id, queue): hand a job id to a broker


class Failure(BaseModel):
    reason: str


class Invalid(BaseModel):
    reason: str


class UploadCap:
    """ASGI middleware capping request bodies before any of them is read (the form and
    JSON parsers would take a body of any size first, for any client, token or not): a
    ``POST`` to one of ``paths`` (the uploads) larger than ``limit`` bytes (its
    Content-Length) is answered 413, one that declares no length 411; any other request
    declaring more than ``other_limit`` bytes 413."""

    def __init__(self, app, paths: tuple[str, ...], limit: int, other_limit: int = 32 << 20):
        self.app, self.paths, self.limit, self.other_limit = app, paths, limit, other_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            upload = scope["method"] == "POST" and scope["path"] in self.paths
            length = dict(scope["headers"]).get(b"content-length")
            limit = self.limit if upload else self.other_limit
            if length is None and upload:
                return await JSONResponse({"detail": "an upload needs a Content-Length header"}, 411)(
                    scope, receive, send)
            if length is not None and (not length.isdigit() or int(length) > limit):
                return await JSONResponse({"detail": f"request body is {length.decode(errors='replace')[:20]} "
                                                     f"bytes, the limit is {limit}"}, 413)(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(course: Course, url: str, *, publish: Publish | None = None, reap_every_s: float = 5.0,
               clock: Callable[[], float] = service.clock) -> FastAPI:
    """The server for ``course`` over the database at ``url``. ``publish``: called with
    each job id a broker must carry (Celery pool mode), after the job is stored; None for
    the embedded runners, which poll the database. A background thread reaps expired
    leases every ``reap_every_s`` (and republishes what it put back)."""
    Sessions = db.sessions(url, course)
    secret = _secret(course)
    stop = threading.Event()

    def sweep():
        with Sessions() as s:
            for job_id in service.reap(s, clock()):
                _publish(s, job_id)

    def _publish(s: Session, job_id: int):
        if publish is not None:
            job = s.get(Job, job_id)
            try:
                publish(job_id, job.queue)
            except Exception:  # noqa: BLE001 - the job stays queued in the database; the sweep republishes
                pass

    def reaper():
        with Sessions() as s:  # at start: whatever a previous server left queued goes to the broker again
            for job_id in s.scalars(select(Job.id).where(Job.state == "queued")).all():
                _publish(s, job_id)
        while not stop.wait(reap_every_s):
            try:
                sweep()
            except Exception:  # noqa: BLE001 - a database hiccup: the next sweep
                continue

    @asynccontextmanager
    async def lifespan(_app):
        t = threading.Thread(target=reaper, daemon=True, name="labs-reaper")
        t.start()
        yield
        stop.set()

    app = FastAPI(title=f"{course.name}: course server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.sessions, app.state.course, app.state.sweep = Sessions, course, sweep
    app.add_middleware(UploadCap, paths=("/api/submissions", "/api/bridge/submissions"),
                       limit=(course.submissions.max_kb << 10) + (16 << 10))

    @app.exception_handler(Rejected)
    async def _rejected(request: Request, e: Rejected):
        headers = {"Retry-After": str(math.ceil(e.retry_after))} if e.retry_after is not None else {}
        if request.url.path.startswith("/api") or e.status != 401:
            if not request.url.path.startswith("/api"):
                return HTMLResponse(pages.message(course, f"{e.status}: {e.message}"), e.status, headers)
            return JSONResponse({"detail": e.message}, e.status, headers)
        return RedirectResponse("/login", 303)

    def session():
        with Sessions() as s:
            yield s

    def token_of(request: Request) -> str | None:
        auth = request.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return request.cookies.get(COOKIE)

    def account(request: Request, s: Session = Depends(session)) -> Account:
        return service.authenticate(s, token_of(request), ("student", "staff"))

    def staff(request: Request, s: Session = Depends(session)) -> Account:
        return service.authenticate(s, token_of(request), ("staff",))

    def runner(request: Request, s: Session = Depends(session)) -> Account:
        return service.authenticate(s, token_of(request), ("runner",))

    def own(s: Session, who: Account, sub_id: str) -> Submission:
        sub = s.get(Submission, sub_id)
        if sub is None or (who.role != "staff" and sub.account_id != who.id):
            raise Rejected(404, f"no submission {sub_id!r} of yours")
        return sub

    # --- the API -------------------------------------------------------------------------

    @app.get("/healthz")
    def healthz(s: Session = Depends(session)):
        queued = s.scalar(select(func.count(Job.id)).where(Job.state == "queued"))
        return {"ok": True, "queued": queued}

    @app.post("/api/submissions", status_code=201)
    async def submit(lab: str = Form(...), file: UploadFile = File(...), who: Account = Depends(account),
                     s: Session = Depends(session)):
        data = await file.read(course.submissions.max_kb * 1024 + 1)
        got = service.submit(s, course, who, lab, file.filename or "upload", data, clock())
        if not got.duplicate:
            _publish(s, got.job.id)
        view = service.submission_view(s, course, got.submission, who, clock())
        return {**view, "duplicate": got.duplicate}

    @app.get("/api/submissions")
    def list_submissions(lab: str | None = None, student: str | None = None, who: Account = Depends(account),
                         s: Session = Depends(session)):
        q = select(Submission).order_by(Submission.created_at)
        if who.role != "staff":
            q = q.where(Submission.account_id == who.id)
        elif student:
            q = q.join(Account).where(Account.name == student)
        if lab:
            q = q.where(Submission.lab == lab)
        return [service.submission_view(s, course, sub, who, clock()) for sub in s.scalars(q)]

    @app.get("/api/submissions/{sub_id}")
    def get_submission(sub_id: str, who: Account = Depends(account), s: Session = Depends(session)):
        return service.submission_view(s, course, own(s, who, sub_id), who, clock())

    @app.post("/api/runner/jobs/{job_id}/claim")
    def claim(job_id: int, who: Account = Depends(runner), s: Session = Depends(session),
              lease_s: float = Query(service.LEASE_S, gt=0, le=3600)):
        job = service.claim(s, who.name, clock(), job_id=job_id, lease_s=lease_s)
        if job is None:
            job = s.get(Job, job_id)
            state = job.state if job else "missing"
            wait = max(0.0, (job.lease_expires or 0) - clock()) if job and job.state == "running" else None
            raise Rejected(409, f"job {job_id} is {state}", retry_after=wait)
        return _claimed(job, lease_s)

    @app.post("/api/runner/jobs/next")
    def claim_next(who: Account = Depends(runner), s: Session = Depends(session),
                   lease_s: float = Query(service.LEASE_S, gt=0, le=3600)):
        job = service.claim(s, who.name, clock(), lease_s=lease_s)
        if job is None:
            return Response(status_code=204)
        return _claimed(job, lease_s)

    def _claimed(job: Job, lease_s: float) -> dict:
        sub = job.submission
        return {"job_id": job.id, "lab": sub.lab, "student": sub.account.name, "filename": sub.filename,
                "blob": base64.b64encode(sub.blob).decode(), "timeout_s": course.lab(sub.lab).limits.timeout_s,
                "lease_s": lease_s}

    @app.post("/api/runner/jobs/{job_id}/renew")
    def renew(job_id: int, who: Account = Depends(runner), s: Session = Depends(session),
              lease_s: float = Query(service.LEASE_S, gt=0, le=3600)):
        return {"held": service.renew(s, job_id, who.name, clock(), lease_s)}

    @app.post("/api/runner/jobs/{job_id}/complete")
    def complete(job_id: int, outcome: service.Outcome, who: Account = Depends(runner),
                 s: Session = Depends(session)):
        return {"stored": service.complete(s, job_id, who.name, outcome, clock(), course)}

    @app.post("/api/runner/jobs/{job_id}/fail")
    def fail(job_id: int, body: Failure, who: Account = Depends(runner), s: Session = Depends(session)):
        state = service.fail(s, job_id, who.name, body.reason, clock())
        if state == "queued":
            _publish(s, job_id)
        return {"state": state}

    def bridge(request: Request, s: Session = Depends(session)) -> Account:
        return service.authenticate(s, token_of(request), ("bridge",))

    @app.post("/api/bridge/submissions", status_code=201)
    async def bridge_submit(lab: str = Form(...), student: str = Form(""), email: str = Form(""),
                            file: UploadFile = File(...), _: Account = Depends(bridge), s: Session = Depends(session)):
        who = service.bridge_student(s, secret, student, email, now=clock())
        data = await file.read(course.submissions.max_kb * 1024 + 1)
        got = service.submit(s, course, who, lab, file.filename or "upload", data, clock())
        if not got.duplicate:
            _publish(s, got.job.id)
        return {**service.submission_view(s, course, got.submission, who, clock()), "duplicate": got.duplicate}

    @app.get("/api/bridge/submissions/{sub_id}")
    def bridge_result(sub_id: str, _: Account = Depends(bridge), s: Session = Depends(session)):
        """The state and, once graded, the full results.json (Gradescope shows it)."""
        sub = s.get(Submission, sub_id)
        if sub is None:
            raise Rejected(404, f"no submission {sub_id!r}")
        job = sub.jobs[-1]
        done = [j for j in sub.jobs if j.result is not None]
        return {"id": sub.id, "state": job.state, "error": job.error if job.state == "failed" else "",
                "results": service.results_json(course, done[-1].result) if done else None,
                "gpu_model": done[-1].result.gpu_model if done else None}

    @app.get("/api/staff/overview")
    def overview(_: Account = Depends(staff), s: Session = Depends(session)):
        return {"labs": service.overview(s, course, clock()), "runners": service.runner_health(s, clock())}

    @app.get("/api/staff/grades.csv")
    def grades_csv(lab: str, _: Account = Depends(staff), s: Session = Depends(session)):
        return PlainTextResponse(export_csv(s, lab), media_type="text/csv")

    @app.post("/api/staff/results/{result_id}/invalid")
    def invalid(result_id: int, body: Invalid, _: Account = Depends(staff), s: Session = Depends(session)):
        service.mark_invalid(s, result_id, body.reason)
        return {"ok": True}

    @app.post("/api/staff/regrade")
    def regrade(lab: str = Form(...), student: str | None = Form(None), _: Account = Depends(staff),
                s: Session = Depends(session)):
        ids = service.regrade(s, lab, clock(), student=student)
        for job_id in ids:
            _publish(s, job_id)
        return {"jobs": ids}

    @app.get("/api/leaderboard/{lab}")
    def leaderboard(lab: str, gpu: str | None = None, who: Account = Depends(account),
                    s: Session = Depends(session)):
        if lab not in course.labs:
            raise Rejected(404, f"no lab {lab!r}")
        return service.leaderboard(s, lab, gpu, staff=who.role == "staff")

    # --- pages -----------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse)
    def home(request: Request):
        return RedirectResponse("/me", 303)

    @app.get("/login", response_class=HTMLResponse)
    def login_form():
        return pages.login(course)

    @app.post("/login")
    def login(token: str = Form(...), s: Session = Depends(session)):
        who = service.authenticate(s, token, ("student", "staff"))
        resp = RedirectResponse("/staff" if who.role == "staff" else "/me", 303)
        resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
        return resp

    @app.get("/me", response_class=HTMLResponse)
    def me(who: Account = Depends(account), s: Session = Depends(session)):
        subs = s.scalars(select(Submission).where(Submission.account_id == who.id)
                         .order_by(Submission.created_at.desc())).all()
        return pages.student(course, who, [service.submission_view(s, course, x, who, clock()) for x in subs])

    @app.get("/submissions/{sub_id}", response_class=HTMLResponse)
    def submission_page(sub_id: str, who: Account = Depends(account), s: Session = Depends(session)):
        return pages.submission(course, service.submission_view(s, course, own(s, who, sub_id), who, clock()),
                                staff=who.role == "staff")

    @app.get("/staff", response_class=HTMLResponse)
    def staff_page(who: Account = Depends(staff), s: Session = Depends(session)):
        return pages.staff(course, service.overview(s, course, clock()), service.runner_health(s, clock()))

    @app.get("/leaderboard/{lab}", response_class=HTMLResponse)
    def leaderboard_page(lab: str, gpu: str | None = None, who: Account = Depends(account),
                         s: Session = Depends(session)):
        if lab not in course.labs:
            raise Rejected(404, f"no lab {lab!r}")
        return pages.leaderboard(course, course.labs[lab], service.leaderboard(s, lab, gpu, staff=who.role == "staff"),
                                 staff=who.role == "staff")

    @app.post("/staff/results/{result_id}/invalid")
    def invalid_form(result_id: int, reason: str = Form(...), lab: str = Form(...), _: Account = Depends(staff),
                     s: Session = Depends(session)):
        service.mark_invalid(s, result_id, reason)
        return RedirectResponse(f"/leaderboard/{lab}", 303)

    return app


def export_csv(s: Session, lab: str) -> str:
    """Staff export: one row per student, the newest graded result of ``lab``."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["student", "lab", "score", "max", "max_runnable", "status", "late_days", "submission", "graded_at"])
    for name, res, sub in service.newest_results(s, lab):
        w.writerow([name, lab, res.score, res.max_score, res.max_runnable, res.status, sub.late_days, sub.id,
                    service.utc(res.graded_at)])
    return out.getvalue()


def _secret(course: Course) -> bytes:
    return grading.course_secret(course) or b"labs-no-secret"
