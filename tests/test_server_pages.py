"""The course server's pages (harness/server/pages.py and its templates) as a browser
shows them: a real server (uvicorn on a free loopback port, SQLite in a temporary
folder), a roster, submissions through the API, one graded for real by the embedded
dispatcher, and each page rendered in headless Chromium, its DOM read back after
rendering.

Headless Chromium takes no cookie on its command line, so an authenticated page is
fetched with the cookie the login form set, saved, and rendered from the file: the
pages use no external asset, so the saved page renders as served (every page is also
checked for that). The login page is rendered live from the server.

Screenshots of the leaderboard and a student's page are written under pytest's
tmp_path (artifacts, never committed): their paths are printed (``pytest -s``).
"""
from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

if not os.environ.get("CI"):  # the server extra (`make setup` installs it): CI must have it
    pytest.importorskip("fastapi")
import httpx  # noqa: E402
import uvicorn  # noqa: E402
from sqlalchemy import select  # noqa: E402

from harness import grading, manifest  # noqa: E402
from harness.records import Graded  # noqa: E402
from harness.server import app as server_app, db, runner, service  # noqa: E402
from tests.conftest import TOY_GRADER, TOY_SOLUTION, TOY_STUB, TOY_YAML  # noqa: E402
from tests.test_progress import CHROMIUM_FLAGS, chromium  # noqa: E402

EVIL = "<script>alert(1)</script>"  # a roster name: must reach every page as text, never as markup
STUDENTS = ["alice", "bob", "carol", EVIL, "dave", "eve", "frank"]
H100 = "NVIDIA H100 80GB HBM3"
# no fetch of anything: no scripts, stylesheets, images, imports, remote urls (an SVG's xmlns are names)
EXTERNAL = re.compile(r"<script|<link|<img|<iframe|<object|<embed|@import|url\((?!#)"
                      r"|(src|href|action)\s*=\s*[\"']?(https?:)?//", re.I)
NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}


# --- a DOM read back from Chromium -------------------------------------------------------

class Dom(HTMLParser):
    """What a test asks of a rendered page: the elements (tag, attributes), the text,
    and each table's rows as lists of cell texts (SVG text is not table text)."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict]] = []
        self.chunks: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None
        self._svg = 0
        self.feed(html)
        self.close()
        self.text = " ".join(" ".join(self.chunks).split())

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag == "svg":
            self._svg += 1
        elif tag == "table" and not self._svg:
            self.tables.append([])
        elif tag == "tr" and self.tables and not self._svg:
            self.tables[-1].append([])
        elif tag in ("td", "th") and self.tables and not self._svg:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg -= 1
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join(" ".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        self.chunks.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def tags(self, name: str) -> list[dict]:
        return [a for t, a in self.elements if t == name]

    def rows(self, table: int = 0) -> list[list[str]]:
        """Table ``table``'s rows below its header, as cell texts."""
        return self.tables[table][1:]

    def column(self, header: str, table: int = 0) -> list[str]:
        head = self.tables[table][0]
        i = head.index(header)
        return [r[i] for r in self.rows(table)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """Headless Chromium, one process per page, its profile under ``folder``."""

    def __init__(self, folder: Path):
        self.exe, self.folder = chromium(), folder
        folder.mkdir(parents=True, exist_ok=True)

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([self.exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.folder / 'profile'}", *args],
                              capture_output=True, text=True, timeout=120)

    def dom(self, url: str) -> Dom:
        proc = self._run("--dump-dom", url)
        assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
        dom = Dom(proc.stdout)
        for tag in ("script", "img", "link", "iframe", "object", "embed"):  # nothing loaded, nothing injected
            assert not dom.tags(tag), (url, tag, dom.tags(tag))
        assert not [a for _, a in dom.elements if "src" in a or any(k.startswith("on") for k in a)], url
        return dom

    def screenshot(self, url: str, png: Path) -> Path:
        png.parent.mkdir(parents=True, exist_ok=True)
        proc = self._run(f"--screenshot={png}", url)
        assert png.is_file(), proc.stderr[-2000:]
        print(f"screenshot: {png}")
        return png


# --- the course server with its roster and submissions ------------------------------------

class World:
    """The running server, its accounts' tokens, and what the fixture submitted."""

    def __init__(self, root: Path, base: str, course, url: str, tokens: dict, pages: Path, seen: list):
        self.root, self.base, self.course, self.url, self.tokens = root, base, course, url, tokens
        self.pages, self.seen = pages, seen
        self.subs: dict[str, list[str]] = {}     # student -> submission ids, oldest first
        self.results: dict[str, int] = {}        # label -> result id
        self.secret = grading.course_secret(course) or b"labs-no-secret"
        self._clients: dict[str, httpx.Client] = {}

    def pseudonym(self, name: str) -> str:
        return service.pseudonym(self.secret, name)

    def client(self, name: str) -> httpx.Client:
        """A client signed in as ``name`` through the login form (the cookie it set)."""
        if name not in self._clients:
            c = httpx.Client(base_url=self.base, timeout=60)
            r = c.post("/login", data={"token": self.tokens[name]})
            assert r.status_code == 303 and "labs_token" in r.cookies, (r.status_code, r.text)
            self._clients[name] = c
        return self._clients[name]

    def html(self, name: str, path: str) -> str:
        r = self.client(name).get(path)
        assert r.status_code == 200, (name, path, r.status_code, r.text[:500])
        assert r.headers["content-type"].startswith("text/html")
        return r.text

    def save(self, name: str, path: str) -> tuple[str, Path]:
        """The page at ``path`` as ``name`` sees it, checked to fetch nothing, saved for
        Chromium; returns its HTML and file."""
        text = self.html(name, path)
        self_contained(text)
        f = self.pages / f"{re.sub(r'[^A-Za-z0-9]+', '_', name + path).strip('_')}.html"
        f.write_text(text, encoding="utf-8")
        return text, f


def self_contained(text: str) -> None:
    """No asset fetched from anywhere (the server's own links are paths, not urls)."""
    assert not EXTERNAL.search(text), EXTERNAL.search(text).group(0)
    assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= NAMESPACES, re.findall(r"https?://[^\s\"'<>]+", text)


def variant(outcome: service.Outcome, *, ratio: float, score: float, gpu: str) -> service.Outcome:
    """A copy of a real graded outcome with another perf ratio, score and GPU model."""
    out = copy.deepcopy(outcome)
    tests = out.record.result.tests
    for t in tests:
        t.perf, t.score = [dict(p, ratio=ratio) for p in t.perf], 0.0
    tests[0].score = score
    out.gpu_model = gpu
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base_dir = tmp_path_factory.mktemp("server-pages")
    root = base_dir / "course"  # the toy course of tests/conftest.py (toy_course is per test; this is per module)
    for rel, text in {"labs.yaml": TOY_YAML, "labs/07/toy.py": TOY_STUB, "solutions/07/toy.py": TOY_SOLUTION,
                      "graders/07/test_toy.py": TOY_GRADER, "labs/07/test_toy_visible.py": TOY_GRADER}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    mp = pytest.MonkeyPatch()
    mp.delenv("LABS_COURSE", raising=False)
    course = manifest.load(root)
    lab = course.lab("07")
    assert course.submissions.hidden_results == "after_deadline" and lab.deadline is None
    url = f"sqlite:///{base_dir / 'server.db'}"

    app = server_app.create_app(course, url)
    seen: list[str] = []  # every path the server was asked for

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            seen.append(scope["path"])
        await app(scope, receive, send)

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True, name="labs-test-server")
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        assert thread.is_alive() and time.time() < deadline, "the server did not start"
        time.sleep(0.05)

    Sessions = db.sessions(url)
    secret = grading.course_secret(course) or b"labs-no-secret"
    with Sessions() as s:
        rows = [{"name": n} for n in STUDENTS] + [{"name": "prof", "role": "staff", "email": "prof@example.org"}]
        tokens = dict(service.import_roster(s, rows, secret, now=service.clock()))
    pages = base_dir / "pages"
    pages.mkdir()
    w = World(root, f"http://127.0.0.1:{port}", course, url, tokens, pages, seen)

    def upload(name: str, text: str) -> str:
        """Submit ``text`` as ``name``'s lab 07 through the API; the submission id."""
        src = base_dir / "uploads" / name.encode().hex() / str(len(w.subs.get(name, []))) / "toy.py"
        src.parent.mkdir(parents=True)
        src.write_text(text)
        r = httpx.post(f"{w.base}/api/submissions", data={"lab": "07"},
                       files={"file": ("toy.tar.gz", service.pack_module(src, lab))},
                       headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=60)
        assert r.status_code == 201 and not r.json()["duplicate"], r.text
        w.subs.setdefault(name, []).append(r.json()["id"])
        time.sleep(0.01)  # distinct created_at: the queue's order
        return r.json()["id"]

    # alice's reference, graded for real by an embedded runner
    upload("alice", TOY_SOLUTION)
    assert runner.Dispatcher(url, course, "runner-cpu-0").once()
    with Sessions() as s:
        res = s.scalar(select(db.Result))
        assert res is not None and res.kind == "ok" and res.perf_ratio == 2.0, res and res.status
        real = service.Outcome(Graded.from_json(json.loads(res.data)), json.loads(res.host), res.gpu_model)
        w.results["alice-real"] = res.id
    w.real = real

    def graded(name: str, label: str, owner: str, **kw):
        """Another run of ``name`` stored as a runner would store it: a copy of the real
        outcome with other figures (no second real grading: seconds each)."""
        sub_id = upload(name, TOY_SOLUTION + f"# {label}\n")
        with Sessions() as s:
            job = s.get(db.Submission, sub_id).jobs[-1]
            assert service.claim(s, owner, service.clock(), job_id=job.id) is not None
            assert service.complete(s, job.id, owner, variant(real, **kw), service.clock(), course)
            w.results[label] = s.scalar(select(db.Result.id).where(db.Result.job_id == job.id))

    graded("alice", "alice-better", "runner-cpu-0", ratio=1.5, score=7.0, gpu="cpu")
    graded("bob", "bob-fair", "runner-cpu-0", ratio=1.2, score=8.5, gpu="cpu")
    graded("bob", "bob-cheat", "runner-cpu-0", ratio=0.9, score=9.0, gpu="cpu")
    graded("carol", "carol-h100", "runner-h100-0", ratio=1.1, score=10.0, gpu=H100)
    graded(EVIL, "evil", "runner-cpu-0", ratio=2.5, score=4.0, gpu="cpu")
    # frank's is held by a runner now; eve's then dave's wait behind it
    frank = upload("frank", TOY_SOLUTION + "# frank\n")
    with Sessions() as s:
        job = s.get(db.Submission, frank).jobs[-1]
        assert service.claim(s, "runner-h100-1", service.clock(), job_id=job.id, lease_s=900) is not None
    upload("eve", TOY_SOLUTION + "# eve\n")
    upload("dave", TOY_SOLUTION + "# dave\n")

    # staff mark bob's suspicious run invalid through the leaderboard's form
    r = w.client("prof").post(f"/staff/results/{w.results['bob-cheat']}/invalid",
                              data={"reason": "timer patched", "lab": "07"})
    assert r.status_code == 303 and r.headers["location"] == "/leaderboard/07", r.text
    yield w
    for c in w._clients.values():
        c.close()
    server.should_exit = True
    thread.join(timeout=30)
    mp.undo()


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Browser:
    return Browser(tmp_path_factory.mktemp("chromium"))


# --- the pages -------------------------------------------------------------------------------

def test_login_page_renders_live_and_fetches_nothing(world, browser):
    world.seen.clear()
    dom = browser.dom(f"{world.base}/login")
    assert [f.get("action") for f in dom.tags("form")] == ["/login"]
    assert [(i.get("name"), i.get("type")) for i in dom.tags("input")] == [("token", "password")]
    assert "Sign in" in dom.text and world.course.name in dom.text
    # the browser asked the server for the page only (a favicon probe is all it may add)
    assert set(world.seen) <= {"/login", "/favicon.ico"} and "/login" in world.seen, world.seen
    self_contained(httpx.get(f"{world.base}/login").text)
    # a page without a cookie sends the browser to the login form
    r = httpx.get(f"{world.base}/me")
    assert r.status_code == 303 and r.headers["location"] == "/login"
    r = httpx.post(f"{world.base}/login", data={"token": "not-a-token"})  # back to the form, no cookie
    assert r.status_code in (303, 401) and "labs_token" not in r.cookies and "/me" not in r.headers.get("location", "")
    # staff land on their overview, students on their own page
    assert httpx.post(f"{world.base}/login", data={"token": world.tokens["prof"]}).headers["location"] == "/staff"
    assert httpx.post(f"{world.base}/login", data={"token": world.tokens["bob"]}).headers["location"] == "/me"


def test_student_page_lists_only_own_submissions_with_state_score_and_queue(world, browser, tmp_path):
    _, page = world.save("alice", "/me")
    dom = browser.dom(page.as_uri())
    assert "alice" in dom.text
    assert "/staff" not in {a.get("href") for a in dom.tags("a")}  # no staff link offered to a student
    links = {a["href"] for a in dom.tags("a") if a.get("href", "").startswith("/submissions/")}
    assert links == {f"/submissions/{i}" for i in world.subs["alice"]}
    others = [i for n, ids in world.subs.items() if n != "alice" for i in ids]
    html = page.read_text()
    assert not any(i in html for i in others) and not any(i[:8] in dom.text for i in others)
    for name in ("bob", "carol", "dave", "frank", "alert(1)"):
        assert name not in dom.text
    rows = dom.rows()
    assert len(rows) == 2
    assert [r for r in dom.column("State")] == ["done", "done"]
    assert sorted(dom.column("Score")) == ["6.5 / 10", "7 / 10"]
    assert all("ok" in s for s in dom.column("Status"))
    shot = browser.screenshot(page.as_uri(), tmp_path / "artifacts" / "student-alice.png")
    assert shot.stat().st_size > 8_000

    # dave's waits behind eve's (frank's is being graded): position 2, with an estimate
    _, dave = world.save("dave", "/me")
    dom = browser.dom(dave.as_uri())
    (state,) = dom.column("State")
    assert state.startswith("queued") and "position 2" in state, state
    assert re.search(r"about \d+(\.\d+)? (s|min)", state), state
    assert dom.column("Score") == [""]
    _, page = world.save("frank", "/me")
    (state,) = browser.dom(page.as_uri()).column("State")
    assert re.fullmatch(r"running \((about \d+ (s|min) left|due any moment)\)", state), state
    _, page = world.save("eve", "/me")
    (state,) = browser.dom(page.as_uri()).column("State")
    assert "position 1" in state, state

    shot = browser.screenshot(dave.as_uri(), tmp_path / "artifacts" / "student-dave.png")
    assert shot.stat().st_size > 8_000

    # another student's submission is not there for alice
    r = world.client("alice").get(f"/submissions/{world.subs['bob'][0]}")
    assert r.status_code == 404 and "bob" not in r.text


def test_submission_page_hides_hidden_tests_from_students_not_staff(world, browser):
    sub = world.subs["alice"][0]  # the one graded for real
    hidden = [t["name"] for t in world.real.record.to_gradescope()["tests"]]
    assert hidden and all(":" in n for n in hidden)
    _, page = world.save("alice", f"/submissions/{sub}")
    dom = browser.dom(page.as_uri())
    text = dom.text
    assert "6.5 / 10" in text and "done" in text and "8.5 runnable" in text
    parts = {r[0]: r[1:] for r in dom.rows()}
    assert set(parts) == {"A: Adding", "B: Speed"}, parts  # each part's title and points
    assert parts["A: Adding"][0] == "4.5 / 6" and parts["B: Speed"][0] == "2 / 4"
    for name in hidden:
        assert name.split(": ")[1] not in text, name
    assert "add_vs_torch: 2.000x" not in text  # a hidden test's message
    assert "after_deadline" in text or "after the deadline" in text

    _, page = world.save("prof", f"/submissions/{sub}")
    dom = browser.dom(page.as_uri())
    assert len(dom.tables) == 2
    assert [r[0] for r in dom.rows(1)] == hidden
    assert "add_vs_torch: 2.000x" in dom.text
    assert "alice" in dom.text  # staff see whose it is


def test_staff_overview_counts_per_lab_and_runner_health(world, browser):
    _, page = world.save("prof", "/staff")
    dom = browser.dom(page.as_uri())
    (lab,) = dom.rows(0)
    row = dict(zip(dom.tables[0][0], lab))
    assert row["Lab"] == "07 Toy lab"
    # 7 students, 9 submissions, 6 graded (bob's invalid run counts: it was graded)
    assert (row["Students"], row["Submissions"], row["Graded"]) == ("7", "9", "6"), row
    assert row["Pass rate"] == "50 %", row  # 8.5, 9 and 10 of 8.5 runnable
    assert row["Median score"] == "7.75", row
    assert (row["Queued"], row["Running"]) == ("2", "1"), row
    runners = {r[0]: dict(zip(dom.tables[1][0], r)) for r in dom.rows(1)}
    assert set(runners) == {"runner-cpu-0", "runner-h100-0", "runner-h100-1"}, runners
    assert runners["runner-cpu-0"]["GPU"] == "cpu" and runners["runner-h100-0"]["GPU"] == H100
    assert runners["runner-cpu-0"]["Jobs held"] == "0" and runners["runner-h100-1"]["Jobs held"] == "1"
    assert runners["runner-cpu-0"]["Last result"].endswith("UTC")
    assert re.search(r"expires in \d+ (s|min)", runners["runner-h100-1"]["Lease"]), runners  # renewing
    assert runners["runner-cpu-0"]["Lease"] == "idle"
    assert {"/api/staff/grades.csv?lab=07", "/leaderboard/07"} <= {a.get("href") for a in dom.tags("a")}


def test_leaderboard_best_run_per_student_pseudonyms_invalid_hidden_and_plot(world, browser, tmp_path):
    html, page = world.save("bob", "/leaderboard/07")
    assert html.count("<svg") == 1
    dom = browser.dom(page.as_uri())
    assert len(dom.tags("svg")) == 1
    graded = ["alice", "bob", "carol", EVIL]
    names = [r[1] for t in range(len(dom.tables)) for r in dom.rows(t)]
    assert sorted(names) == sorted(world.pseudonym(n) for n in graded), names  # one row per student
    for n in STUDENTS:
        assert n not in dom.text
    assert not dom.tags("form") and "Mark invalid" not in dom.text and "invalid" not in dom.text
    by_name = {r[1]: r for t in range(len(dom.tables)) for r in dom.rows(t)}
    assert by_name[world.pseudonym("alice")][3] == "1.5"  # her best run, not the 2.0 graded first
    assert by_name[world.pseudonym("bob")][3] == "1.2"    # the invalid 0.9 is hidden
    assert "0.9" not in " ".join(" ".join(r) for r in by_name.values())
    assert by_name[world.pseudonym("carol")][2] == H100
    # ranked per GPU model: bob leads the cpu runs, carol the H100 ones
    assert by_name[world.pseudonym("bob")][0] == "1" and by_name[world.pseudonym("carol")][0] == "1"
    assert [by_name[world.pseudonym(n)][0] for n in ("alice", EVIL)] == ["2", "3"]
    # the plot names the runs by pseudonym too (text, so readable and searchable)
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert world.pseudonym("bob") in svg and "alice" not in svg and "perf ratio" in svg

    shot = browser.screenshot(page.as_uri(), tmp_path / "artifacts" / "leaderboard-student.png")
    assert shot.stat().st_size > 20_000
    import matplotlib.image
    img = (matplotlib.image.imread(str(shot))[..., :3] * 255).round()
    for rgb in ((0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)):  # the bars: one colour per GPU model
        assert float((abs(img - rgb).max(axis=-1) <= 12).mean()) > 0.001, rgb
    assert float((abs(img - 255).max(axis=-1) <= 4).mean()) < 0.97  # not a blank page

    html, page = world.save("prof", "/leaderboard/07")
    dom = browser.dom(page.as_uri())
    rows = [dict(zip(dom.tables[t][0], r)) for t in range(len(dom.tables)) for r in dom.rows(t)]
    assert sorted(r["Student"] for r in rows) == sorted(graded + ["bob"])  # bob's invalid run is listed for staff
    (cheat,) = [r for r in rows if r["Validity"].startswith("invalid:")]
    assert cheat["Student"] == "bob" and "timer patched" in cheat["Validity"] and cheat["Perf ratio"] == "0.9"
    assert not cheat["Rank"].isdigit()
    forms = dom.tags("form")
    assert len(forms) == 4 and all(f["action"].startswith("/staff/results/") for f in forms)
    assert f"/staff/results/{world.results['bob-cheat']}/invalid" not in {f["action"] for f in forms}
    assert dom.text.count("Mark invalid") >= 4
    shot = browser.screenshot(page.as_uri(), tmp_path / "artifacts" / "leaderboard-staff.png")
    assert shot.stat().st_size > 20_000


def test_a_name_with_markup_is_text_on_every_page(world, browser):
    for who, path in (("prof", "/leaderboard/07"), ("prof", f"/submissions/{world.subs[EVIL][0]}"),
                      (EVIL, "/me"), (EVIL, f"/submissions/{world.subs[EVIL][0]}")):
        html, page = world.save(who, path)
        assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html, (who, path)
        dom = browser.dom(page.as_uri())
        assert not dom.tags("script"), (who, path)  # nothing injected
        assert EVIL in dom.text, (who, path)        # the name itself, as text


def test_staff_drill_into_a_lab_and_a_wrong_token_is_told_so(world, browser, tmp_path):
    """Issue 33.5: /staff links each lab to /staff/labs/NN, each student's newest
    submission (whole id, state, score); a sign-in with a wrong token shows the form
    with an error. Issue 33.1: a CPU-graded result says its GPU points are not run yet."""
    _, page = world.save("prof", "/staff")
    assert "/staff/labs/07" in {a.get("href") for a in browser.dom(page.as_uri()).tags("a")}
    _, page = world.save("prof", "/staff/labs/07")
    dom = browser.dom(page.as_uri())
    rows = {r[0]: dict(zip(dom.tables[0][0], r)) for r in dom.rows()}
    assert set(rows) == {n for n in STUDENTS}, rows
    for name, ids in world.subs.items():
        assert rows[name]["Submission"] == ids[-1]  # the newest, whole
    assert rows["bob"]["Score"] == "9 / 10" and rows["dave"]["State"].startswith("queued")
    assert rows["alice"]["Status"].startswith("ok")
    _, page = world.save("alice", f"/submissions/{world.subs['alice'][0]}")
    assert "GPU tests not run yet: 1.5 points" in browser.dom(page.as_uri()).text  # 10 - 8.5 runnable
    r = httpx.post(f"{world.base}/login", data={"token": "not-a-token"})
    assert r.status_code == 401 and "labs_token" not in r.cookies
    bad = tmp_path / "login-error.html"
    bad.write_text(r.text, encoding="utf-8")
    dom = browser.dom(bad.as_uri())
    assert "That token is not valid" in dom.text and [i.get("name") for i in dom.tags("input")] == ["token"]
