"""The course server's HTTP side (FastAPI): ``create_app`` assembles it.

The JSON API under ``/api`` and the server-rendered pages, one router per resource
(``routes``: submissions, runner, bridge, staff, pages) over one dependency module
(``deps``: the session, the course, the clock, the account a token names), as the
FastAPI template does. No external assets, no static files: nothing on disk is served,
so no route can hand out graders or solutions. A student reads and submits only as
themselves; staff read everything; runner hosts use their own tokens for the
``/api/runner`` routes. The server never runs student code: it stores the modules it
validated, queues job ids and stores the records runners send back. A background
thread reaps expired leases (``reaper``).
"""
from __future__ import annotations

import math
import threading
from contextlib import asynccontextmanager
from typing import Callable

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from sqlalchemy import func, select

from .. import grading
from ..manifest import Course
from . import db, lti, pages, service, trials
from .db import Job, Trial
from .deps import Publish, Server, SessionDep
from .routes import ROUTERS
from .service import Rejected


class BodyTooLarge(HTTPException):
    """A request body read past its cap (``UploadCap``): answered 413 (an HTTPException, so
    the body parsers pass it on instead of calling it a malformed body)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is over {limit} bytes, the limit is {limit}", {"Connection": "close"})


class UploadCap:
    """ASGI middleware capping request bodies by the bytes read, before any route (its
    authentication included) sees them: the form and JSON parsers would take a body of any
    size first, for any client, token or not. A ``POST`` to one of ``paths`` (the uploads)
    must declare a Content-Length (else 411) of at most ``limit`` bytes; any other request
    at most ``other_limit``. A declared length over the cap is answered 413 at once;
    whatever is declared (or a chunked body, which declares nothing), reading stops with a
    413 as soon as more bytes than the cap arrived, so no request holds more than its cap
    in memory."""

    def __init__(self, app, paths: tuple[str, ...], limit: int, other_limit: int = 8 << 20):
        self.app, self.paths, self.limit, self.other_limit = app, paths, limit, other_limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        upload = scope["method"] == "POST" and scope["path"] in self.paths
        length = dict(scope["headers"]).get(b"content-length")
        limit = self.limit if upload else self.other_limit
        if length is None and upload:
            return await JSONResponse({"detail": "an upload needs a Content-Length header"}, 411)(
                scope, receive, send)
        if length is not None and (not length.isdigit() or int(length) > limit):
            return await _too_large(length.decode(errors="replace")[:20], limit)(scope, receive, send)
        read, started = 0, False

        async def capped_receive():
            nonlocal read
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > limit:
                    raise BodyTooLarge(limit)
            return message

        async def watched_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped_receive, watched_send)
        except BodyTooLarge:
            if started:
                raise
            await _too_large(f"over {limit}", limit)(scope, receive, send)


def _too_large(size: str, limit: int) -> JSONResponse:
    return JSONResponse({"detail": f"request body is {size} bytes, the limit is {limit}"}, 413,
                        headers={"Connection": "close"})


def reaper(server: Server, stop: threading.Event, every_s: float) -> None:
    """Until ``stop``: every ``every_s`` put the jobs whose lease expired back in the queue
    (``service.reap``, and trials a runner never finished: ``trials.reap``) and publish
    them again; at start, publish whatever a previous server left queued, trials too."""
    with server.sessions() as s:
        for job_id in s.scalars(select(Job.id).where(Job.state == "queued")).all():
            server.publish_job(s, job_id)
        for trial_id in s.scalars(select(Trial.id).where(Trial.state == "queued")).all():
            server.publish_trial(trial_id)
    while not stop.wait(every_s):
        try:
            sweep(server)
        except Exception:  # noqa: BLE001 - a database hiccup: the next sweep
            continue


def sweep(server: Server) -> None:
    """One reaper pass: expired leases back to the queue, and to the broker; the grades
    waiting for an LMS posted (``lti.send_pending``)."""
    with server.sessions() as s:
        for job_id in service.reap(s, server.clock()):
            server.publish_job(s, job_id)
        for trial_id in trials.reap(s, server.course, server.clock()):
            server.publish_trial(trial_id)
    lti.send_pending(server.sessions, server.course, server.clock())  # grades for LMS line items, retried


def create_app(course: Course, url: str, *, publish: Publish | None = None, reap_every_s: float = 5.0,
               clock: Callable[[], float] = service.clock) -> FastAPI:
    """The server for ``course`` over the database at ``url``. ``publish``: called with
    each job id a broker must carry (Celery pool mode), after the job is stored; None for
    the embedded runners, which poll the database. A background thread reaps expired
    leases every ``reap_every_s`` (and republishes what it put back)."""
    server = Server(course, db.sessions(url, course), clock, grading.course_secret(course) or b"labs-no-secret",
                    publish)
    stop = threading.Event()

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=reaper, args=(server, stop, reap_every_s), daemon=True, name="labs-reaper").start()
        yield
        stop.set()

    app = FastAPI(title=f"{course.name}: course server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.server, app.state.sessions = server, server.sessions  # the sessions: for scripts and tests
    app.add_middleware(UploadCap, paths=("/api/submissions", "/api/bridge/submissions", "/api/trials"),
                       limit=(course.submissions.max_kb << 10) + (16 << 10))

    @app.exception_handler(Rejected)
    async def _rejected(request: Request, e: Rejected):
        headers = {"Retry-After": str(math.ceil(e.retry_after))} if e.retry_after is not None else {}
        if not request.url.path.startswith("/api") and e.status == 401:
            return RedirectResponse("/login", 303)  # a page without a valid token: sign in
        if not request.url.path.startswith("/api"):
            return HTMLResponse(pages.message(course, f"{e.status}: {e.message}"), e.status, headers)
        return JSONResponse({"detail": e.message}, e.status, headers)

    @app.get("/healthz")
    def healthz(s: SessionDep):
        return {"ok": True, "queued": s.scalar(select(func.count(Job.id)).where(Job.state == "queued"))}

    for router in ROUTERS:
        app.include_router(router)
    return app
