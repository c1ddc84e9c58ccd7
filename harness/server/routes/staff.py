"""Staff routes: the overview and runner health, the grades export, regrades, invalid runs."""
from __future__ import annotations

import csv
import io

from fastapi import APIRouter, Form
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session

from ...manifest import ManifestError
from .. import regrades, service
from ..deps import CourseDep, Now, ServerDep, SessionDep, Staff

router = APIRouter(prefix="/api/staff")


class Invalid(BaseModel):
    reason: str


@router.get("/overview")
def overview(course: CourseDep, s: SessionDep, _: Staff, now: Now):
    return {"labs": service.overview(s, course, now), "runners": service.runner_health(s, now)}


@router.get("/grades.csv")
def grades_csv(lab: str, course: CourseDep, s: SessionDep, _: Staff):
    try:
        lab = course.lab(lab).number  # "3" is lab 03; an unknown lab is an error, not an empty file
    except ManifestError as e:
        raise service.Rejected(404, str(e)) from None
    return PlainTextResponse(export_csv(s, lab, course), media_type="text/csv")


@router.post("/results/{result_id}/invalid")
def invalid(result_id: int, body: Invalid, s: SessionDep, _: Staff):
    service.mark_invalid(s, result_id, body.reason)
    return {"ok": True}


@router.post("/regrade")
def regrade(srv: ServerDep, s: SessionDep, _: Staff, now: Now, lab: str = Form(...),
            student: str | None = Form(None), reason: str = Form("regrade after a grader change")):
    ids = service.regrade(s, lab, now, student=student, reason=reason)
    for job_id in ids:
        srv.publish_job(s, job_id)
    return {"jobs": ids}


class Answer(BaseModel):
    answer: str
    regrade: bool = False


@router.get("/regrade-requests")
def regrade_requests(s: SessionDep, _: Staff, everything: bool = False):
    """The open regrade requests, oldest first (``everything``: answered ones too)."""
    return regrades.queue(s, everything=everything)


@router.post("/regrade-requests/{req_id}")
def answer_request(req_id: int, body: Answer, srv: ServerDep, s: SessionDep, who: Staff, now: Now):
    """Answer a request; with ``regrade``, queue the submission again (published to the broker)."""
    req = regrades.answer(s, req_id, who.name, body.answer, body.regrade, now)
    if req.job_id is not None:
        srv.publish_job(s, req.job_id)
    return regrades.request_view(req)


def export_csv(s: Session, lab: str, course=None) -> str:
    """Staff export: one row per student, the newest graded result of ``lab`` (with
    ``course``: its score under the late-day rules as they stand now, ``latedays``)."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["student", "lab", "score", "max", "max_runnable", "status", "late_days", "submission", "graded_at"])
    for name, res, sub in service.newest_results(s, lab):
        score = service.results_json(course, res)["score"] if course is not None else res.score
        w.writerow([name, lab, score, res.max_score, res.max_runnable, res.status, sub.late_days, sub.id,
                    service.utc(res.graded_at)])
    return out.getvalue()
