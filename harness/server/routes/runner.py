"""Runner hosts' routes: claim a job, renew its lease, complete it with the typed record,
or fail it (an infrastructure failure: the job is retried). The runners' side of this
contract is ``jobs.work`` through ``pool.ApiJobs``."""
from __future__ import annotations

import base64

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel

from .. import service, trials
from ..db import Job, Trial
from ..deps import CourseDep, Now, Runner, ServerDep, SessionDep
from ..service import Rejected

router = APIRouter(prefix="/api/runner/jobs")
trial_router = APIRouter(prefix="/api/runner/trials")
Lease = Query(service.LEASE_S, gt=0, le=3600)


class Failure(BaseModel):
    reason: str


def _claimed(course, job: Job, lease_s: float) -> dict:
    sub = job.submission
    return {"job_id": job.id, "lab": sub.lab, "student": sub.account.name, "filename": sub.filename,
            "blob": base64.b64encode(sub.blob).decode(), "timeout_s": course.lab(sub.lab).limits.timeout_s,
            "lease_s": lease_s}


@router.post("/{job_id}/claim")
def claim(job_id: int, course: CourseDep, s: SessionDep, who: Runner, now: Now, lease_s: float = Lease):
    """Take job ``job_id`` (a broker delivered it): 409 when it is not queued, with
    ``Retry-After`` while another runner's lease holds it."""
    job = service.claim(s, who.name, now, job_id=job_id, lease_s=lease_s)
    if job is None:
        job = s.get(Job, job_id)
        state = job.state if job else "missing"
        wait = max(0.0, (job.lease_expires or 0) - now) if job and job.state == "running" else None
        raise Rejected(409, f"job {job_id} is {state}", retry_after=wait)
    return _claimed(course, job, lease_s)


@router.post("/next")
def claim_next(course: CourseDep, s: SessionDep, who: Runner, now: Now, lease_s: float = Lease):
    """Take the oldest queued job (interactive first); 204 when there is none."""
    job = service.claim(s, who.name, now, lease_s=lease_s)
    if job is None:
        return Response(status_code=204)
    return _claimed(course, job, lease_s)


@router.post("/{job_id}/renew")
def renew(job_id: int, s: SessionDep, who: Runner, now: Now, lease_s: float = Lease):
    return {"held": service.renew(s, job_id, who.name, now, lease_s)}


@router.post("/{job_id}/complete")
def complete(job_id: int, outcome: service.Outcome, course: CourseDep, s: SessionDep, who: Runner, now: Now):
    """Store the job's record (the body: ``service.Outcome``, validated into the typed
    record); ``stored`` False for a second one (dropped)."""
    return {"stored": service.complete(s, job_id, who.name, outcome, now, course)}


@router.post("/{job_id}/fail")
def fail(job_id: int, body: Failure, srv: ServerDep, s: SessionDep, who: Runner, now: Now):
    """An infrastructure failure: the job goes back to the queue (and the broker), or to
    ``failed`` after ``service.MAX_ATTEMPTS``."""
    state = service.fail(s, job_id, who.name, body.reason, now)
    if state == "queued":
        srv.publish_job(s, job_id)
    return {"state": state}


class TrialRun(BaseModel):
    result: dict | None = None
    error: str = ""


@trial_router.post("/{trial_id}/claim")
def claim_trial(trial_id: str, s: SessionDep, who: Runner, now: Now):
    """Take trial ``trial_id`` (the broker's trial queue delivered it): 409 with
    ``Retry-After`` while a graded job is queued (trials come after them), 409 without
    when it is not queued (done, failed, or another runner's)."""
    trial = trials.claim(s, who.name, now, trial_id=trial_id)
    if trial is None:
        got = s.get(Trial, trial_id)
        if got is not None and got.state == "queued":
            raise Rejected(409, f"trial {trial_id} waits behind graded jobs", retry_after=trials.WAIT_S)
        raise Rejected(409, f"trial {trial_id} is {got.state if got else 'missing'}")
    return {"trial_id": trial.id, "lab": trial.lab, "student": trial.account.name,
            "blob": base64.b64encode(trial.blob).decode()}


@trial_router.post("/{trial_id}/finish")
def finish_trial(trial_id: str, body: TrialRun, s: SessionDep, who: Runner, now: Now):
    """Store what the trial ran (``result``) or why it could not run (``error``); only
    the runner that holds it may."""
    trial = s.get(Trial, trial_id)
    if trial is None or trial.state != "running" or trial.owner != who.name:
        raise Rejected(409, f"trial {trial_id} is not running on {who.name}")
    trials.finish(s, trial_id, body.result, body.error, now)
    return {"state": s.get(Trial, trial_id).state}
