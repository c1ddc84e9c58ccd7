"""What every route of the course server depends on: the session, the course, the clock,
the publisher, and the account a request's token names (FastAPI dependencies, as the
FastAPI template's ``api/deps.py``).

Every request names its account by token: ``Authorization: Bearer <token>`` for the
API, the ``labs_token`` cookie (set by the login form) for pages. ``Student`` is a
student or staff account (staff read everything); ``Staff``, ``Runner`` and ``Bridge``
take only their own role; a wrong or missing token is ``Rejected(401)``, another role
``Rejected(403)``. What ``create_app`` made lives in ``app.state`` (``Server``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Callable, Iterator

from fastapi import Depends, Request
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from ..manifest import Course
from . import service
from .db import Account, Job, Submission
from .service import Rejected

COOKIE = "labs_token"
Publish = Callable[[int | str, str], None]  # (job id, queue) or (trial id, "trial"): hand an id to a broker
TRIAL_QUEUE = "trial"  # the broker's queue of trial runs (``pool``), after every graded job's


@dataclass
class Server:
    """What ``create_app`` made, in ``app.state.server``: the course, its database, its
    clock and grading secret, and the broker's ``publish`` (None: embedded runners poll)."""
    course: Course
    sessions: sessionmaker
    clock: Callable[[], float]
    secret: bytes
    publish: Publish | None = None

    def publish_job(self, s: Session, job_id: int) -> None:
        """Hand ``job_id`` to the broker (pool mode); a broker that fails leaves the job
        queued in the database, and the reaper's sweep publishes it again."""
        if self.publish is not None:
            try:
                self.publish(job_id, s.get(Job, job_id).queue)
            except Exception:  # noqa: BLE001 - see the docstring
                pass

    def publish_trial(self, trial_id: str) -> None:
        """Hand trial ``trial_id`` to the broker's trial queue (pool mode; after every
        graded job, see ``pool``); a broker that fails leaves it queued for the reaper."""
        if self.publish is not None:
            try:
                self.publish(trial_id, TRIAL_QUEUE)
            except Exception:  # noqa: BLE001 - see the docstring
                pass


def server(request: Request) -> Server:
    return request.app.state.server


def session(request: Request) -> Iterator[Session]:
    with request.app.state.server.sessions() as s:
        yield s


def course(request: Request) -> Course:
    return request.app.state.server.course


def now(request: Request) -> float:
    """The server's clock (tests replace it)."""
    return request.app.state.server.clock()


ServerDep = Annotated[Server, Depends(server)]
SessionDep = Annotated[Session, Depends(session)]
CourseDep = Annotated[Course, Depends(course)]
Now = Annotated[float, Depends(now)]


def token_of(request: Request) -> str | None:
    """The request's token: the bearer token, else the login cookie."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.cookies.get(COOKIE)


def _role(*roles: str):
    def account(request: Request, s: SessionDep) -> Account:
        return service.authenticate(s, token_of(request), roles)
    return account


Student = Annotated[Account, Depends(_role("student", "staff"))]
Staff = Annotated[Account, Depends(_role("staff"))]
Runner = Annotated[Account, Depends(_role("runner"))]
Bridge = Annotated[Account, Depends(_role("bridge"))]


def own(s: Session, who: Account, sub_id: str) -> Submission:
    """Submission ``sub_id`` if ``who`` may read it (theirs, or any for staff); else
    Rejected(404), the same answer as for one that does not exist."""
    sub = s.get(Submission, sub_id)
    if sub is None and 4 <= len(sub_id) < 32 and all(c in "0123456789abcdef" for c in sub_id):
        q = select(Submission).where(Submission.id.startswith(sub_id)).limit(2)  # a unique prefix of an id
        if who.role != "staff":
            q = q.where(Submission.account_id == who.id)
        found = s.scalars(q).all()
        if len(found) > 1:
            raise Rejected(409, f"submission prefix {sub_id!r} names more than one of yours: give more of the id")
        sub = found[0] if found else None
    if sub is None or (who.role != "staff" and sub.account_id != who.id):
        short = " (a prefix has at least 4 characters)" if len(sub_id) < 4 else ""
        raise Rejected(404, f"no submission {sub_id!r} of yours{short}")
    return sub
