"""Trial runs: a student runs a lab's visible tests and its performance tests on the
grading hardware before submitting (``labs submit NN --trial``). A trial is not a
submission: it lives in its own table, so no grade, export, leaderboard, late day or
rate limit ever sees it; each student has ``trials.per_lab`` of them per lab
(labs.yaml); runners take one only when no submission or regrade waits.
"""
from __future__ import annotations

import json
import secrets

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..errors import LabsError
from ..manifest import Course
from .db import Account, Job, Trial
from .service import Rejected, module_of


def submit(s: Session, course: Course, account: Account, lab_number: str, filename: str, data: bytes,
           now: float) -> Trial:
    """Store a trial of ``account``'s module of a lab, queued behind every submission.
    Raises Rejected: 404 no such lab, 413 too large, 422 no module, 429 the quota spent
    (a trial that failed for the infrastructure does not count)."""
    try:
        lab = course.lab(lab_number)
    except LabsError:
        raise Rejected(404, f"no lab {lab_number!r}") from None
    cap = course.submissions.max_kb << 10
    if len(data) > cap:
        raise Rejected(413, f"upload is {len(data)} bytes, the limit is {cap} (submissions.max_kb)")
    module = module_of(data, filename, lab, max_bytes=8 * cap)
    used = s.scalar(select(func.count(Trial.id)).where(Trial.account_id == account.id, Trial.lab == lab.number,
                                                      Trial.state != "failed"))
    quota = course.trials.per_lab
    if account.role != "staff" and used >= quota:
        raise Rejected(429, f"your {quota} trial run(s) of lab {lab.number} are used (labs.yaml trials.per_lab): "
                            f"submit it (`labs submit {lab.number}`) to have it graded")
    trial = Trial(id=secrets.token_hex(16), account_id=account.id, lab=lab.number, blob=module.data, state="queued",
                  created_at=now, result="", error="")
    s.add(trial)
    s.commit()
    return trial


WAIT_S = 5.0  # a pool worker asking for a trial while graded jobs are queued asks again this much later


def jobs_queued(s: Session) -> bool:
    """Whether a submission or a regrade waits (a trial then waits behind it)."""
    return s.scalar(select(Job.id).where(Job.state == "queued").limit(1)) is not None


def claim(s: Session, owner: str, now: float, *, trial_id: str | None = None) -> Trial | None:
    """The oldest queued trial (``trial_id``: that one, a broker delivered it) for
    ``owner``, only while no job (a submission or a regrade) is queued: trials wait
    behind graded work. None when there is none (or it is not queued)."""
    while True:
        if jobs_queued(s):
            return None
        q = select(Trial.id).where(Trial.state == "queued")
        candidate = s.scalar(q.where(Trial.id == trial_id) if trial_id else q.order_by(Trial.created_at).limit(1))
        if candidate is None:
            return None
        won = s.execute(update(Trial).where(Trial.id == candidate, Trial.state == "queued")
                        .values(state="running", owner=owner, started_at=now)).rowcount
        s.commit()
        if won:
            return s.get(Trial, candidate, populate_existing=True)


def reap(s: Session, course: Course, now: float) -> list[str]:
    """Put back in the queue the trials a runner took and never finished (a killed pool
    worker: trials hold no lease), after twice the lab's time limit and a margin; their
    ids, to publish again."""
    back = []
    for trial in s.scalars(select(Trial).where(Trial.state == "running")).all():
        limit = 2 * course.lab(trial.lab).limits.timeout_s + 120
        if trial.started_at is not None and trial.started_at + limit < now:
            trial.state, trial.owner, trial.started_at = "queued", None, None
            back.append(trial.id)
    s.commit()
    return back


def finish(s: Session, trial_id: str, result: dict | None, error: str, now: float) -> None:
    """Store what a trial ran (``result``), or why it could not run (``error``: failed,
    and it does not count against the quota)."""
    trial = s.get(Trial, trial_id)
    trial.state, trial.finished_at = ("done", now) if result is not None else ("failed", now)
    trial.result, trial.error = (json.dumps(result) if result is not None else ""), error
    s.commit()


def view(s: Session, course: Course, trial: Trial) -> dict:
    """A trial as the student reads it: state, position behind the queue, what ran."""
    ahead = None
    if trial.state == "queued":
        ahead = (s.scalar(select(func.count(Job.id)).where(Job.state == "queued"))
                 + s.scalar(select(func.count(Trial.id)).where(Trial.state == "queued",
                                                              Trial.created_at < trial.created_at)))
    used = s.scalar(select(func.count(Trial.id)).where(Trial.account_id == trial.account_id,
                                                      Trial.lab == trial.lab, Trial.state != "failed"))
    return {"id": trial.id, "lab": trial.lab, "student": trial.account.name, "state": trial.state, "trial": True,
            "submitted_at": trial.created_at, "ahead": ahead, "error": trial.error,
            "quota_left": max(0, course.trials.per_lab - used),
            "result": json.loads(trial.result) if trial.result else None}


def of(s: Session, account: Account) -> list[Trial]:
    """``account``'s trials, newest first."""
    return s.scalars(select(Trial).where(Trial.account_id == account.id).order_by(Trial.created_at.desc())).all()
