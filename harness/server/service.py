"""What the course server does, without HTTP: the roster, the intake, the job queue with
leases, results, regrades and the leaderboard. Every function takes a SQLAlchemy session
and commits what it changes; ``now`` (seconds since the epoch) is passed in so tests
control time.

Jobs move ``queued -> running -> done`` (a result is stored) or ``cancelled`` (a newer
submission of the same student and lab came first) or ``failed`` (the infrastructure
failed ``MAX_ATTEMPTS`` times: no score, staff see why). A runner holds a running job
under a lease it renews; ``reap`` puts a job whose lease expired back in the queue (a
killed runner loses nothing). ``claim`` is one conditional UPDATE, so two runners never
hold one job; ``complete`` inserts the result under a unique constraint, so a job
delivered twice stores one result.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import case, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .. import archives, grading, impl as _impl, records
from ..records import Graded
from ..grading import pack_module  # noqa: F401  (service.pack_module: what `labs submit` uploads)
from ..errors import LabsError
from ..manifest import Course, Lab, LabPaths
from . import latedays
from .db import QUEUES, ROLES, Account, Bucket, Job, LtiLink, LtiPost, LtiSession, Result, Submission, hash_token

MAX_ATTEMPTS = 3   # infrastructure attempts of one job: the first and at most 2 retries
LEASE_S = 60.0     # a runner renews its lease every LEASE_S / 4 while it grades
DAY_S = 86400.0


class Rejected(LabsError):
    """The intake refused a submission or a request: ``status`` is the HTTP status
    (401, 403, 404, 409, 413, 422, 429), ``retry_after`` seconds for 429."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


# --- the roster -----------------------------------------------------------------------

ADJECTIVES = ("amber", "brisk", "calm", "deft", "eager", "fair", "glad", "hardy", "keen", "lucid", "merry",
              "nimble", "plucky", "quiet", "rapid", "sunny", "tidy", "vivid", "witty", "zesty")
ANIMALS = ("otter", "heron", "lynx", "panda", "raven", "koala", "bison", "gecko", "ibis", "marten", "newt",
           "okapi", "puffin", "quokka", "stoat", "tapir", "urchin", "vole", "walrus", "yak")


def pseudonym(secret: bytes, name: str) -> str:
    """The leaderboard's stable name for ``name`` (HMAC of the course secret): not
    reversible without the secret, the same on every page."""
    h = hmac.new(secret, name.encode(), hashlib.sha256).digest()
    return f"{ADJECTIVES[h[0] % len(ADJECTIVES)]}-{ANIMALS[h[1] % len(ANIMALS)]}-{h[2]:02x}"


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _new_account(s: Session, name: str, role: str, secret: bytes, *, email: str = "", now: float) -> str:
    """Add (not commit) account ``name`` after checking it; return its token. Raises
    ValueError for a bad role or name, Rejected(409) when the name exists."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not name or len(name) > 200:
        raise ValueError(f"name must be 1 to 200 characters, got {name!r}")
    if s.scalar(select(Account).where(Account.name == name)):
        raise Rejected(409, f"account {name!r} exists (`labs account token {name}` issues a new token)")
    token = new_token()
    s.add(Account(name=name, email=email, role=role, token_hash=hash_token(token),
                  pseudonym=pseudonym(secret, name), created_at=now))
    return token


def add_account(s: Session, name: str, role: str, secret: bytes, *, email: str = "", now: float) -> str:
    """Create account ``name`` with a fresh token and return the token (shown once; only
    its hash is stored). Raises Rejected(409) when the name exists, ValueError for a role
    not in ``ROLES``."""
    token = _new_account(s, name, role, secret, email=email, now=now)
    s.commit()
    return token


def reissue_token(s: Session, name: str) -> str:
    """A new token for account ``name`` (the old one stops working at once); returned
    once, only its hash is stored. Raises Rejected(404) for no such account."""
    account = s.scalar(select(Account).where(Account.name == name))
    if account is None:
        raise Rejected(404, f"no account {name!r}")
    token = new_token()
    account.token_hash = hash_token(token)
    s.commit()
    return token


def import_roster(s: Session, rows: list[dict], secret: bytes, *, now: float,
                  before_commit=None) -> list[tuple[str, str | None]]:
    """Add every roster row (``name``, optional ``email``, ``role`` default student) that
    is not an account yet; return (name, token) per row, token None for names that
    existed (their tokens are unchanged: a re-import is safe). All or nothing: every row
    is checked before any account is written, and all are written in one transaction.
    ``before_commit(got)`` (writing the tokens out) runs before the commit: if it raises,
    nothing is imported. Raises ValueError naming the first bad row (line 2 is the first
    under the header)."""
    out, seen = [], set()
    for line, row in enumerate(rows, 2):
        name = (row.get("name") or row.get("student") or "").strip()
        role = (row.get("role") or "student").strip()
        where = f"row {line} ({', '.join(f'{k}={v!r}' for k, v in row.items() if k)})"
        if not name:
            raise ValueError(f"{where}: no name; nothing was imported")
        if role not in ROLES:
            raise ValueError(f"{where}: role must be one of {', '.join(ROLES)}, got {role!r}; nothing was imported")
        if name in seen:
            raise ValueError(f"{where}: {name!r} is on the roster twice; nothing was imported")
        seen.add(name)
        out.append((name, role, (row.get("email") or "").strip()))
    got = []
    try:
        for name, role, email in out:
            if s.scalar(select(Account).where(Account.name == name)):
                got.append((name, None))
            else:
                got.append((name, _new_account(s, name, role, secret, email=email, now=now)))
        if before_commit is not None:
            before_commit(got)
        s.commit()
    except BaseException:
        s.rollback()
        raise
    return got


def authenticate(s: Session, token: str | None, roles: tuple[str, ...] = ROLES) -> Account:
    """The account whose token is ``token``; Rejected(401) for no or a wrong token,
    Rejected(403) for an account whose role is not in ``roles``."""
    account = s.scalar(select(Account).where(Account.token_hash == hash_token(token))) if token else None
    if account is None and token:  # a browser session an LTI launch opened (its cookie)
        session = s.get(LtiSession, hash_token(token))
        account = s.get(Account, session.account_id) if session and session.expires_at > clock() else None
    if account is None:
        raise Rejected(401, "no valid token (labs submit --token, or LABS_TOKEN)")
    if account.role not in roles:
        raise Rejected(403, f"this needs a {' or '.join(roles)} token")
    return account


def bridge_student(s: Session, email: str) -> Account:
    """The student a Gradescope submission belongs to (the autograder forwards it with the
    course's bridge token): the roster's student account with that e-mail, the identity
    Gradescope verified. A display name is never an identity (anyone can choose one), and
    no account is made here. Raises Rejected: 422 no e-mail, 403 an e-mail not on the
    roster (staff add it with ``labs roster import``) or not a student's."""
    email = (email or "").strip()
    if not email:
        raise Rejected(422, "a forwarded submission needs the student's e-mail (Gradescope's submission metadata)")
    found = s.scalars(select(Account).where(func.lower(Account.email) == email.lower())).all()
    if len(found) > 1:
        raise Rejected(409, f"{len(found)} roster accounts share the e-mail {email[:200]!r}: staff fix the roster")
    acc = found[0] if found else None
    if acc is None:
        raise Rejected(403, f"no roster account has the e-mail {email[:200]!r}: staff add the student with "
                            f"`labs roster import` (name, email) before their Gradescope submissions are forwarded")
    if acc.role != "student":
        raise Rejected(403, f"{acc.name!r} is not a student account")
    return acc


# --- the intake -----------------------------------------------------------------------

def upload_name(filename: str, lab: Lab) -> str:
    """The name an upload is stored and unpacked under: the last part of ``filename``, or
    ``NN<archive suffix>`` when that is too long for a file name or not printable (a
    crafted name must not fail the intake, or a runner, with an OSError)."""
    name = Path(filename.replace("\\", "/")).name
    stem = archives.archive_stem(name)
    if stem is not None and (len(name.encode()) > 100 or not name.isprintable()):
        name = lab.number + name[len(stem):]
    return name


def module_of(data: bytes, filename: str, lab: Lab, max_bytes: int) -> grading.Module:
    """The lab's module inside upload ``data`` (an archive named ``filename``), taken as
    ``labs grade-all`` takes one (``grading.take``: the archive checks, the one rule that
    finds the module, no links). Raises Rejected(422) saying what is wrong."""
    if archives.archive_stem(filename) is None:
        raise Rejected(422, f"{filename!r} is not an archive ({', '.join(archives.ARCHIVES)}); "
                            f"`labs submit {lab.number}` packs {LabPaths.of(lab).stub}")
    with tempfile.TemporaryDirectory(prefix="labs-intake-") as tmp:
        archive = Path(tmp) / Path(filename).name
        archive.write_bytes(data)
        try:
            return grading.take(archive, lab, Path(tmp), max_bytes)
        except (archives.UnpackError, _impl.ImplError) as e:
            raise Rejected(422, f"{filename}: {str(e).replace(tmp, '<upload>')}") from None


def late_days(lab: Lab, course: Course, now: float, extra_days: float = 0.0) -> int:
    """0 when ``now`` is on time for ``lab`` (no deadline, or within the grace and the
    student's ``extra_days`` of extension); else the started days after it. Raises
    Rejected(403) past ``late.max_days``."""
    late = course.submissions.late
    over = latedays.over_s(course, lab, now, extra_days)
    if over <= 0:
        return 0
    if over > late.max_days * DAY_S:
        raise Rejected(403, f"lab {lab.number} closed at {lab.deadline.isoformat()}"
                            + (f" (late submissions accepted for {late.max_days:g} days)" if late.max_days else ""))
    return math.ceil(over / DAY_S)


def _take_token(s: Session, account: Account, lab: Lab, course: Course, now: float) -> None:
    """Spend one token of the student's bucket for ``lab``; Rejected(429) with the seconds
    until the next token when it is empty. Staff are not limited."""
    if account.role == "staff":
        return
    rate = course.submissions.rate
    bucket = s.get(Bucket, (account.id, lab.number))
    if bucket is None:
        bucket = Bucket(account_id=account.id, lab=lab.number, tokens=float(rate.burst), updated_at=now)
        s.add(bucket)
    per_s = rate.per_hour / 3600.0
    bucket.tokens = min(float(rate.burst), bucket.tokens + max(0.0, now - bucket.updated_at) * per_s)
    bucket.updated_at = now
    if bucket.tokens < 1.0:
        wait = (1.0 - bucket.tokens) / per_s
        s.commit()
        raise Rejected(429, f"rate limit: {rate.burst} submissions of lab {lab.number} at once, then "
                            f"{rate.per_hour:g} per hour; try again in {math.ceil(wait)} s", retry_after=wait)
    bucket.tokens -= 1.0


def grant(s: Session, account: Account, lab: str, tokens: float, now: float) -> float:
    """Staff override: add ``tokens`` to a student's bucket for ``lab``; returns the new level."""
    bucket = s.get(Bucket, (account.id, lab)) or Bucket(account_id=account.id, lab=lab, tokens=0.0, updated_at=now)
    bucket.tokens += tokens
    s.add(bucket)
    s.commit()
    return bucket.tokens


@dataclass
class Accepted:
    submission: Submission
    job: Job
    duplicate: bool  # the same module was already submitted and not given up: nothing new queued


def submit(s: Session, course: Course, account: Account, lab_number: str, filename: str, data: bytes,
           now: float) -> Accepted:
    """Check one upload and store the module it holds (``module_of``: the bytes the runners
    grade), then queue its job (stored before queued: the caller publishes ``job.id`` to
    a broker only after this returns). The same module again is
    not stored twice (``duplicate``); a new one cancels the student's older queued job
    of this lab. Raises Rejected: 404 no such lab, 413 too large, 403 closed, 422 not an
    archive holding the module, 429 rate-limited."""
    try:
        lab = course.lab(lab_number)
    except LabsError:
        raise Rejected(404, f"no lab {lab_number!r}") from None
    cap = course.submissions.max_kb << 10
    if len(data) > cap:
        raise Rejected(413, f"upload is {len(data)} bytes, the limit is {cap} (submissions.max_kb)")
    days = late_days(lab, course, now, latedays.extension(s, account.id, lab.number))
    filename = upload_name(filename, lab)
    module = module_of(data, filename, lab, max_bytes=8 * cap)
    fp = module.fingerprint
    same = s.scalars(select(Submission).where(Submission.account_id == account.id, Submission.lab == lab.number,
                                              Submission.fingerprint == fp)).all()
    for sub in same:
        job = sub.jobs[-1]
        if job.state in ("queued", "running", "done"):
            return Accepted(sub, job, duplicate=True)
    _take_token(s, account, lab, course, now)
    s.execute(update(Job).where(Job.state == "queued", Job.queue == "interactive",
                                Job.submission_id.in_(select(Submission.id).where(
                                    Submission.account_id == account.id, Submission.lab == lab.number)))
              .values(state="cancelled", finished_at=now, error="a newer submission replaced it"))
    sub = Submission(id=secrets.token_hex(16), account_id=account.id, lab=lab.number, filename=filename,
                     blob=module.data, size=len(data), fingerprint=fp, created_at=now, late_days=days)
    job = Job(submission=sub, queue="interactive", state="queued", created_at=now)
    s.add_all([sub, job])
    s.commit()
    return Accepted(sub, job, duplicate=False)


def regrade(s: Session, lab: str, now: float, *, student: str | None = None,
            reason: str = "regrade after a grader change") -> list[int]:
    """Queue a regrade (the ``regrade`` queue, behind every interactive job) of each
    student's newest submission of ``lab`` (or of ``student``'s only): after a grader
    change; ``reason`` is kept with each new job (the old results stay). Returns the new job ids."""
    q = select(Submission).where(Submission.lab == lab)
    if student:
        q = q.join(Account).where(Account.name == student)
    newest: dict[int, Submission] = {}
    for sub in s.scalars(q.order_by(Submission.created_at)):
        newest[sub.account_id] = sub
    jobs = [Job(submission=sub, queue="regrade", state="queued", created_at=now, reason=reason)
            for sub in newest.values()]
    s.add_all(jobs)
    s.commit()
    return [j.id for j in jobs]


# --- the queue: claim, renew, complete, fail, reap ---------------------------------------

def claim(s: Session, owner: str, now: float, *, job_id: int | None = None, lease_s: float = LEASE_S,
          queues: tuple[str, ...] = QUEUES) -> Job | None:
    """Take a queued job for ``owner`` under a lease until ``now + lease_s``: job ``job_id``
    (a broker delivered it), else the oldest interactive job, then the oldest regrade.
    None when there is none (or ``job_id`` is not queued: done, cancelled, or held by a
    live lease elsewhere). Atomic: a conditional UPDATE, so two runners never both win."""
    while True:
        if job_id is not None:
            candidate = job_id
        else:
            order = [Job.queue != q for q in queues]  # interactive first
            candidate = s.scalar(select(Job.id).where(Job.state == "queued", Job.queue.in_(queues))
                                 .order_by(*order, Job.created_at, Job.id).limit(1))
            if candidate is None:
                return None
        won = s.execute(update(Job).where(Job.id == candidate, Job.state == "queued")
                        .values(state="running", lease_owner=owner, lease_expires=now + lease_s,
                                started_at=now)).rowcount
        s.commit()
        if won:
            return s.get(Job, candidate, populate_existing=True)
        if job_id is not None:
            return None


def renew(s: Session, job_id: int, owner: str, now: float, lease_s: float = LEASE_S) -> bool:
    """Extend ``owner``'s lease on a running job; False when it is no longer ``owner``'s
    (expired and reaped, or finished): the runner should stop and drop its result."""
    n = s.execute(update(Job).where(Job.id == job_id, Job.state == "running", Job.lease_owner == owner)
                  .values(lease_expires=now + lease_s)).rowcount
    s.commit()
    return bool(n)


@dataclass
class Outcome:
    """What a runner hands back for a job it graded: the typed record (``grading.grade_one``)
    and where it was graded (``runner.doctor``); the runner API's body, as JSON."""
    record: Graded
    host: dict = field(default_factory=dict)
    gpu_model: str = "cpu"

    def to_json(self) -> dict:
        return {"record": self.record.to_json(), "host": self.host, "gpu_model": self.gpu_model}


def late_factor(course: Course, sub: Submission) -> float:
    """What a late submission's score is multiplied by (1.0 on time, covered by the
    late-day budget, or without a penalty): ``latedays.factor``."""
    return latedays.factor(course, sub)


def complete(s: Session, job_id: int, owner: str, outcome: Outcome, now: float, course: Course) -> bool:
    """Store the record of a job ``owner`` graded and mark the job done; the score is
    the record's times ``late_factor``. Only the lease holder of a running job may
    complete it: a result from any other runner (one that never claimed the job, or whose
    lease was reaped and the job queued or given to another) is dropped (False), as is a
    second result for the job."""
    job = s.get(Job, job_id)
    if job is None or job.state != "running" or job.lease_owner != owner or job.result is not None:
        return False
    graded, sub = outcome.record, job.submission
    link = s.scalar(select(LtiLink).where(LtiLink.account_id == sub.account_id, LtiLink.lab == sub.lab))
    score = round((graded.score or 0.0) * late_factor(course, sub), 4)
    result = Result(job_id=job.id, submission_id=sub.id, score=score, max_score=graded.max_score,
                    max_runnable=graded.max_score_runnable or 0.0, status=graded.status, kind=graded.kind.value,
                    perf_ratio=graded.perf_ratio(), gpu_model=outcome.gpu_model or "cpu",
                    host=json.dumps(outcome.host), data=json.dumps(graded.to_json()),
                    duration_s=float(graded.duration_s), graded_at=now, runner=owner)
    s.add(result)
    job.state, job.finished_at, job.lease_owner, job.lease_expires = "done", now, None, None
    if link is not None:  # a student launched from an LMS: the grade goes to its line item (``lti.send_pending``)
        s.add(LtiPost(result=result, link_id=link.id, created_at=now, next_try=now))
    try:
        s.commit()
    except IntegrityError:  # another delivery of this job stored its result first
        s.rollback()
        return False
    return True


def fail(s: Session, job_id: int, owner: str, reason: str, now: float) -> str:
    """An infrastructure failure of ``owner``'s attempt (never the submission's fault):
    the job goes back to the queue, or to ``failed`` after ``MAX_ATTEMPTS``. Returns the
    job's new state."""
    job = s.get(Job, job_id)
    if job is None or job.state != "running" or job.lease_owner != owner:
        return job.state if job else "missing"
    job.attempts += 1
    job.error = reason[:2000]
    job.state = "failed" if job.attempts >= MAX_ATTEMPTS else "queued"
    job.lease_owner = job.lease_expires = None
    if job.state == "failed":
        job.finished_at = now
    s.commit()
    return job.state


def reap(s: Session, now: float) -> list[int]:
    """Put every running job whose lease expired back in the queue (its runner died or
    hung), counting one infrastructure attempt; returns their ids."""
    expired = s.execute(select(Job.id, Job.lease_owner).where(Job.state == "running", Job.lease_expires < now)).all()
    back = []
    for job_id, owner in expired:
        # one conditional UPDATE: a job another reaper took back, or a runner claimed again
        # since, is left alone (each expiry counts once and is republished once)
        last = Job.attempts + 1 >= MAX_ATTEMPTS
        won = s.execute(update(Job).where(Job.id == job_id, Job.state == "running", Job.lease_owner == owner,
                                          Job.lease_expires < now)
                        .values(attempts=Job.attempts + 1, error=f"the runner {owner} stopped renewing its lease",
                                state=case((last, "failed"), else_="queued"),
                                finished_at=case((last, now), else_=Job.finished_at),
                                lease_owner=None, lease_expires=None)).rowcount
        s.commit()
        if won and s.get(Job, job_id, populate_existing=True).state == "queued":
            back.append(job_id)
    return back


# --- what students and staff read --------------------------------------------------------

def position(s: Session, job: Job) -> int | None:
    """1 for the next job to be claimed; None when ``job`` is not queued."""
    if job.state != "queued":
        return None
    earlier = list(QUEUES[:QUEUES.index(job.queue)])  # claim's order: interactive, then regrade
    ahead = s.scalar(select(func.count(Job.id)).where(
        Job.state == "queued",
        Job.queue.in_(earlier) | ((Job.queue == job.queue) & (Job.created_at < job.created_at))
        | ((Job.queue == job.queue) & (Job.created_at == job.created_at) & (Job.id < job.id))))
    return int(ahead) + 1


def eta_s(s: Session, job: Job, now: float) -> float | None:
    """Seconds until ``job`` is graded, from the median grading time of the last 20
    results and the runners busy now (at least 1)."""
    recent = s.scalars(select(Result.duration_s).order_by(Result.id.desc()).limit(20)).all()
    per = statistics.median(recent) if recent else 60.0
    if job.state == "running":
        return max(0.0, per - (now - (job.started_at or now)))
    pos = position(s, job)
    if pos is None:
        return None
    runners = s.scalar(select(func.count(func.distinct(Job.lease_owner))).where(Job.state == "running")) or 1
    return per * math.ceil(pos / runners)


def hidden_visible(course: Course, lab: Lab, account: Account, now: float) -> bool:
    """Whether ``account`` sees each hidden test's name and message (``hidden_results``)."""
    policy = course.submissions.hidden_results
    if account.role == "staff" or policy == "always":
        return True
    if policy == "never":
        return False
    return lab.deadline is not None and now >= lab.deadline.timestamp()


def policy_line(course: Course, lab: Lab, account: Account, now: float) -> str:
    """The course's policy on hidden tests' names and messages, for ``account``, in one line."""
    policy = course.submissions.hidden_results
    if account.role == "staff":
        return "staff see every test's name and message"
    if policy == "always":
        return "every test's name and message is shown (hidden_results: always)"
    if policy == "never":
        return "hidden tests' names and messages are never shown in this course (hidden_results: never); " \
               "the score and part subtotals are"
    if lab.deadline is None:
        return (f"hidden tests' names and messages are shown after lab {lab.number}'s deadline, and it has none set "
                f"yet (hidden_results: after_deadline); the score and part subtotals are shown now")
    when = lab.deadline.isoformat()
    if now >= lab.deadline.timestamp():
        return f"hidden tests' names and messages are shown: lab {lab.number}'s deadline ({when}) has passed"
    return f"hidden tests' names and messages are shown after lab {lab.number}'s deadline, {when}"


def results_json(course: Course, result: Result) -> dict:
    """Gradescope's ``results.json`` of a stored result (an export of its record: what
    the Gradescope bridge hands back), with the score stored: after the late penalty
    (``raw_score``, the charged ``late_days``, ``late_factor`` say so), computed now: an
    extension or the late-day budget granted later counts."""
    sub = result.job.submission
    res = Graded.from_json(json.loads(result.data)).to_gradescope(student=sub.account.name,
                                                                  fingerprint=sub.fingerprint)
    factor = late_factor(course, sub) if res["score"] is not None else 1.0
    if factor != 1.0:
        res["extra_data"].update(raw_score=res["score"], late_days=latedays.charged(course, sub), late_factor=factor)
        res["score"] = round(res["score"] * factor, 4)
    return res


def result_view(course: Course, result: Result, show_tests: bool) -> dict:
    """A stored result as a student or staff member reads it: score, parts, status,
    and the per-test table when ``show_tests``."""
    data = results_json(course, result)
    view = {"score": data["score"], "max_score": result.max_score, "max_score_runnable": result.max_runnable,
            "status": result.status, "kind": result.kind, "gpu_model": result.gpu_model,
            "perf_ratio": result.perf_ratio, "graded_at": result.graded_at, "duration_s": result.duration_s,
            "parts": records.part_scores(data), "output": data.get("output", ""),
            "late_days": data.get("extra_data", {}).get("late_days", 0),
            # GPU tests a CPU-only runner could not run: not a 0, "not run yet" (a GPU runner grades them)
            "not_run_points": round(sum((t.get("extra_data") or {}).get("not_run_points", 0.0)
                                        for t in data.get("tests", [])), 4)}
    if show_tests:
        view["tests"] = [{**{k: t.get(k) for k in ("name", "score", "max_score", "status", "output")},
                          **{k: v for k, v in (t.get("extra_data") or {}).items() if k.startswith("not_run")},
                          "status": t.get("status") or (t.get("extra_data") or {}).get("status")}
                         for t in data.get("tests", [])]  # not_run: this hardware could not run it, and why
    return view


def submission_view(s: Session, course: Course, sub: Submission, viewer: Account, now: float) -> dict:
    job = sub.jobs[-1]
    done = [j for j in sub.jobs if j.result is not None]
    lab = course.lab(sub.lab)
    view = {"id": sub.id, "lab": sub.lab, "student": sub.account.name, "filename": sub.filename,
            "submitted_at": sub.created_at, "late_days": sub.late_days, "state": job.state, "queue": job.queue,
            "position": position(s, job), "eta_s": eta_s(s, job, now), "attempts": job.attempts,
            "error": job.error if job.state == "failed" else ""}
    if done:
        view["result"] = result_view(course, done[-1].result, hidden_visible(course, lab, viewer, now))
        view["policy"] = policy_line(course, lab, viewer, now)
    if course.late_days.budget:
        view["late_budget"] = latedays.standing(s, course, sub.account).as_dict()
    return view


def lab_submissions(s: Session, course: Course, lab: str, viewer: Account, now: float) -> list[dict]:
    """Staff: each student's newest submission of ``lab`` (graded or not), sorted by name."""
    newest: dict[int, Submission] = {}
    for sub in s.scalars(select(Submission).where(Submission.lab == lab).order_by(Submission.created_at)):
        newest[sub.account_id] = sub
    views = [submission_view(s, course, sub, viewer, now) for sub in newest.values()]
    return sorted(views, key=lambda v: v["student"])


def leaderboard(s: Session, lab: str, gpu_model: str | None = None, *, staff: bool = False) -> list[dict]:
    """One row per student: the best (lowest median perf ratio) valid run of ``lab`` on
    ``gpu_model`` (every model when None), ranked. Runs staff marked invalid are left
    out, or listed with their reason for ``staff``; never deleted."""
    q = (select(Result, Submission, Account).join(Submission, Result.submission_id == Submission.id)
         .join(Account, Submission.account_id == Account.id)
         .where(Submission.lab == lab, Result.perf_ratio.is_not(None)))
    if gpu_model:
        q = q.where(Result.gpu_model == gpu_model)
    best: dict[tuple[int, str], tuple[Result, Submission, Account]] = {}
    hidden = []
    for res, sub, acc in s.execute(q):
        if res.invalid_reason:
            hidden.append((res, sub, acc))
            continue
        key = (acc.id, res.gpu_model)
        if key not in best or res.perf_ratio < best[key][0].perf_ratio:
            best[key] = (res, sub, acc)
    rows = sorted(best.values(), key=lambda t: (t[0].gpu_model, t[0].perf_ratio, t[0].graded_at))
    ranks: dict[str, int] = {}  # ranked within each GPU model: timings compare only on one model
    out = []
    for res, sub, acc in rows:
        ranks[res.gpu_model] = ranks.get(res.gpu_model, 0) + 1
        out.append({"rank": ranks[res.gpu_model], "name": acc.pseudonym, "student": acc.name if staff else None,
                    "gpu_model": res.gpu_model, "perf_ratio": res.perf_ratio, "score": res.score,
                    "result_id": res.id, "submission": sub.id, "graded_at": res.graded_at, "invalid": None})
    if staff:
        out += [{"rank": None, "name": acc.pseudonym, "student": acc.name, "gpu_model": res.gpu_model,
                 "perf_ratio": res.perf_ratio, "score": res.score, "result_id": res.id, "submission": sub.id,
                 "graded_at": res.graded_at, "invalid": res.invalid_reason} for res, sub, acc in hidden]
    return out


def mark_invalid(s: Session, result_id: int, reason: str) -> None:
    """Staff: hide a run from the leaderboard with ``reason`` (kept, shown to staff)."""
    res = s.get(Result, result_id)
    if res is None:
        raise Rejected(404, f"no result {result_id}")
    if not reason.strip():
        raise Rejected(422, "a reason is required to mark a run invalid")
    res.invalid_reason = reason.strip()
    s.commit()


def overview(s: Session, course: Course, now: float) -> list[dict]:
    """Per lab: students who submitted, submissions, graded, pass rate (full runnable
    marks), median score, queued and running jobs."""
    rows = []
    for number in sorted(course.labs):
        subs = s.scalars(select(Submission).where(Submission.lab == number)).all()
        results = [j.result for sub in subs for j in sub.jobs if j.result is not None]
        scores = [r.score for r in results]
        queued = s.scalar(select(func.count(Job.id)).join(Submission).where(Submission.lab == number,
                                                                             Job.state == "queued"))
        running = s.scalar(select(func.count(Job.id)).join(Submission).where(Submission.lab == number,
                                                                              Job.state == "running"))
        rows.append({"lab": number, "title": course.labs[number].title,
                     "students": len({sub.account_id for sub in subs}), "submissions": len(subs),
                     "graded": len(results),
                     "pass_rate": (sum(r.score >= r.max_runnable - 1e-9 and r.max_runnable > 0 for r in results)
                                   / len(results)) if results else None,
                     "median_score": statistics.median(scores) if scores else None,
                     "queued": queued, "running": running})
    return rows


def runner_health(s: Session, now: float) -> list[dict]:
    """Each runner seen in the last hour: its last result, jobs held now, GPU model."""
    since = now - 3600
    out = {}
    for res in s.scalars(select(Result).where(Result.graded_at >= since).order_by(Result.graded_at)):
        out[res.runner] = {"runner": res.runner, "gpu_model": res.gpu_model, "last_result_at": res.graded_at,
                           "holding": 0}
    for job in s.scalars(select(Job).where(Job.state == "running")):
        row = out.setdefault(job.lease_owner, {"runner": job.lease_owner, "gpu_model": "", "last_result_at": None,
                                               "holding": 0})
        row["holding"] += 1
        row["lease_expires_in_s"] = round((job.lease_expires or now) - now, 1)
    return list(out.values())


def utc(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock() -> float:
    return time.time()


def newest_results(s: Session, lab: str) -> list[tuple[str, Result, Submission]]:
    """(student, result, submission) of each student's newest graded submission of
    ``lab``, sorted by name: what the CSV export and the nbgrader gradebook push record."""
    newest: dict[str, tuple[Result, Submission]] = {}
    q = (select(Result, Submission, Account).join(Submission, Result.submission_id == Submission.id)
         .join(Account, Submission.account_id == Account.id).where(Submission.lab == lab)
         .order_by(Submission.created_at, Result.graded_at))
    for res, sub, acc in s.execute(q):
        newest[acc.name] = (res, sub)
    return [(name, *newest[name]) for name in sorted(newest)]
