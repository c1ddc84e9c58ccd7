"""Issue 34.1b: the course server as an LTI 1.3 tool, end to end against a real LTI 1.3
platform started in the test on loopback ports.

The platform is ``lti1p3platform`` (PyPI): its registration, OIDC login initiation
(``prepare_preflight_url``), signed launches (resource link and deep linking, with the
AGS claim), the access-token grant that checks the tool's client assertion against the
tool's JWKS, the check of the tool's signed deep-linking response and the check of the
bearer tokens. It has no HTTP server and no line-item store: the few routes that serve
those (its JWKS, auth, token, the line item's ``/scores`` and ``/results``, the deep-link
return) are written here on FastAPI around the library's calls, and the line item's
scores are a list in memory.

The flow: a staff deep-linking launch adds lab 07 (the platform checks the signed
response names lab 07 with a line item of 10 points); a student launches it (login ->
auth -> launch), lands on the lab's page (checked in headless Chromium), submits through
the API with the launch's session, a runner grades it, and the score (the late penalty
applied, as the grades export computes it) reaches the platform's line item: the first
posts fail (the platform answers 503), `labs lti status` shows it pending with the error,
the next try after the platform is back delivers it. A launch with a bad signature, a wrong audience or a replayed
nonce is refused with a page that says why.
"""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone
from html.parser import HTMLParser

import pytest
import yaml

if not os.environ.get("CI"):
    pytest.importorskip("pylti1p3")
    pytest.importorskip("lti1p3platform")
import httpx  # noqa: E402
import jwt  # noqa: E402
import uvicorn  # noqa: E402
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import HTMLResponse, JSONResponse  # noqa: E402
from lti1p3platform.ltiplatform import LTI1P3PlatformConfAbstract  # noqa: E402
from lti1p3platform.message_launch import LTIAdvantageMessageLaunchAbstract  # noqa: E402
from lti1p3platform.oidc_login import OIDCLoginAbstract  # noqa: E402
from lti1p3platform.registration import Registration  # noqa: E402
from sqlalchemy import select  # noqa: E402

from harness import manifest  # noqa: E402
from harness.records import Graded  # noqa: E402
from harness.server import app as app_mod, db, lms, lti, runner, service  # noqa: E402
from tests.conftest import TOY_GRADER, TOY_SOLUTION, TOY_STUB, TOY_YAML  # noqa: E402
from tests.test_server_api import db_url, postgres  # noqa: E402,F401  (fixtures)
from tests.test_server_cli import labs  # noqa: E402
from tests.test_server_pages import Browser, free_port  # noqa: E402

ISS = "https://platform.test"
CLIENT_ID = "labs-tool-client"
DEPLOYMENT = "deployment-1"
SCORE = "https://purl.imsglobal.org/spec/lti-ags/scope/score"
DAY = 86400.0


def _keypair() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return priv, pub


class Forms(HTMLParser):
    """Every form of a page: its action and its inputs' names and values."""

    def __init__(self, html: str):
        super().__init__()
        self.forms: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append({"action": a.get("action"), "fields": {}})
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1]["fields"][a["name"]] = a.get("value", "")


# --- the platform ---------------------------------------------------------------------------

class Platform:
    """An LTI 1.3 platform on a loopback port: lti1p3platform's registration, launches and
    token checks behind a few FastAPI routes; one course with one line item."""

    def __init__(self, tool_base: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.priv, self.pub = _keypair()
        self.users = {"u-alice": {"name": "Alice Liddell", "email": "alice@uni.test", "roles": ["learner"]},
                      "u-prof": {"name": "Prof Plum", "email": "prof@uni.test", "roles": ["instructor"]}}
        self.scores: list[dict] = []          # what the line item received
        self.fail_posts = 0                   # answer the next N score posts with 503
        self.deep_links: list[list[dict]] = []  # content items of each deep-linking response
        self.tool_base = tool_base
        reg = (Registration().set_iss(ISS).set_client_id(CLIENT_ID).set_deployment_id(DEPLOYMENT)
               .set_oidc_login_url(tool_base + lti.LOGIN_PATH).set_launch_url(tool_base + lti.LAUNCH_PATH)
               .set_deeplink_launch_url(tool_base + lti.LAUNCH_PATH)
               .set_tool_key_set_url(tool_base + lti.JWKS_PATH)
               .set_platform_public_key(self.pub).set_platform_private_key(self.priv))

        class Conf(LTI1P3PlatformConfAbstract):
            def init_platform_config(self, **kwargs):
                pass

            def get_registration_by_params(self, **kwargs):
                return reg

        self.Conf = Conf
        self.app = self._app()

    def conf(self) -> LTI1P3PlatformConfAbstract:
        c = self.Conf()
        c.get_registration()
        return c

    # the launch's roles, as the LIS vocabulary names them
    ROLE_URIS = {"learner": "http://purl.imsglobal.org/vocab/lis/v2/membership#Learner",
                 "instructor": "http://purl.imsglobal.org/vocab/lis/v2/membership#Instructor"}

    def login_url(self, user: str, message: str) -> str:
        """Where the platform sends the browser to start a launch (OIDC third-party login)."""
        platform = self

        class Login(OIDCLoginAbstract):
            def set_lti_message_hint(self, **kwargs):
                self._lti_message_hint = kwargs["hint"]

            def get_redirect(self, url):
                return url

        login = Login(None, platform.conf())
        login.set_lti_message_hint(hint=message)
        if message == "deeplink":
            login.set_deeplinking_launch_url()
        return login.initiate_login(user)

    def _app(self) -> FastAPI:
        app = FastAPI()
        platform = self

        class Launch(LTIAdvantageMessageLaunchAbstract):
            def get_preflight_response(self):
                return self._request

            def render_launch_form(self, launch_data, **kwargs):
                return HTMLResponse(f'<form method="post" action="{launch_data["launch_url"]}">'
                                    f'<input type="hidden" name="id_token" value="{launch_data["id_token"]}">'
                                    f'<input type="hidden" name="state" value="{launch_data["state"]}"></form>')

        @app.get("/jwks")
        def jwks():
            return platform.conf().get_jwks()

        @app.get("/auth")
        def auth(request: Request):
            """The OIDC authorization endpoint: the tool's auth request -> a signed launch."""
            q = dict(request.query_params)
            user = platform.users[q["login_hint"]]
            launch = Launch(q, platform.conf())
            launch.set_user_data(q["login_hint"], [platform.ROLE_URIS[r] for r in user["roles"]],
                                 full_name=user["name"], email_address=user["email"])
            launch.set_launch_context_claim("course-1", context_title="AI infrastructure")
            if q.get("lti_message_hint") == "deeplink":
                launch.set_dl(platform.base + "/deep-link-return", title="Add a lab")
            else:
                launch.set_resource_link_claim("link-lab-07", title="Lab 07")
                launch.set_custom_parameters_claim({"lab": "07"})
                launch.set_ags(platform.base + "/lineitems", platform.base + "/lineitems/1",
                               allow_creating_lineitems=True, results_service_enabled=True,
                               scores_service_enabled=True)
            return launch.lti_launch()

        @app.post("/token")
        async def token(request: Request):
            form = dict(await request.form())
            try:
                return platform.conf().get_access_token(form)
            except Exception as e:  # noqa: BLE001 - the library's refusal, as OAuth2 says
                return JSONResponse({"error": "invalid_client", "error_description": str(e)}, 400)

        def _bearer(request: Request, scope: str) -> bool:
            auth = request.headers.get("authorization", "")
            return auth.startswith("Bearer ") and platform.conf().validate_token(auth[7:], allowed_scopes=[scope])

        @app.post("/lineitems/1/scores")
        async def scores(request: Request):
            if not _bearer(request, SCORE):
                return JSONResponse({"error": "unauthorized"}, 401)
            assert request.headers["content-type"].startswith("application/vnd.ims.lis.v1.score+json")
            if platform.fail_posts:
                platform.fail_posts -= 1
                return JSONResponse({"error": "gradebook is busy"}, 503)
            platform.scores.append(json.loads(await request.body()))
            return JSONResponse({}, 200)

        @app.get("/lineitems/1/results")
        def results(request: Request):
            """AGS results: the newest score of each user, as resultScore / resultMaximum."""
            if not _bearer(request, "https://purl.imsglobal.org/spec/lti-ags/scope/result.readonly"):
                return JSONResponse({"error": "unauthorized"}, 401)
            newest = {}
            for sc in platform.scores:
                newest[sc["userId"]] = sc
            return [{"userId": u, "resultScore": sc["scoreGiven"], "resultMaximum": sc["scoreMaximum"],
                     "scoreOf": platform.base + "/lineitems/1"} for u, sc in newest.items()]

        @app.post("/deep-link-return")
        async def deep_link_return(request: Request):
            form = dict(await request.form())
            items = platform.conf().validate_deeplinking_resp({"JWT": form["JWT"]})
            platform.deep_links.append(items)
            return HTMLResponse("<p>added</p>")

        return app

    def access_token(self, scope: str) -> str:
        """A token of the platform's own (for the test's reads of its AGS endpoint)."""
        return Registration.encode_and_sign({"sub": "test", "iss": ISS, "scopes": scope}, self.priv, expiration=600)


def _serve(app, port: int):
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True, name=f"lti-test-{port}")
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "a server did not start"
        time.sleep(0.05)
    return server, thread


@pytest.fixture
def lti_world(tmp_path, monkeypatch, db_url):
    """The toy course (lab 07 due a day minus an hour ago, 10% off per late day) served
    with LTI configured for the platform, and the platform; both on free loopback ports."""
    monkeypatch.delenv("LABS_COURSE", raising=False)
    root = tmp_path / "course"
    data = yaml.safe_load(TOY_YAML)
    data["labs"]["07"]["deadline"] = datetime.fromtimestamp(time.time() - DAY + 3600, timezone.utc).isoformat()
    data["submissions"] = {"late": {"max_days": 3, "penalty_per_day": 0.1}}
    for rel, text in {"labs.yaml": yaml.safe_dump(data, sort_keys=False), "labs/07/toy.py": TOY_STUB,
                      "solutions/07/toy.py": TOY_SOLUTION, "graders/07/test_toy.py": TOY_GRADER,
                      "labs/07/test_toy_visible.py": TOY_GRADER}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    course = manifest.load(root)
    tool_port = free_port()
    tool_base = f"http://127.0.0.1:{tool_port}"
    platform = Platform(tool_base)
    p = _labs(root, "lti", "platform", "--issuer", ISS, "--client-id", CLIENT_ID, "--deployment-id", DEPLOYMENT,
              "--auth-login-url", platform.base + "/auth", "--auth-token-url", platform.base + "/token",
              "--key-set-url", platform.base + "/jwks", "--url", tool_base)
    assert p.returncode == 0, p.stderr
    assert f"{tool_base}/lti/login" in p.stdout and f"{tool_base}/.well-known/jwks.json" in p.stdout, p.stdout
    assert (root / lti.KEY_FILE).stat().st_mode & 0o077 == 0  # the tool's key: the owner's alone
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=0.2)
    servers = [_serve(app, tool_port), _serve(platform.app, platform.port)]
    with app.state.sessions() as s:
        service.add_account(s, "prof", "staff", b"k", email="prof@uni.test", now=service.clock())
    yield course, url, app, tool_base, platform
    for server, thread in servers:
        server.should_exit = True
        thread.join(timeout=30)


def _labs(root, *args) -> subprocess.CompletedProcess:
    return labs(root, *args, env={**os.environ, "COLUMNS": "250"})


def launch(platform: Platform, browser: httpx.Client, user: str,
           message: str = "resource") -> tuple[dict, httpx.Response]:
    """One launch as a browser makes it: the platform's login initiation to the tool, the
    tool's redirect to the platform's auth endpoint, its auto-posted form to the tool."""
    r = browser.get(platform.login_url(user, message))
    assert r.status_code == 302 and r.headers["location"].startswith(platform.base + "/auth?"), (r.status_code, r.text)
    r = browser.get(r.headers["location"])
    assert r.status_code == 200, r.text
    (form,) = Forms(r.text).forms
    return form, browser.post(form["action"], data=form["fields"])


def test_launch_deep_link_submit_grade_and_the_score_reaches_the_platforms_line_item(lti_world, tmp_path):
    course, url, app, tool_base, platform = lti_world
    assert httpx.get(tool_base + lti.JWKS_PATH).json()["keys"][0]["kty"] == "RSA"

    # staff add lab 07 to the course: a deep-linking launch, the signed response names lab 07
    with httpx.Client(timeout=60) as prof:
        _, r = launch(platform, prof, "u-prof", "deeplink")
        assert r.status_code == 200, r.text
        (form,) = Forms(r.text).forms  # one lab in the course: one choice
        assert form["action"] == platform.base + "/deep-link-return"
        assert prof.post(form["action"], data=form["fields"]).text == "<p>added</p>"
    (items,) = platform.deep_links
    (item,) = items
    assert item["type"] == "ltiResourceLink" and item["url"] == tool_base + lti.LAUNCH_PATH
    assert item["custom"] == {"lab": "07"} and item["lineItem"]["scoreMaximum"] == 10.0, item
    assert item["lineItem"]["resourceId"] == "lab-07"
    with app.state.sessions() as s:  # the instructor is the roster's staff account (same e-mail)
        assert s.scalar(select(db.LtiUser)).account.name == "prof"

    # alice launches lab 07: a new student account, signed in, her grade's line item recorded
    browser = httpx.Client(timeout=60)
    _, r = launch(platform, browser, "u-alice")
    assert r.status_code == 200, r.text
    assert "Lab 07: Toy lab" in r.text and "Signed in as <strong>alice@uni.test</strong>" in r.text
    assert "goes back to" in r.text
    (session_cookie,) = [c for c in r.headers.get_list("set-cookie") if c.startswith("labs_token=")]
    assert "samesite=lax" in session_cookie.lower() and "httponly" in session_cookie.lower()
    page = tmp_path / "launch.html"
    page.write_text(r.text)
    dom = Browser(tmp_path / "chromium").dom(page.as_uri())
    assert "Signed in as alice@uni.test from https://platform.test." in " ".join(dom.text.split()), dom.text
    with app.state.sessions() as s:
        (link,) = s.scalars(select(db.LtiLink)).all()
        assert (link.account.name, link.account.role, link.lab, link.sub) == ("alice@uni.test", "student", "07",
                                                                             "u-alice")
    me = browser.get(tool_base + "/me")
    assert me.status_code == 200 and "alice@uni.test" in me.text

    # she submits with the launch's session (as the server's tests submit) and a runner grades it
    src = tmp_path / "m" / "toy.py"
    src.parent.mkdir()
    src.write_text(TOY_SOLUTION)
    r = browser.post(tool_base + "/api/submissions", data={"lab": "07"},
                     files={"file": ("toy.tar.gz", service.pack_module(src, course.lab("07")))})
    assert r.status_code == 201 and r.json()["late_days"] == 1, r.text
    platform.fail_posts = 10 ** 6  # the gradebook is down until the test says otherwise
    assert runner.Dispatcher(url, course, "runner-cpu-0").once()
    with app.state.sessions() as s:
        res = s.scalar(select(db.Result))
        raw = Graded.from_json(json.loads(res.data)).score
        (grade,) = [g for g in lms.from_server(s, course, course.lab("07")) if g.student == "alice@uni.test"]
    assert grade.score == pytest.approx(raw * 0.9) and grade.score < raw  # one late day: 10% off

    deadline = time.time() + 60
    while True:  # the reaper's pass tried, failed, recorded why
        with app.state.sessions() as s:
            post = s.scalar(select(db.LtiPost))
            if post is not None and post.attempts >= 1:
                break
        assert time.time() < deadline, "no post was tried"
        time.sleep(0.1)
    assert post.state == "pending" and "503" in post.error and post.score is None
    p = _labs(course.root, "lti", "status", "--db", url)
    assert p.returncode == 0 and "1 grade post(s) pending, 0 sent" in p.stdout and "503" in p.stdout, p.stdout
    platform.fail_posts = 0  # back up: the next try (2, 4, 8 ... s after a failure) delivers it
    while not platform.scores:
        assert time.time() < deadline, "the grade never reached the platform"
        time.sleep(0.1)
    (sent,) = platform.scores
    assert sent["userId"] == "u-alice" and sent["scoreGiven"] == pytest.approx(grade.score)
    assert sent["scoreMaximum"] == 10.0 and sent["gradingProgress"] == "FullyGraded"
    results = httpx.get(platform.base + "/lineitems/1/results", headers={
        "Authorization": "Bearer " + platform.access_token(
            "https://purl.imsglobal.org/spec/lti-ags/scope/result.readonly")}).json()
    assert results == [{"userId": "u-alice", "resultScore": pytest.approx(grade.score), "resultMaximum": 10.0,
                        "scoreOf": platform.base + "/lineitems/1"}]
    time.sleep(0.5)
    with app.state.sessions() as s:
        post = s.scalar(select(db.LtiPost))
        assert post.state == "sent" and post.score == pytest.approx(grade.score) and post.attempts >= 1
    p = _labs(course.root, "lti", "status", "--db", url)
    assert "0 grade post(s) pending, 1 sent" in p.stdout, p.stdout
    assert len(platform.scores) == 1  # sent once
    browser.close()


def _forged(platform: Platform, form: dict, **changes) -> dict:
    """The launch form with its id_token's claims changed (``key``: signed with another key)."""
    body = jwt.decode(form["fields"]["id_token"], options={"verify_signature": False})
    header = jwt.get_unverified_header(form["fields"]["id_token"])
    key = changes.pop("key", platform.priv)
    body.update(changes)
    return {**form["fields"], "id_token": jwt.encode(body, key, algorithm="RS256", headers={"kid": header["kid"]})}


def test_a_bad_signature_a_wrong_audience_or_a_replayed_launch_is_refused(lti_world, tmp_path):
    course, url, app, tool_base, platform = lti_world
    other_key, _ = _keypair()
    with httpx.Client(timeout=60) as browser:
        for change, why in (({"key": other_key}, "Signature verification failed"),
                            ({"aud": "someone-else"}, "Client id not registered for this issuer")):
            r = browser.get(platform.login_url("u-alice", "resource"))
            r = browser.get(r.headers["location"])
            (form,) = Forms(r.text).forms
            r = browser.post(form["action"], data=_forged(platform, form, **change))
            assert r.status_code == 401 and "This launch was refused" in r.text and why in r.text, r.text
            assert "labs_token" not in r.cookies
        form, r = launch(platform, browser, "u-alice")
        assert r.status_code == 200
        again = browser.post(form["action"], data=form["fields"])
        assert again.status_code == 401 and "this launch was used already" in again.text, again.text
        page = tmp_path / "refused.html"
        page.write_text(again.text)
        dom = Browser(tmp_path / "chromium").dom(page.as_uri())
        assert "LTI launch refused: this launch was used already" in " ".join(dom.text.split())
        r = browser.get(tool_base + lti.LOGIN_PATH, params={"iss": "https://unknown.test", "login_hint": "x"})
        assert r.status_code == 400 and "LTI login refused" in r.text
    with app.state.sessions() as s:  # one account, one session: from the one good launch
        assert len(s.scalars(select(db.LtiSession)).all()) == 1
