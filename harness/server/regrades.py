"""Regrade requests and each submission's run history.

A student asks for a submission to be looked at again, with a reason; staff see the
open requests, answer, and may regrade. A regrade (asked for, or `labs regrade` after a
grader change) is a new job on the regrade queue whose ``reason`` says why; its result
is a new row beside the old one (a result is unique per job): nothing is overwritten,
and every page shows each run's score, when and why.
"""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..manifest import Course
from .db import Account, Job, RegradeRequest, Submission
from .service import Rejected, results_json, submission_view

MAX_TEXT = 2000  # characters of a reason or an answer


def _text(value: str, name: str) -> str:
    value = (value or "").strip()
    if not value:
        raise Rejected(422, f"{name} is empty: say what should be looked at again")
    if len(value) > MAX_TEXT:
        raise Rejected(422, f"{name} is {len(value)} characters, the limit is {MAX_TEXT}")
    return value


def ask(s: Session, sub: Submission, who: Account, reason: str, now: float) -> RegradeRequest:
    """``who`` (the submission's student) asks for ``sub`` to be regraded. Raises
    Rejected: 422 an empty or too long reason, 409 a submission not graded yet or with
    a request still open."""
    reason = _text(reason, "reason")
    if not any(j.result is not None for j in sub.jobs):
        raise Rejected(409, f"submission {sub.id} is not graded yet: ask once it is")
    if s.scalar(select(RegradeRequest.id).where(RegradeRequest.submission_id == sub.id,
                                                RegradeRequest.state == "open")):
        raise Rejected(409, f"submission {sub.id} has a regrade request open already: staff will answer it")
    req = RegradeRequest(submission_id=sub.id, account_id=who.id, reason=reason, state="open", created_at=now)
    s.add(req)
    s.commit()
    return req


def answer(s: Session, req_id: int, by: str, text: str, regrade: bool, now: float) -> RegradeRequest:
    """Staff member ``by`` answers request ``req_id``; with ``regrade``, queue the submission again on the
    regrade queue (the job's reason names the request). Raises Rejected: 404 no such
    request, 409 one answered already, 422 an empty answer."""
    req = s.get(RegradeRequest, req_id)
    if req is None:
        raise Rejected(404, f"no regrade request {req_id}")
    if req.state != "open":
        raise Rejected(409, f"regrade request {req_id} was answered already ({req.state})")
    req.answer, req.answered_by, req.answered_at = _text(text, "answer"), by, now
    req.state = "regraded" if regrade else "answered"
    if regrade:
        job = Job(submission_id=req.submission_id, queue="regrade", state="queued", created_at=now,
                  reason=f"regrade request {req.id}: {req.reason}")
        s.add(job)
        s.flush()
        req.job_id = job.id
    s.commit()
    return req


def request_view(req: RegradeRequest) -> dict:
    """A request as the pages and the API show it."""
    return {"id": req.id, "submission": req.submission_id, "lab": req.submission.lab,
            "student": req.submission.account.name, "reason": req.reason, "state": req.state,
            "answer": req.answer, "answered_by": req.answered_by, "created_at": req.created_at,
            "answered_at": req.answered_at, "job": req.job_id}


def queue(s: Session, *, everything: bool = False) -> list[dict]:
    """The open requests, oldest first (``everything``: answered ones too)."""
    q = select(RegradeRequest).order_by(RegradeRequest.created_at)
    if not everything:
        q = q.where(RegradeRequest.state == "open")
    return [request_view(r) for r in s.scalars(q)]


def history(course: Course, sub: Submission) -> list[dict]:
    """Every graded run of ``sub``, oldest first: score (after the late rules), status,
    when, on what, and why the run was made."""
    runs = []
    for job in sub.jobs:
        if job.result is None:
            continue
        res = job.result
        runs.append({"job": job.id, "result": res.id, "score": results_json(course, res)["score"],
                     "max_score": res.max_score, "status": res.status, "graded_at": res.graded_at,
                     "gpu_model": res.gpu_model, "queue": job.queue, "reason": job.reason or "graded on submission"})
    return runs


def full_view(s: Session, course: Course, sub: Submission, viewer: Account, now: float) -> dict:
    """``service.submission_view`` with the run history and the regrade requests: what
    ``labs status ID`` and ``/submissions/ID`` show the student and staff."""
    view = submission_view(s, course, sub, viewer, now)
    view["runs"] = history(course, sub)
    view["regrade_requests"] = [request_view(r) for r in s.scalars(
        select(RegradeRequest).where(RegradeRequest.submission_id == sub.id).order_by(RegradeRequest.id))]
    return view
