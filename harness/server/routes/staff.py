"""Staff routes: the overview and runner health, the grades export, regrades, invalid runs."""
from __future__ import annotations

import csv
import io

from fastapi import APIRouter, Form
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session

from .. import service
from ..deps import CourseDep, Now, ServerDep, SessionDep, Staff

router = APIRouter(prefix="/api/staff")


class Invalid(BaseModel):
    reason: str


@router.get("/overview")
def overview(course: CourseDep, s: SessionDep, _: Staff, now: Now):
    return {"labs": service.overview(s, course, now), "runners": service.runner_health(s, now)}


@router.get("/grades.csv")
def grades_csv(lab: str, s: SessionDep, _: Staff):
    return PlainTextResponse(export_csv(s, lab), media_type="text/csv")


@router.post("/results/{result_id}/invalid")
def invalid(result_id: int, body: Invalid, s: SessionDep, _: Staff):
    service.mark_invalid(s, result_id, body.reason)
    return {"ok": True}


@router.post("/regrade")
def regrade(srv: ServerDep, s: SessionDep, _: Staff, now: Now, lab: str = Form(...),
            student: str | None = Form(None)):
    ids = service.regrade(s, lab, now, student=student)
    for job_id in ids:
        srv.publish_job(s, job_id)
    return {"jobs": ids}


def export_csv(s: Session, lab: str) -> str:
    """Staff export: one row per student, the newest graded result of ``lab``."""
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["student", "lab", "score", "max", "max_runnable", "status", "late_days", "submission", "graded_at"])
    for name, res, sub in service.newest_results(s, lab):
        w.writerow([name, lab, res.score, res.max_score, res.max_runnable, res.status, sub.late_days, sub.id,
                    service.utc(res.graded_at)])
    return out.getvalue()
