"""LTI 1.3 routes (``server/lti.py`` does the work): the OIDC login initiation
(``/lti/login``, GET or POST), the launch (``/lti/launch``: a lab's page, or for a deep
linking request the staff's pick of a lab) and the tool's public key set
(``/.well-known/jwks.json``). A launch that fails its checks (signature, audience,
deployment, state, a nonce seen before) gets a page saying why (401)."""
from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.concurrency import run_in_threadpool

from .. import lti, pages
from ..deps import COOKIE, Server

router = APIRouter()


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


async def _params(request: Request) -> dict:
    params = dict(request.query_params)
    if request.method == "POST":
        params.update({k: v for k, v in (await request.form()).items() if isinstance(v, str)})
    return params


@router.get(lti.JWKS_PATH)
def jwks(request: Request):
    return JSONResponse(lti.jwks(request.app.state.server.course))


@router.api_route(lti.LOGIN_PATH, methods=["GET", "POST"])
async def login(request: Request):
    srv: Server = request.app.state.server
    req = lti.LtiRequest(await _params(request), dict(request.cookies), _secure(request))

    def go():
        try:
            tool = lti.Tool(srv.course, lti.DbCache(srv.sessions, srv.clock))
            return tool.login(req, _base(request) + lti.LAUNCH_PATH)
        except lti.REFUSED as e:
            return HTMLResponse(pages.lti_refused(srv.course, f"LTI login refused: {e}"), 400)
    return await run_in_threadpool(go)


@router.post(lti.LAUNCH_PATH)
async def launch(request: Request):
    srv: Server = request.app.state.server
    params = await _params(request)
    secure = _secure(request)
    req = lti.LtiRequest(params, dict(request.cookies), secure)
    return await run_in_threadpool(_launch, srv, req, _base(request), request.query_params.get("lab"), secure)


def _launch(srv: Server, req: lti.LtiRequest, base: str, query_lab: str | None, secure: bool):
    course = srv.course
    try:
        msg = lti.Tool(course, lti.DbCache(srv.sessions, srv.clock)).launch(req)
        data = msg.get_launch_data()
        now = srv.clock()
        with srv.sessions() as s:
            who = lti.account_for(s, data, srv.secret, now)
            if msg.is_deep_link_launch():
                if who.role != "staff":
                    return HTMLResponse(pages.lti_refused(course, "Only course staff add labs to the course."), 403)
                return_url, choices = lti.deep_link_choices(msg, course, base)
                html = pages.lti_deep_link(course, return_url, choices)
            else:
                lab = lti.lab_of(data, course, query_lab)
                linked = bool(lab) and who.role == "student" and lti.link(s, who, lab, data, now) is not None
                html = pages.lti_launch(course, who, course.lab(lab) if lab else None, data["iss"], linked)
            token = lti.open_session(s, who, now)
    except lti.REFUSED as e:
        return HTMLResponse(pages.lti_refused(course, f"LTI launch refused: {e}"), 401)
    resp = HTMLResponse(html)
    # Lax, never None: a page of another site cannot post to this server's forms with it (the
    # state cookie pylti1p3 needs across the platform's cross-site POST is SameSite=None over HTTPS)
    resp.set_cookie(COOKIE, token, httponly=True, secure=secure, samesite="lax", max_age=int(lti.SESSION_S))
    return resp
