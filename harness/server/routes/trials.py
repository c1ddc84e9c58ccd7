"""Trial runs' routes (``trials``): a student uploads a module for a trial, reads their
own trials. Not submissions: nothing here is graded or counted."""
from __future__ import annotations

from fastapi import APIRouter, File, Form, UploadFile

from .. import trials
from ..db import Trial
from ..deps import CourseDep, Now, ServerDep, SessionDep, Student
from ..service import Rejected

router = APIRouter(prefix="/api/trials")


@router.post("", status_code=201)
async def submit_trial(srv: ServerDep, course: CourseDep, s: SessionDep, who: Student, now: Now, lab: str = Form(...),
                       file: UploadFile = File(...)):
    """Queue a trial of the upload's module (behind every submission; in pool mode on the
    broker's trial queue too); 429 past the quota."""
    data = await file.read(course.submissions.max_kb * 1024 + 1)
    trial = trials.submit(s, course, who, lab, file.filename or "upload", data, now)
    srv.publish_trial(trial.id)
    return trials.view(s, course, trial)


@router.get("")
def list_trials(course: CourseDep, s: SessionDep, who: Student):
    """The caller's trials, newest first."""
    return [trials.view(s, course, t) for t in trials.of(s, who)]


@router.get("/{trial_id}")
def get_trial(trial_id: str, course: CourseDep, s: SessionDep, who: Student):
    """One of the caller's trials (staff: anyone's): state, then the visible tests and
    each perf figure beside its thresholds."""
    trial = s.get(Trial, trial_id)
    if trial is None or (who.role != "staff" and trial.account_id != who.id):
        raise Rejected(404, f"no trial {trial_id!r} of yours")
    return trials.view(s, course, trial)
