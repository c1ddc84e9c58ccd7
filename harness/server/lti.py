"""The course server as an LTI 1.3 (LTI Advantage) tool, on ``pylti1p3``: OIDC login
initiation and launch, deep linking of a lab, grade passback through the Assignment and
Grade Services (AGS).

pylti1p3 ships Django and Flask adapters; this module is the FastAPI one its docs
describe: a ``Request`` (the launch's form or query parameters and cookies), a
``CookieService`` (the state cookie, set on the response), a ``Redirect`` and the launch
data storage (``DbCache``: the OIDC state and nonces in the ``lti_state`` table, so any
server process finishes a login another began).

Configuration lives with the course's other secrets, under ``.labs-staff/`` (git-ignored,
never released): ``lti.json`` names each platform (issuer, client id, deployment ids, its
OIDC auth, token and JWKS URLs; ``labs lti platform add`` writes it) and
``lti-private.pem`` is the tool's RSA key, made on first use (mode 0600); its public half
is the JWKS the server serves at ``/.well-known/jwks.json``.

A launch maps the platform's user (issuer + ``sub``) to a course account: the account it
launched as before, else the roster's account with the launch's e-mail, else a new one
(an instructor, administrator or teaching assistant role: staff; anyone else: student).
A student's launch of lab NN with an AGS claim records where that lab's grade goes
(``LtiLink``); each result stored for that student and lab then queues a post
(``LtiPost``, see ``service.complete``) that ``send_pending`` delivers: the score the
grades export computes (``lms.from_server``: the late penalty applied), retried after a
failure until the platform takes it (``labs lti status`` lists what waits).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import requests
from fastapi.responses import RedirectResponse
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pylti1p3.cookie import CookieService
from pylti1p3.deep_link_resource import DeepLinkResource
from pylti1p3.exception import LtiException, OIDCException
from pylti1p3.lineitem import LineItem
from pylti1p3.grade import Grade
from pylti1p3.assignments_grades import AssignmentsGradesService
from pylti1p3.launch_data_storage.cache import CacheDataStorage
from pylti1p3.message_launch import MessageLaunch
from pylti1p3.oidc_login import OIDCLogin
from pylti1p3.redirect import Redirect
from pylti1p3.registration import Registration
from pylti1p3.request import Request
from pylti1p3.service_connector import ServiceConnector
from pylti1p3.session import SessionService
from pylti1p3.tool_config import ToolConfDict
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from .. import files
from ..errors import LabsError
from ..manifest import Course
from . import lms, service
from .db import Account, LtiLink, LtiPost, LtiSession, LtiState, LtiUser, hash_token

CONFIG_FILE = ".labs-staff/lti.json"        # the platforms (issuer, client id, deployments, URLs)
KEY_FILE = ".labs-staff/lti-private.pem"    # the tool's RSA key, made on first use
PLATFORM_KEYS = ("issuer", "client_id", "deployment_ids", "auth_login_url", "auth_token_url", "key_set_url")
LOGIN_PATH, LAUNCH_PATH, JWKS_PATH = "/lti/login", "/lti/launch", "/.well-known/jwks.json"
CUSTOM = "https://purl.imsglobal.org/spec/lti/claim/custom"
ROLES_CLAIM = "https://purl.imsglobal.org/spec/lti/claim/roles"
AGS_CLAIM = "https://purl.imsglobal.org/spec/lti-ags/claim/endpoint"
SCORE_SCOPE = "https://purl.imsglobal.org/spec/lti-ags/scope/score"
STAFF_ROLES = ("membership#Instructor", "membership#Administrator", "membership/Instructor#TeachingAssistant",
               "institution/person#Administrator", "system/person#Administrator")
SESSION_S = 12 * 3600   # how long a launch's browser session lasts
NONCE_S = 24 * 3600     # how long a used nonce is remembered (an id_token lives minutes)


# --- configuration and the tool's key ------------------------------------------------------

def _config_path(course: Course) -> Path:
    return course.root / CONFIG_FILE


def platforms(course: Course) -> list[dict]:
    """The platforms ``lti.json`` registers (``[]`` when there is none)."""
    path = _config_path(course)
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise LabsError(f"{CONFIG_FILE} is not JSON: {e}") from e
    return list(data.get("platforms", []))


def add_platform(course: Course, values: dict) -> dict:
    """Register (or replace, by issuer and client id) a platform in ``lti.json``."""
    missing = [k for k in PLATFORM_KEYS if not values.get(k)]
    if missing:
        raise LabsError(f"an LTI platform needs {', '.join(missing)}")
    entry = {k: values[k] for k in PLATFORM_KEYS}
    entry["deployment_ids"] = [str(d) for d in entry["deployment_ids"]]
    if values.get("auth_audience"):
        entry["auth_audience"] = values["auth_audience"]
    rest = [p for p in platforms(course) if (p["issuer"], p["client_id"]) != (entry["issuer"], entry["client_id"])]
    path = _config_path(course)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    files.write_atomic(path, json.dumps({"platforms": rest + [entry]}, indent=2) + "\n")
    return entry


def private_key(course: Course) -> str:
    """The tool's RSA private key (PEM), made on first use: 2048 bits, mode 0600, written
    atomically (two servers starting at once keep the first)."""
    path = course.root / KEY_FILE
    if not path.is_file():
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            files.write_atomic(path, pem, exclusive=True)
        except FileExistsError:
            pass
    return path.read_text()


def public_key(course: Course) -> str:
    key = serialization.load_pem_private_key(private_key(course).encode(), password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def tool_conf(course: Course) -> ToolConfDict:
    """pylti1p3's configuration of every registered platform, with the tool's key pair."""
    conf: dict[str, list[dict]] = {}
    for p in platforms(course):
        item = {k: p[k] for k in PLATFORM_KEYS if k != "issuer"}
        item["default"] = not conf.get(p["issuer"])
        if p.get("auth_audience"):
            item["auth_audience"] = p["auth_audience"]
        conf.setdefault(p["issuer"], []).append(item)
    tc = ToolConfDict(conf)
    priv, pub = private_key(course), public_key(course)
    for p in platforms(course):
        tc.set_private_key(p["issuer"], priv, client_id=p["client_id"])
        tc.set_public_key(p["issuer"], pub, client_id=p["client_id"])
    return tc


def jwks(course: Course) -> dict:
    """The tool's public key set (what platforms check its signatures against)."""
    return {"keys": [Registration.get_jwk(public_key(course))]}


# --- pylti1p3's FastAPI adapter ------------------------------------------------------------

class LtiRequest(Request):
    """A launch request as pylti1p3 reads it: its parameters (the query or the form)
    and cookies."""

    def __init__(self, params: dict, cookies: dict, secure: bool):
        super().__init__()
        self._params, self._cookies, self._secure = dict(params), dict(cookies), secure

    @property
    def session(self):
        return {}

    def get_param(self, key: str):
        return self._params.get(key)

    def get_cookie(self, key: str):
        return self._cookies.get(key)

    def is_secure(self) -> bool:
        return self._secure


class Cookies(CookieService):
    """The state cookie: read from the request, set on the response (``apply``)."""

    def __init__(self, request: LtiRequest):
        self._request, self._set = request, {}

    def get_cookie(self, name: str):
        return self._request.get_cookie(f"{self._cookie_prefix}-{name}")

    def set_cookie(self, name: str, value, exp: int | None = 3600):
        self._set[f"{self._cookie_prefix}-{name}"] = (str(value), exp)

    def apply(self, response) -> None:
        secure = self._request.is_secure()
        for key, (value, exp) in self._set.items():
            response.set_cookie(key, value, max_age=exp, path="/", httponly=True, secure=secure,
                                samesite="none" if secure else "lax")


class DbCache:
    """The cache pylti1p3's ``CacheDataStorage`` takes (get, set with an expiry), over the
    ``lti_state`` table; values are JSON."""

    def __init__(self, sessions: sessionmaker, clock: Callable[[], float] = time.time):
        self.sessions, self.clock = sessions, clock

    def get(self, key: str):
        with self.sessions() as s:
            row = s.get(LtiState, key)
            return json.loads(row.value) if row is not None and row.expires_at > self.clock() else None

    def set(self, key: str, value, exp: int | None = None) -> None:
        with self.sessions() as s:
            s.merge(LtiState(key=key, value=json.dumps(value), expires_at=self.clock() + (exp or NONCE_S)))
            s.execute(delete(LtiState).where(LtiState.expires_at < self.clock()))
            s.commit()

    def add(self, key: str, value, exp: int) -> bool:
        """Store ``key`` only if it is not there: False when it was (a nonce used twice)."""
        with self.sessions() as s:
            old = s.get(LtiState, key)
            if old is not None and old.expires_at > self.clock():
                return False
            if old is not None:
                s.delete(old)
                s.flush()
            s.add(LtiState(key=key, value=json.dumps(value), expires_at=self.clock() + exp))
            try:
                s.commit()
            except IntegrityError:
                return False
        return True


class Storage(CacheDataStorage):
    def __init__(self, cache: DbCache):
        super().__init__()
        self._cache = cache


class Redirection(Redirect):
    def __init__(self, location: str, cookies: Cookies):
        self._location, self._cookies = location, cookies

    def do_redirect(self):
        resp = RedirectResponse(self._location, 302)
        self._cookies.apply(resp)
        return resp

    do_js_redirect = do_redirect  # no script on any page of ours: a plain redirect

    def set_redirect_url(self, location: str):
        self._location = location

    def get_redirect_url(self) -> str:
        return self._location


class Login(OIDCLogin):
    def get_redirect(self, url: str):
        return Redirection(url, self._cookie_service)

    def validate_oidc_login(self):
        """pylti1p3's check, its bare Exception for an unknown issuer an OIDCException."""
        try:
            return super().validate_oidc_login()
        except OIDCException:
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            raise OIDCException(f"this issuer is not registered here ({e})") from e


class Launch(MessageLaunch):
    def _get_request_param(self, key: str):
        return self._request.get_param(key)

    def validate_registration(self):
        """pylti1p3's check, with its bare Exception for an unknown issuer and client id
        (a wrong audience) turned into the LtiException every other check raises."""
        try:
            return super().validate_registration()
        except LtiException:
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            raise LtiException(f"Client id not registered for this issuer ({e})") from e


@dataclass
class Tool:
    """What a login or launch needs: the course, its tool configuration and the state
    cache."""
    course: Course
    cache: DbCache

    def _parts(self, request: LtiRequest):
        cookies, session = Cookies(request), SessionService(request)
        storage = Storage(self.cache)
        storage.set_request(request)
        session.set_data_storage(storage)
        return cookies, session, storage

    def login(self, request: LtiRequest, launch_url: str):
        """The OIDC login initiation: a redirect to the platform's auth URL, the state
        cookie set. Raises LtiException (pylti1p3's OIDCException is one) when the issuer
        is not registered."""
        if not platforms(self.course):
            raise LtiException("no LTI platform is registered (`labs lti platform add`)")
        cookies, session, storage = self._parts(request)
        login = Login(request, tool_conf(self.course), session, cookies, storage)
        return login.redirect(request.get_param("target_link_uri") or launch_url)

    def launch(self, request: LtiRequest) -> Launch:
        """The launch, validated: state cookie, the id_token's signature against the
        platform's JWKS, issuer, audience (client id), deployment, nonce (once: a replayed
        launch is refused). Raises LtiException."""
        cookies, session, storage = self._parts(request)
        msg = Launch(request, tool_conf(self.course), session, cookies, storage, TimedSession())
        data = msg.get_launch_data()
        if not self.cache.add(f"used-nonce-{data['nonce']}", True, NONCE_S):
            raise LtiException("this launch was used already (its nonce was seen): launch again from the course")
        return msg


# --- accounts, sessions, links ------------------------------------------------------------

def is_staff(data: dict) -> bool:
    return any(r.endswith(STAFF_ROLES) for r in data.get(ROLES_CLAIM, []))


def account_for(s: Session, data: dict, secret: bytes, now: float) -> Account:
    """The course account of the launch's user (issuer + sub): the one it launched as
    before, else the roster's with the launch's e-mail (of the same kind: staff or
    student), else a new one named after the user."""
    iss, sub = data["iss"], data["sub"]
    known = s.scalar(select(LtiUser).where(LtiUser.issuer == iss, LtiUser.sub == sub))
    if known is not None:
        return known.account
    role = "staff" if is_staff(data) else "student"
    email = str(data.get("email") or "")
    account = s.scalar(select(Account).where(Account.email == email, Account.role == role)) if email else None
    if account is None:
        base = str(data.get("preferred_username") or email or data.get("name") or f"lti-{sub}")[:180]
        name, n = base, 1
        while s.scalar(select(Account.id).where(Account.name == name)) is not None:
            n += 1
            name = f"{base}-{n}"
        service.add_account(s, name, role, secret, email=email, now=now)  # its token is never shown: launches sign in
        account = s.scalar(select(Account).where(Account.name == name))
    s.add(LtiUser(issuer=iss, sub=sub, account_id=account.id, created_at=now))
    s.commit()
    return account


def open_session(s: Session, account: Account, now: float) -> str:
    """A browser session for ``account``: the token the login cookie carries."""
    token = service.new_token()
    s.add(LtiSession(token_hash=hash_token(token), account_id=account.id, created_at=now, expires_at=now + SESSION_S))
    s.commit()
    return token


def lab_of(data: dict, course: Course, query_lab: str | None = None) -> str | None:
    """The lab a launch names: the custom parameter ``lab`` (deep linking sets it), else
    ``?lab=NN`` on the launch URL; None when neither names a lab of the course."""
    lab = str((data.get(CUSTOM) or {}).get("lab") or query_lab or "")
    return lab.zfill(2) if lab and lab.zfill(2) in course.labs else None


def link(s: Session, account: Account, lab: str, data: dict, now: float) -> LtiLink | None:
    """Record where ``account``'s grade of ``lab`` goes (the launch's line item); None
    when the launch carries no AGS claim with a line item and the score scope."""
    ags = data.get(AGS_CLAIM) or {}
    if not ags.get("lineitem") or SCORE_SCOPE not in ags.get("scope", []):
        return None
    row = s.scalar(select(LtiLink).where(LtiLink.account_id == account.id, LtiLink.lab == lab))
    if row is None:
        row = LtiLink(account_id=account.id, lab=lab)
        s.add(row)
    aud = data["aud"][0] if isinstance(data["aud"], list) else data["aud"]
    row.issuer, row.client_id, row.sub, row.ags, row.updated_at = data["iss"], aud, data["sub"], json.dumps(ags), now
    row.deployment_id = data.get("https://purl.imsglobal.org/spec/lti/claim/deployment_id", "")
    s.commit()
    return row


DL_SETTINGS = "https://purl.imsglobal.org/spec/lti-dl/claim/deep_linking_settings"
REFUSED = (LtiException, OIDCException, KeyError, ValueError)  # what a launch that fails its checks raises


def deep_link_choices(msg: Launch, course: Course, base_url: str) -> tuple[str, list[dict]]:
    """A deep-linking launch's answers, one per lab: the platform's return URL and, for
    each lab, the signed response naming it (an LTI resource link to the launch URL with
    the custom parameter ``lab``, and a line item of the lab's points)."""
    dl = msg.get_deep_link()
    choices = []
    for number in sorted(course.labs):
        lab = course.lab(number)
        item = (LineItem().set_label(f"Lab {number}: {lab.title}").set_score_maximum(float(lab.points))
                .set_resource_id(f"lab-{number}").set_tag("labs"))
        res = (DeepLinkResource().set_url(base_url + LAUNCH_PATH).set_title(f"Lab {number}: {lab.title}")
               .set_custom_params({"lab": number}).set_lineitem(item).set_target("window"))
        choices.append({"lab": number, "title": lab.title, "points": lab.points, "jwt": dl.get_response_jwt([res])})
    return msg.get_launch_data()[DL_SETTINGS]["deep_link_return_url"], choices


# --- grade passback -------------------------------------------------------------------------

def backoff_s(attempts: int) -> float:
    """How long a failed post waits before the next try: 2, 4, 8 ... seconds, at most 10 minutes."""
    return min(2.0 ** attempts, 600.0)


class TimedSession(requests.Session):
    """A requests session whose every call gives up after ``timeout_s`` (pylti1p3's own
    set none: a platform that never answers would hold the reaper)."""

    def __init__(self, timeout_s: float = 20.0):
        super().__init__()
        self.timeout_s = timeout_s

    def request(self, *args, **kwargs):
        kwargs.setdefault("timeout", self.timeout_s)
        return super().request(*args, **kwargs)


def post_grade(course: Course, link_row: LtiLink, score: float, max_score: float, now: float,
               session: requests.Session | None = None) -> None:
    """Post one score to the link's line item (AGS ``/scores``); raises on any failure."""
    reg = tool_conf(course).find_registration_by_params(link_row.issuer, link_row.client_id)
    if reg is None:
        raise LtiException(f"platform {link_row.issuer} (client {link_row.client_id}) is no longer registered")
    ags = AssignmentsGradesService(ServiceConnector(reg, session or TimedSession()), json.loads(link_row.ags))
    grade = (Grade().set_score_given(score).set_score_maximum(max_score).set_user_id(link_row.sub)
             .set_activity_progress("Completed").set_grading_progress("FullyGraded")
             .set_timestamp(datetime.fromtimestamp(now, timezone.utc).isoformat()))
    ags.put_grade(grade)


def send_pending(sessions: sessionmaker, course: Course, now: float, session: requests.Session | None = None) -> int:
    """Post every pending grade whose time has come; return how many the platforms took.
    The score is the student's grade of the lab as the grades export computes it (the
    newest result, the late penalty applied); a failure is recorded and retried later,
    never dropped."""
    sent = 0
    with sessions() as s:
        due = s.scalars(select(LtiPost).where(LtiPost.state == "pending", LtiPost.next_try <= now)
                        .order_by(LtiPost.id)).all()
        done_links: set[int] = set()
        for post in due:
            row = post.link
            if row.id in done_links:  # a newer post of the same grade went out in this pass
                post.state, post.sent_at, post.score, post.max_score = "sent", now, *_grade(s, course, row)
                continue
            score, max_score = _grade(s, course, row)
            try:
                if score is None:
                    raise LtiException(f"no grade of lab {row.lab} to post")
                post_grade(course, row, score, max_score, now, session)
            except Exception as e:  # noqa: BLE001 - any failure: recorded, retried
                post.attempts += 1
                post.error = f"{type(e).__name__}: {e}"[:2000]
                post.next_try = now + backoff_s(post.attempts)
            else:
                post.state, post.sent_at, post.score, post.max_score, post.error = "sent", now, score, max_score, ""
                done_links.add(row.id)
                sent += 1
            s.commit()
    return sent


def _grade(s: Session, course: Course, row: LtiLink) -> tuple[float | None, float]:
    lab = course.lab(row.lab)
    name = s.get(Account, row.account_id).name
    for g in lms.from_server(s, course, lab):
        if g.student == name:
            return g.score, g.max_score
    return None, float(lab.points)


def status(s: Session) -> list[dict]:
    """Every grade post, pending first: student, lab, state, score, attempts, error."""
    rows = s.scalars(select(LtiPost).order_by(LtiPost.state, LtiPost.id)).all()
    return [{"id": p.id, "student": p.link.account.name, "lab": p.link.lab, "state": p.state, "score": p.score,
             "max_score": p.max_score, "attempts": p.attempts, "error": p.error, "issuer": p.link.issuer,
             "created_at": p.created_at, "sent_at": p.sent_at} for p in rows]
