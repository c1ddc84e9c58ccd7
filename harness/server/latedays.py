"""Late days: how late a submission is (after the student's extension of that lab), and
what the course-wide budget (``late_days: {budget: N}`` in labs.yaml) covers.

Each lab's counted submission (the newest graded one, else the newest) is ``days``
started days late past the lab's deadline, its grace and the student's extension
(``labs extend``). The budget is spent lab by lab in lab-number order: lab L's days
are covered while the budget left after the labs before L lasts; the days it does not
cover are charged ``submissions.late.penalty_per_day`` each. Computed when read, never
stored: an extension or a regrade of an earlier lab changes the grades it should.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from ..manifest import Course, Lab
from .db import Account, Extension, Job, Submission

DAY_S = 86400.0


def extension(s: Session, account_id: int, lab: str) -> float:
    """The days staff moved ``account_id``'s deadline of ``lab`` (the newest extension; 0 without)."""
    days = s.scalar(select(Extension.days).where(Extension.account_id == account_id, Extension.lab == lab)
                    .order_by(Extension.id.desc()).limit(1))
    return days or 0.0


def over_s(course: Course, lab: Lab, at: float, extra_days: float = 0.0) -> float:
    """Seconds ``at`` is past ``lab``'s deadline, its grace and ``extra_days`` (<= 0: on time)."""
    if lab.deadline is None:
        return 0.0
    return at - lab.deadline.timestamp() - course.submissions.late.grace_minutes * 60 - extra_days * DAY_S


def days_late(course: Course, lab: Lab, at: float, extra_days: float = 0.0) -> int:
    """The started days ``at`` is late for ``lab`` (0 on time)."""
    over = over_s(course, lab, at, extra_days)
    return math.ceil(over / DAY_S) if over > 0 else 0


def counted(s: Session, account_id: int, lab: str) -> Submission | None:
    """The submission of ``lab`` that counts for ``account_id``: the newest graded, else the newest."""
    subs = s.scalars(select(Submission).where(Submission.account_id == account_id, Submission.lab == lab)
                     .order_by(Submission.created_at.desc())).all()
    graded = [x for x in subs if any(j.result is not None for j in x.jobs)]
    return (graded or subs or [None])[0]


def sub_days(s: Session, course: Course, sub: Submission) -> int:
    """How many days late ``sub`` is, after its student's extension of its lab."""
    return days_late(course, course.lab(sub.lab), sub.created_at, extension(s, sub.account_id, sub.lab))


@dataclass
class Standing:
    """One student's late days: the budget, what each lab's counted submission used
    (``labs``: lab -> {days, covered, charged, extension}), spent and left."""
    budget: int
    labs: dict[str, dict] = field(default_factory=dict)

    @property
    def spent(self) -> int:
        return sum(v["covered"] for v in self.labs.values())

    @property
    def left(self) -> int:
        return self.budget - self.spent

    def as_dict(self) -> dict:
        return {"budget": self.budget, "spent": self.spent, "left": self.left, "labs": self.labs}


def standing(s: Session, course: Course, account: Account, *, upto: str | None = None) -> Standing:
    """``account``'s late days over the course's labs in number order (those before
    ``upto`` only, when given)."""
    out = Standing(course.late_days.budget)
    left = out.budget
    for number in sorted(course.labs):
        if upto is not None and number >= upto:
            break
        sub = counted(s, account.id, number)
        if sub is None:
            continue
        days = sub_days(s, course, sub)
        covered = min(days, left)
        left -= covered
        out.labs[number] = {"days": days, "covered": covered, "charged": days - covered,
                            "extension": extension(s, account.id, number)}
    return out


def charged(course: Course, sub: Submission) -> int:
    """The late days of ``sub`` that cost a penalty: its days past what the budget has
    left after the labs before its own."""
    s = object_session(sub)
    days = sub_days(s, course, sub)
    before = standing(s, course, sub.account, upto=sub.lab)
    return days - min(days, max(0, before.left))


def factor(course: Course, sub: Submission) -> float:
    """What ``sub``'s score is multiplied by (1.0 on time or covered by the budget)."""
    return max(0.0, 1.0 - course.submissions.late.penalty_per_day * charged(course, sub))


def extend(s: Session, course: Course, account: Account, lab: Lab, days: float, *, reason: str = "",
           by: str = "", now: float) -> Extension:
    """Move ``account``'s deadline of ``lab`` by ``days`` (a newer extension replaces the
    figure; every one is kept). Raises ValueError naming a negative or absurd ``days``."""
    if not 0 <= days <= 365:
        raise ValueError(f"--days {days!r} must be between 0 and 365")
    if lab.deadline is None:
        raise ValueError(f"lab {lab.number} has no deadline to extend (labs.yaml: labs.{lab.number}.deadline)")
    row = Extension(account_id=account.id, lab=lab.number, days=days, reason=reason, created_by=by, created_at=now)
    s.add(row)
    s.commit()
    return row


def job_reason(job: Job) -> str:
    """Why a run was made, in words ("graded on submission" for the submission's own)."""
    return job.reason or "graded on submission"
