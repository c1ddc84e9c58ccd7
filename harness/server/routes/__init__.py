"""The course server's routes, one module per resource (the FastAPI template's ``api/routes``):
``submissions`` (students: upload, read their own, the leaderboard), ``runner`` (runner
hosts: claim, renew, complete, fail), ``bridge`` (the Gradescope autograder), ``staff``
(overview, grades, regrades, invalid runs), ``lti`` (LTI 1.3 login, launch, deep linking, JWKS)
and ``pages`` (the server-rendered pages).
``ROUTERS`` is the list ``create_app`` includes, in that order."""
from __future__ import annotations

from . import bridge, lti, pages, runner, staff, submissions, trials

ROUTERS = [submissions.router, trials.router, runner.router, runner.trial_router, bridge.router, staff.router, lti.router, pages.router]
