"""Students' routes: upload a lab's module, read their own submissions, the leaderboard."""
from __future__ import annotations

from fastapi import APIRouter, File, Form, UploadFile
from pydantic import BaseModel
from sqlalchemy import select

from .. import regrades, service
from ..db import Account, Submission
from ..deps import CourseDep, Now, ServerDep, SessionDep, Student, own
from ..service import Rejected

router = APIRouter(prefix="/api")


@router.post("/submissions", status_code=201)
async def submit(srv: ServerDep, s: SessionDep, who: Student, now: Now, lab: str = Form(...),
                 file: UploadFile = File(...)):
    """Store the upload's module and queue it (``service.submit``); the view, and whether
    it was the same module as one already queued or graded (``duplicate``)."""
    data = await file.read(srv.course.submissions.max_kb * 1024 + 1)
    got = service.submit(s, srv.course, who, lab, file.filename or "upload", data, now)
    if not got.duplicate:
        srv.publish_job(s, got.job.id)
    return {**service.submission_view(s, srv.course, got.submission, who, now), "duplicate": got.duplicate}


@router.get("/submissions")
def list_submissions(course: CourseDep, s: SessionDep, who: Student, now: Now, lab: str | None = None,
                     student: str | None = None):
    """The caller's submissions (staff: everyone's, or ``student``'s), oldest first."""
    q = select(Submission).order_by(Submission.created_at)
    if who.role != "staff":
        q = q.where(Submission.account_id == who.id)
    elif student:
        q = q.join(Account).where(Account.name == student)
    if lab:
        q = q.where(Submission.lab == lab)
    return [service.submission_view(s, course, sub, who, now) for sub in s.scalars(q)]


@router.get("/submissions/{sub_id}")
def get_submission(sub_id: str, course: CourseDep, s: SessionDep, who: Student, now: Now):
    """One submission of the caller's: state, queue position, ETA, result, every run and
    the regrade requests (``regrades.full_view``)."""
    return regrades.full_view(s, course, own(s, who, sub_id), who, now)


class Ask(BaseModel):
    reason: str


@router.post("/submissions/{sub_id}/regrade-requests", status_code=201)
def ask_regrade(sub_id: str, body: Ask, s: SessionDep, who: Student, now: Now):
    """The caller asks for their graded submission to be regraded, with a reason."""
    sub = own(s, who, sub_id)
    if sub.account_id != who.id:
        raise Rejected(403, "only the student who submitted it can ask for a regrade")
    return regrades.request_view(regrades.ask(s, sub, who, body.reason, now))


@router.get("/leaderboard/{lab}")
def leaderboard(lab: str, course: CourseDep, s: SessionDep, who: Student, gpu: str | None = None):
    """Each student's best run of ``lab`` per GPU model (pseudonyms; staff see names)."""
    if lab not in course.labs:
        raise Rejected(404, f"no lab {lab!r}")
    return service.leaderboard(s, lab, gpu, staff=who.role == "staff")
