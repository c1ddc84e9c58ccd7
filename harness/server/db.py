"""The course database: the record of every account, submission, grading job and result.

SQLAlchemy 2 models; the schema is made and upgraded by Alembic (``migrations/``), never
by ``create_all``, so a running course upgrades in place. SQLite by default (one file,
``.labs-staff/server.db``), PostgreSQL by URL (``postgresql+psycopg://...``).

Times are seconds since the epoch (floats): leases compare them, pages format them.
A queue (Celery's broker) only carries job ids: what a job is, who holds it and until
when, and its result are rows here. ``Result.job_id`` is unique, so a job delivered
twice stores one result (the second insert fails and is dropped).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from sqlalchemy import (Float, ForeignKey, Integer, LargeBinary, String, Text, UniqueConstraint, create_engine,
                        event)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, sessionmaker

MIGRATIONS = Path(__file__).with_name("migrations")
ROLES = ("student", "staff", "runner", "bridge")  # bridge: the Gradescope autograder forwarding a student's upload
JOB_STATES = ("queued", "running", "done", "failed", "cancelled")  # failed: infrastructure, attempts used up
QUEUES = ("interactive", "regrade")  # regrades never delay a student's submission


class Base(DeclarativeBase):
    pass


class Account(Base):
    """A student, a staff member or a runner host; ``token_hash`` is sha256 of its token
    (tokens are 32 random bytes, so a fast hash is enough; the token itself is shown once)."""

    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    email: Mapped[str] = mapped_column(String(320), default="")
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    pseudonym: Mapped[str] = mapped_column(String(64), default="")  # the leaderboard's name for a student
    created_at: Mapped[float] = mapped_column(Float)


class Submission(Base):
    """One upload: the lab's module the intake validated (``blob``; ``filename`` and
    ``size`` are the upload's), stored before any job is queued."""

    __tablename__ = "submissions"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    lab: Mapped[str] = mapped_column(String(2), index=True)
    filename: Mapped[str] = mapped_column(String(255))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    size: Mapped[int] = mapped_column(Integer)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)  # sha256 of the lab's module
    created_at: Mapped[float] = mapped_column(Float)
    late_days: Mapped[int] = mapped_column(Integer, default=0)  # started days after the deadline (0: on time)
    account: Mapped[Account] = relationship()
    jobs: Mapped[list["Job"]] = relationship(back_populates="submission", order_by="Job.id")


class Job(Base):
    """One grading of a submission: queued, then held by one runner under a lease it
    renews; a lease that expires (a killed runner) puts the job back in the queue.
    ``attempts`` counts infrastructure failures only: a student's timeout, crash or wrong
    answer is a result, final."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(primary_key=True)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    queue: Mapped[str] = mapped_column(String(16), default="interactive")
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str] = mapped_column(Text, default="")  # why the last attempt failed (infrastructure)
    reason: Mapped[str] = mapped_column(Text, default="")  # why this run: "" for the submission's own, else a regrade's
    submission: Mapped[Submission] = relationship(back_populates="jobs")
    result: Mapped["Result | None"] = relationship(back_populates="job", uselist=False)


class Result(Base):
    """The graded result of one job, unique per job: the typed record in ``data``
    (``records.Graded.to_json()``; results.json is its export), the score after the
    late penalty and the figures the pages sort by in columns."""

    __tablename__ = "results"
    __table_args__ = (UniqueConstraint("job_id", name="one_result_per_job"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    score: Mapped[float] = mapped_column(Float)
    max_score: Mapped[float] = mapped_column(Float)
    max_runnable: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16))  # ok, student_error, timeout (records.Status)
    perf_ratio: Mapped[float | None] = mapped_column(Float, nullable=True)  # median of the run's perf ratios
    gpu_model: Mapped[str] = mapped_column(String(200), default="cpu")
    host: Mapped[str] = mapped_column(Text, default="{}")  # `labs runner doctor` of the grading host, JSON
    data: Mapped[str] = mapped_column(Text)  # records.Graded, JSON
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    graded_at: Mapped[float] = mapped_column(Float)
    runner: Mapped[str] = mapped_column(String(200), default="")
    invalid_reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # staff: hidden from the leaderboard
    job: Mapped[Job] = relationship(back_populates="result")


class Extension(Base):
    """Staff moved one student's deadline of one lab by ``days`` (``labs extend``); a
    newer one for the same student and lab replaces the figure, the old rows are kept."""

    __tablename__ = "extensions"
    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    lab: Mapped[str] = mapped_column(String(2))
    days: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)


REQUEST_STATES = ("open", "answered", "regraded")


class RegradeRequest(Base):
    """A student's request to look at a submission again, and the staff's answer; a
    regrade it leads to is a new job (``Job.reason`` names the request), never an
    overwritten result."""

    __tablename__ = "regrade_requests"
    id: Mapped[int] = mapped_column(primary_key=True)
    submission_id: Mapped[str] = mapped_column(ForeignKey("submissions.id"), index=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    reason: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="open", index=True)
    answer: Mapped[str] = mapped_column(Text, default="")
    answered_by: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)
    answered_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), nullable=True)  # the regrade it queued
    submission: Mapped[Submission] = relationship()


class Trial(Base):
    """A trial run (``labs submit NN --trial``): the lab's visible and performance tests on
    the grading hardware, never the hidden graders, never a submission (nothing that
    counts reads this table). Run only when no submission waits; ``result`` is the JSON
    of what ran (``trialrun.run``)."""

    __tablename__ = "trials"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    lab: Mapped[str] = mapped_column(String(2))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # queued, running, done, failed
    owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    result: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str] = mapped_column(Text, default="")
    account: Mapped[Account] = relationship()


class LtiUser(Base):
    """An LTI 1.3 user (``sub`` on the platform ``issuer``) and the course account it
    launches as (``lti``): found again at each launch, one account per platform user."""

    __tablename__ = "lti_users"
    __table_args__ = (UniqueConstraint("issuer", "sub", name="one_account_per_lti_user"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    issuer: Mapped[str] = mapped_column(String(500))
    sub: Mapped[str] = mapped_column(String(255))
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    account: Mapped[Account] = relationship()


class LtiSession(Base):
    """A browser session an LTI launch opened: the login cookie carries its token (sha256
    here), so a launch never replaces the account's own token (``labs submit`` keeps it)."""

    __tablename__ = "lti_sessions"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)


class LtiLink(Base):
    """Where a student's grade of one lab goes: the newest launch's platform, client,
    deployment and its Assignment and Grade Services claim (``ags``, JSON: the line item
    and the scopes)."""

    __tablename__ = "lti_links"
    __table_args__ = (UniqueConstraint("account_id", "lab", name="one_line_item_per_student_lab"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    lab: Mapped[str] = mapped_column(String(2))
    issuer: Mapped[str] = mapped_column(String(500))
    client_id: Mapped[str] = mapped_column(String(255))
    deployment_id: Mapped[str] = mapped_column(String(255))
    sub: Mapped[str] = mapped_column(String(255))
    ags: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Float)
    account: Mapped[Account] = relationship()


class LtiPost(Base):
    """One grade to post to a platform's line item (AGS), made when a result of a
    launched student is stored; ``pending`` until the platform took it (then ``sent``,
    with the score it took), retried after each failure (``error``, ``attempts``,
    ``next_try``): a grade is never dropped."""

    __tablename__ = "lti_posts"
    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id"), index=True)
    link_id: Mapped[int] = mapped_column(ForeignKey("lti_links.id"), index=True)
    state: Mapped[str] = mapped_column(String(16), default="pending", index=True)  # pending, sent
    score: Mapped[float | None] = mapped_column(Float, nullable=True)  # what was posted
    max_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    next_try: Mapped[float] = mapped_column(Float, default=0.0)
    sent_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    link: Mapped[LtiLink] = relationship()
    result: Mapped[Result] = relationship()


class LtiState(Base):
    """The LTI tool's short-lived launch state (pylti1p3's launch data storage): the
    OIDC state and nonce between login and launch, the nonces used (a replayed launch is
    refused), the launches for deep linking; JSON values, dropped when expired."""

    __tablename__ = "lti_state"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[str] = mapped_column(Text)
    expires_at: Mapped[float] = mapped_column(Float)


class Bucket(Base):
    """A student's token bucket for one lab (the intake's rate limit)."""

    __tablename__ = "buckets"
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    lab: Mapped[str] = mapped_column(String(2), primary_key=True)
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def default_url(course_root: Path) -> str:
    """SQLite in the course's staff folder (git-ignored, never released)."""
    folder = Path(course_root) / ".labs-staff"
    folder.mkdir(mode=0o700, exist_ok=True)
    return f"sqlite:///{folder / 'server.db'}"


def engine_for(url: str) -> Engine:
    """An engine for ``url``; for SQLite, WAL and a busy timeout so the server and its
    dispatcher processes write the one file concurrently without 'database is locked'."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _pragmas(conn, _record):
            cur = conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def upgrade(url: str, course=None) -> None:
    """Create or upgrade the schema at ``url`` to the newest Alembic revision. ``course``
    (a ``manifest.Course``): what a revision that converts stored rows reads (0002: the
    labs' module names)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["course"] = course
    command.upgrade(cfg, "head")


def sessions(url: str, course=None) -> sessionmaker:
    """A session factory for ``url`` (the schema upgraded first; see ``upgrade``)."""
    upgrade(url, course)
    return sessionmaker(engine_for(url), expire_on_commit=False)
