"""The server-rendered pages (``server/pages.py`` renders them): sign in, a student's
submissions, one submission, the staff overview, the leaderboard. No static files: no
route serves anything on disk."""
from __future__ import annotations

from fastapi import APIRouter, Form
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select

from .. import latedays, pages, regrades, service, similarity, trials
from ..db import Submission
from ..deps import COOKIE, CourseDep, Now, ServerDep, SessionDep, Staff, Student, own
from ..service import Rejected

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def home():
    return RedirectResponse("/me", 303)


@router.get("/login", response_class=HTMLResponse)
def login_form(course: CourseDep):
    return pages.login(course)


@router.post("/login")
def login(course: CourseDep, s: SessionDep, token: str = Form(...)):
    """Check the token, set it as the login cookie, go to the caller's page; a wrong
    token gets the form again with the error (401)."""
    token = token.strip()
    try:
        who = service.authenticate(s, token, ("student", "staff"))
    except Rejected as e:
        error = "That token is not valid: paste the whole token from your roster e-mail" if e.status == 401 \
            else "This token is not a student's or staff member's: sign in with your own"
        return HTMLResponse(pages.login(course, error=error), e.status)
    resp = RedirectResponse("/staff" if who.role == "staff" else "/me", 303)
    resp.set_cookie(COOKIE, token, httponly=True, samesite="strict")
    return resp


@router.get("/me", response_class=HTMLResponse)
def me(course: CourseDep, s: SessionDep, who: Student, now: Now):
    subs = s.scalars(select(Submission).where(Submission.account_id == who.id)
                     .order_by(Submission.created_at.desc())).all()
    late = latedays.standing(s, course, who).as_dict() if course.late_days.budget else None
    return pages.student(course, who, [service.submission_view(s, course, x, who, now) for x in subs], late,
                         [trials.view(s, course, t) for t in trials.of(s, who)])


@router.get("/submissions/{sub_id}", response_class=HTMLResponse)
def submission_page(sub_id: str, course: CourseDep, s: SessionDep, who: Student, now: Now):
    return pages.submission(course, regrades.full_view(s, course, own(s, who, sub_id), who, now),
                            staff=who.role == "staff", own=own(s, who, sub_id).account_id == who.id)


@router.post("/submissions/{sub_id}/regrade-request")
def ask_regrade_form(sub_id: str, s: SessionDep, who: Student, now: Now, reason: str = Form("")):
    """The submission page's form: ask for a regrade, back to the page."""
    sub = own(s, who, sub_id)
    if sub.account_id != who.id:
        raise Rejected(403, "only the student who submitted it can ask for a regrade")
    regrades.ask(s, sub, who, reason, now)
    return RedirectResponse(f"/submissions/{sub.id}", 303)


@router.get("/staff/regrades", response_class=HTMLResponse)
def staff_regrades_page(course: CourseDep, s: SessionDep, _: Staff):
    """Staff: the regrade requests, open first, each with its answer form."""
    return pages.staff_regrades(course, regrades.queue(s, everything=True))


@router.post("/staff/regrade-requests/{req_id}")
def answer_form(req_id: int, srv: ServerDep, s: SessionDep, who: Staff, now: Now, answer: str = Form(""),
                regrade: str | None = Form(None)):
    """The staff page's form: answer (and regrade when ticked), back to the queue."""
    req = regrades.answer(s, req_id, who.name, answer, regrade is not None, now)
    if req.job_id is not None:
        srv.publish_job(s, req.job_id)
    return RedirectResponse("/staff/regrades", 303)


@router.get("/staff", response_class=HTMLResponse)
def staff_page(course: CourseDep, s: SessionDep, _: Staff, now: Now):
    return pages.staff(course, service.overview(s, course, now), service.runner_health(s, now))


@router.get("/staff/labs/{lab}", response_class=HTMLResponse)
def staff_lab_page(lab: str, course: CourseDep, s: SessionDep, who: Staff, now: Now):
    """Staff: each student's newest submission of ``lab``, with its state and result."""
    if lab not in course.labs:
        raise Rejected(404, f"no lab {lab!r}")
    return pages.staff_lab(course, course.labs[lab], service.lab_submissions(s, course, lab, who, now))


@router.get("/staff/labs/{lab}/similarity", response_class=HTMLResponse)
def similarity_page(lab: str, course: CourseDep, s: SessionDep, _: Staff, threshold: float | None = None):
    """Staff: the similarity report over each student's newest submission of ``lab``."""
    if lab not in course.labs:
        raise Rejected(404, f"no lab {lab!r}")
    threshold = similarity.THRESHOLD if threshold is None else threshold
    if not 0 < threshold <= 1:
        raise Rejected(422, f"threshold {threshold!r} is not a share of matched code in (0, 1]")
    return pages.similarity(course, similarity.compare(similarity.newest_modules(s, lab), similarity.boilerplate(
        course, course.labs[lab]), course.labs[lab], threshold=threshold))


@router.get("/leaderboard/{lab}", response_class=HTMLResponse)
def leaderboard_page(lab: str, course: CourseDep, s: SessionDep, who: Student, gpu: str | None = None):
    if lab not in course.labs:
        raise Rejected(404, f"no lab {lab!r}")
    return pages.leaderboard(course, course.labs[lab], service.leaderboard(s, lab, gpu, staff=who.role == "staff"),
                             staff=who.role == "staff")


@router.post("/staff/results/{result_id}/invalid")
def invalid_form(result_id: int, s: SessionDep, _: Staff, reason: str = Form(...), lab: str = Form(...)):
    service.mark_invalid(s, result_id, reason)
    return RedirectResponse(f"/leaderboard/{lab}", 303)
