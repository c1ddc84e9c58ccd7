"""The course server from the command line, as staff and a student use it: `labs roster
import`, `labs serve --runner local`, `labs login`, `labs submit`, `labs status`,
`labs leaderboard`, `labs regrade`, `labs calibrate` (no GPU here: it says so)."""
from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import TOY_SOLUTION


def labs(cwd, *args, env=None, timeout=300):
    env = dict(env or os.environ)
    env["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}"  # nbgrader runs alembic
    return subprocess.run([sys.executable, "-m", "harness", "--course", str(cwd), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served(toy_course, tmp_path):
    """`labs serve --runner local --gpus cpu:1` on the toy course; yields (url, db, tokens)."""
    db = f"sqlite:///{tmp_path / 'server.db'}"
    roster = tmp_path / "roster.csv"
    roster.write_text("name,email,role\nalice,alice@uni.edu,\nbob,,\nprof,,staff\n")
    tokens_file = tmp_path / "tokens.csv"
    p = labs(toy_course, "roster", "import", str(roster), "--db", db, "--tokens", str(tokens_file))
    assert p.returncode == 0, p.stderr
    assert "3 new account(s), 0 existed" in p.stdout
    assert oct(tokens_file.stat().st_mode & 0o777) == "0o600"
    tokens = {r["name"]: r["token"] for r in csv.DictReader(tokens_file.open())}
    p = labs(toy_course, "roster", "import", str(roster), "--db", db, "--tokens", str(tmp_path / "again.csv"))
    assert "0 new account(s), 3 existed (tokens unchanged); no tokens file written" in p.stdout  # a re-import is safe
    assert not (tmp_path / "again.csv").exists()
    port = _free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--course", str(toy_course), "serve", "--db", db,
                             "--port", str(port), "--runner", "local", "--gpus", "cpu:1"],
                            cwd=toy_course, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("labs serve did not answer: " + (tmp_path / "serve.log").read_text())
    yield url, db, tokens
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


def test_a_student_submits_from_a_checkout_and_follows_it_to_the_graded_table(served, toy_course, tmp_path):
    url, db, tokens = served
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "LABS_PROGRESS": "off"}
    env.pop("LABS_SERVER", None), env.pop("LABS_TOKEN", None)
    p = labs(toy_course, "submit", "07", env=env)
    assert p.returncode == 2 and "no course server or token" in p.stderr and "labs login" in p.stderr
    p = labs(toy_course, "login", "--server", url, "--token", "wrong", env=env)
    assert p.returncode == 2 and "401" in p.stderr
    p = labs(toy_course, "login", "--server", url, "--token", tokens["alice"], env=env)
    assert p.returncode == 0, p.stderr
    (toy_course / "labs/07/toy.py").write_text(TOY_SOLUTION)  # alice's finished lab
    (toy_course / "labs/07/notes.txt").write_text("my notes: never uploaded")
    p = labs(toy_course, "submit", "07", env=env)
    assert p.returncode == 0, p.stderr
    sub_id = p.stdout.split("submitted lab 07: ")[1].split()[0]
    p = labs(toy_course, "submit", "07", env=env)  # the same module again: not queued twice
    assert "the same module as an earlier submission" in p.stdout and sub_id in p.stdout
    p = labs(toy_course, "status", sub_id, "--wait", env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"lab 07 submission {sub_id}: done" in p.stdout
    assert "score 6.5 / 10 (8.5 runnable on cpu); ok" in p.stdout
    out = " ".join(p.stdout.split())
    assert "GPU tests not run yet: 1.5 points" in out  # a CPU runner: the GPU test is still to come, not a 0
    # the course's actual policy, in one line: after_deadline, and lab 07 has no deadline
    assert "shown after lab 07's deadline, and it has none set yet (hidden_results: after_deadline)" in out
    p = labs(toy_course, "status", sub_id[:8], env=env)  # a unique prefix names it
    assert p.returncode == 0 and f"submission {sub_id}: done" in p.stdout, p.stderr
    p = labs(toy_course, "status", sub_id, "--json", env=env)
    view = json.loads(p.stdout)
    assert view["result"]["parts"] == {"A": 4.5, "B": 2.0} and "tests" not in view["result"]
    p = labs(toy_course, "status", env=env)
    assert sub_id in p.stdout
    # bob cannot see alice's submission, not even by its id
    p = labs(toy_course, "status", sub_id, "--server", url, "--token", tokens["bob"], env=env)
    assert p.returncode == 2 and "404" in p.stderr
    # what the server stored is the module it validated, alone
    from sqlalchemy import create_engine, text
    blob = create_engine(db).connect().execute(text("select blob from submissions")).scalar_one()
    assert blob == (toy_course / "labs/07/toy.py").read_bytes()

    # staff: the leaderboard and a regrade
    p = labs(toy_course, "leaderboard", "show", "--lab", "07", "--db", db)
    assert p.returncode == 0 and "alice" in p.stdout and "2" in p.stdout
    p = labs(toy_course, "regrade", "--lab", "07", "--db", db)
    assert "1 regrade job(s) queued for lab 07" in p.stdout
    r = httpx.get(f"{url}/api/staff/grades.csv", params={"lab": "07"},
                  headers={"Authorization": f"Bearer {tokens['prof']}"})
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(x["student"], float(x["score"])) for x in rows] == [("alice", 6.5)]
    book = f"sqlite:///{tmp_path / 'gradebook.db'}"
    p = labs(toy_course, "gradebook-push", "--lab", "07", "--gradebook", book, "--db", db)
    assert p.returncode == 0 and "1 grade(s) of lab 07 recorded" in p.stdout, p.stderr
    from nbgrader.api import Gradebook
    with Gradebook(book) as gb:
        assert gb.find_submission("lab07", "alice").score == pytest.approx(6.5)


def test_calibrate_without_a_gpu_says_so_and_prints_the_cpu_ratios(toy_course, tmp_path):
    out = tmp_path / "calibrate.json"
    p = labs(toy_course, "calibrate", "--lab", "07", "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "no GPU" in p.stderr and "only the CPU perf tests run here" in p.stderr
    assert "add_vs_torch" in p.stdout and "2.000" in p.stdout and "2.6 / 7.8" in p.stdout
    got = json.loads(out.read_text())
    row = got["labs"][0]["perf"]["add_vs_torch"]
    assert row["ratio"] == 2.0 and row["credit"] == 0.5 and got["host"]["gpu_model"] == "cpu"
    assert got["labs"][0]["not_run"] == []  # only the perf tests ran (the toy lab has no GPU perf test)


def test_runner_token_comes_from_a_private_file_never_the_command_line(toy_course, tmp_path):
    """`labs runner` has no --token: the token is in $LABS_RUNNER_TOKEN or a 0600 file; a file
    others can read is refused, naming it and the fix, before anything starts."""
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != "LABS_RUNNER_TOKEN"}
    args = ("runner", "--broker", "redis://127.0.0.1:1/0", "--server", "http://127.0.0.1:1")
    r = labs(toy_course, *args, "--token-file", str(token), env=env)
    assert r.returncode != 0 and "mode 0644 lets other users read the token" in r.stderr and "chmod 600" in r.stderr
    r = labs(toy_course, *args, "--token", "s3cret", env=env)
    assert r.returncode != 0 and "No such option '--token'" in r.stderr
    r = labs(toy_course, *args, env=env)
    assert r.returncode != 0 and "labs runner needs --token-file" in r.stderr
    from harness.cli.runner import read_token_file
    token.chmod(0o600)
    assert read_token_file(token) == "s3cret"
