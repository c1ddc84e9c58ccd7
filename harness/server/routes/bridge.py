"""The Gradescope bridge's routes: the autograder forwards a student's module with the
course's bridge token and reads the runners' grade back as results.json."""
from __future__ import annotations

from fastapi import APIRouter, File, Form, UploadFile

from .. import service
from ..db import Submission
from ..deps import Bridge, Now, ServerDep, SessionDep
from ..service import Rejected

router = APIRouter(prefix="/api/bridge")


@router.post("/submissions", status_code=201)
async def bridge_submit(srv: ServerDep, s: SessionDep, _: Bridge, now: Now, lab: str = Form(...),
                        student: str = Form(""), email: str = Form(""), file: UploadFile = File(...)):
    """Submit for the student Gradescope names (``service.bridge_student``)."""
    who = service.bridge_student(s, srv.secret, student, email, now=now)
    data = await file.read(srv.course.submissions.max_kb * 1024 + 1)
    got = service.submit(s, srv.course, who, lab, file.filename or "upload", data, now)
    if not got.duplicate:
        srv.publish_job(s, got.job.id)
    return {**service.submission_view(s, srv.course, got.submission, who, now), "duplicate": got.duplicate}


@router.get("/submissions/{sub_id}")
def bridge_result(sub_id: str, srv: ServerDep, s: SessionDep, _: Bridge):
    """The state and, once graded, the full results.json (Gradescope shows it)."""
    sub = s.get(Submission, sub_id)
    if sub is None:
        raise Rejected(404, f"no submission {sub_id!r}")
    job = sub.jobs[-1]
    done = [j for j in sub.jobs if j.result is not None]
    return {"id": sub.id, "state": job.state, "error": job.error if job.state == "failed" else "",
            "results": service.results_json(srv.course, done[-1].result) if done else None,
            "gpu_model": done[-1].result.gpu_model if done else None}
