"""`labs gradescope build`: the autograder zip's contents, and its run_autograder
run locally (AUTOGRADER_ROOT) against submissions laid out as /autograder/submission."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import zipfile

import pytest

from tests.conftest import ROOT, TOY_SOLUTION, TOY_STUB

VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}


def labs(cwd, *args):
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def check_results_schema(r: dict) -> None:
    """Gradescope's results.json: the fields it reads, with their types."""
    assert isinstance(r["score"], (int, float))
    assert r.get("visibility", "visible") in VISIBILITIES
    assert r.get("stdout_visibility", "visible") in VISIBILITIES
    assert isinstance(r["tests"], list)
    for t in r["tests"]:
        assert isinstance(t["name"], str) and isinstance(t["output"], str)
        assert isinstance(t["score"], (int, float)) and isinstance(t["max_score"], (int, float))
        assert t.get("status", "passed") in ("passed", "failed") and t["visibility"] in VISIBILITIES
        if "status" not in t:  # not run here (a GPU test on a CPU worker): neutral, worth nothing here
            assert t["max_score"] == 0 and t["extra_data"]["not_run_points"] > 0 and "not run here" in t["output"]
        assert isinstance(t.get("tags", []), list)
    for e in r.get("leaderboard", []):
        assert isinstance(e["name"], str) and isinstance(e["value"], (int, float, str))
        assert e.get("order", "desc") in ("asc", "desc")
    json.dumps(r)


@pytest.fixture
def autograder(toy_course, tmp_path):
    """The toy lab's zip unpacked as AUTOGRADER_ROOT/source; returns a runner."""
    z = tmp_path / "ag.zip"
    p = labs(toy_course, "gradescope", "build", "--lab", "07", "--out", str(z))
    assert p.returncode == 0, p.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(z) as zf:
        zf.extractall(root / "source")
        for info in zf.infolist():  # zipfile drops the mode bits; Gradescope keeps them
            mode = info.external_attr >> 16
            if mode:
                os.chmod(root / "source" / info.filename, stat.S_IMODE(mode))

    def run(files: dict[str, str]) -> dict:
        import shutil
        for d in ("submission", "results"):
            shutil.rmtree(root / d, ignore_errors=True)
        (root / "submission").mkdir()
        for rel, text in files.items():
            (root / "submission" / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / "submission" / rel).write_text(text)
        shutil.copy(root / "source/run_autograder", root / "run_autograder")  # as Gradescope does
        env = {**os.environ, "AUTOGRADER_ROOT": str(root), "LABS_PYTHON": sys.executable}
        env.pop("LABS_COURSE", None)
        p = subprocess.run(["bash", str(root / "run_autograder")], cwd=root, env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stdout + p.stderr
        r = json.loads((root / "results/results.json").read_text())
        check_results_schema(r)
        return r

    run.root = root
    return run


def test_zip_holds_scripts_harness_and_this_labs_graders_only(toy_course, tmp_path):
    (toy_course / "graders/08").mkdir()
    (toy_course / "graders/08/test_other.py").write_text("x = 1\n")
    p = labs(toy_course, "gradescope", "build", "--lab", "7", "--out", str(tmp_path / "ag.zip"))
    assert p.returncode == 0 and "wrote" in p.stdout, p.stderr
    with zipfile.ZipFile(tmp_path / "ag.zip") as zf:
        names = set(zf.namelist())
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
        setup = zf.read("setup.sh").decode()
        secret = zf.read(".labs-staff/course-secret")
    # the course's grading secret travels, so a Gradescope regrade gets the same hidden inputs
    assert secret == (toy_course / ".labs-staff/course-secret").read_bytes()
    assert {"setup.sh", "run_autograder", "labs.yaml", "graders/07/test_toy.py", "labs/07/toy.py",
            "harness/grading.py", "harness/plugin.py", "pyproject.toml"} <= names
    assert not any(n.startswith(("solutions/", "graders/08", "tests/")) for n in names)
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert "torch==2.13.0" in setup and "download.pytorch.org/whl/cpu" in setup


def test_build_writes_to_labs_staff_warns_of_gpu_points_and_refuses_other_places(toy_course, tmp_path,
                                                                                 monkeypatch):
    from click.testing import CliRunner

    from harness.cli import main
    monkeypatch.chdir(toy_course)
    build = lambda *a: CliRunner().invoke(main, ["gradescope", "build", "--lab", "07", *a])
    r = build()
    assert r.exit_code == 0, r.stderr
    assert (toy_course / ".labs-staff/gradescope-lab07.zip").is_file()  # git-ignored, never released
    assert not list(toy_course.glob("*.zip"))
    assert ("labs: warning: 1.5 of lab 07's 10 points need a GPU, and Gradescope's workers have none" in r.stderr
            and "rescale the assignment to the runnable maximum (8.5 points" in r.stderr)
    for out, message in (("x.zip", "labs: error: --out x.zip is inside the course tree"),
                         (str(tmp_path / "no/ag.zip"), "does not exist")):
        r = build("--out", out)
        assert r.exit_code == 2 and message in r.stderr.splitlines()[0], r.stderr
        assert not (toy_course / "x.zip").exists() and not (tmp_path / "no").exists()


def test_real_lab_04_zip_pins_torch_and_installs_triton(tmp_path):
    p = labs(ROOT, "gradescope", "build", "--lab", "04", "--out", str(tmp_path / "ag.zip"))
    assert p.returncode == 0, p.stderr
    with zipfile.ZipFile(tmp_path / "ag.zip") as zf:
        names = set(zf.namelist())
        setup, run = zf.read("setup.sh").decode(), zf.read("run_autograder").decode()
    graders = {f"graders/04/{p.name}" for p in (ROOT / "graders/04").glob("*.py")}
    assert graders and graders <= names and "labs/04/flash_attention.py" in names
    assert not any(n.startswith("solutions/") for n in names)
    assert '"torch==2.13.0+cpu"' in setup and '/autograder/source[triton]' in setup
    if (ROOT / "docker/requirements.lock").is_file():
        assert "docker/requirements.lock" in names and "-c docker/requirements.lock" in setup
    assert "--json \"$RESULTS/labs-grade.json\"" in run and "submission's flash_attention.py" in run
    assert 'grade "$SUB" --lab "$LAB"' in run and "LAB=04" in run


def test_run_autograder_reference_checkout_full_runnable_marks(autograder):
    r = autograder({"labs/07/toy.py": TOY_SOLUTION, "README.md": "hi"})
    assert r["score"] == pytest.approx(6.5)  # the GPU test cannot run here; perf at half credit
    check, *tests = r["tests"]
    assert check["name"] == "Submission check" and check["visibility"] == "visible"
    assert "Graded labs/07/toy.py" in check["output"]
    assert {t["visibility"] for t in tests} == {"after_published"} and len(tests) == 4
    assert r["leaderboard"] == [{"name": "add_vs_torch", "value": 2.0, "order": "asc"}]
    assert r["extra_data"]["max_score_runnable"] == pytest.approx(8.5)
    assert (autograder.root / "results/labs-grade.log").is_file()


def test_run_autograder_flat_stub_scores_zero(autograder):
    r = autograder({"toy.py": TOY_STUB})
    assert r["score"] == 0 and "Graded toy.py" in r["tests"][0]["output"]
    assert any("NotImplementedError" in t["output"] for t in r["tests"][1:])


def test_run_autograder_without_the_module_says_what_to_upload(autograder):
    r = autograder({"notes.txt": "oops"})
    assert r["score"] == 0
    assert r["tests"][0]["status"] == "failed" and "No toy.py in your upload" in r["tests"][0]["output"]


def test_run_autograder_writes_results_when_grading_itself_fails(autograder):
    (autograder.root / "source/graders/07/test_broken.py").write_text("import nonexistent_module\n")
    r = autograder({"toy.py": TOY_SOLUTION})
    assert r["score"] == 0 and r["tests"] == []
    assert "could not grade" in r["output"] and "graders failed to collect" in r["output"]


@pytest.mark.parametrize("files, expect", [
    ({"hw/wrapper/toy.py": TOY_SOLUTION, "hw/wrapper/deeper/toy.py": TOY_STUB}, "graded"),
    ({"a/toy.py": TOY_SOLUTION, "b/toy.py": TOY_STUB}, "2 files named toy.py equally deep"),
], ids=["nested", "ambiguous"])
def test_labs_grade_grade_all_and_gradescope_place_a_submission_alike(autograder, toy_course, tmp_path, files, expect):
    """One rule (harness.impl.locate) for every command: the same nested upload gets the
    same score, and the same ambiguous one the same clear error, from `labs grade`,
    `labs grade-all` and the Gradescope autograder."""
    sub = tmp_path / "class" / "frank"
    for rel, text in files.items():
        (sub / rel).parent.mkdir(parents=True, exist_ok=True)
        (sub / rel).write_text(text)
    p = labs(toy_course, "grade", str(sub), "--lab", "07", "--json", str(tmp_path / "one.json"))
    assert p.returncode == 0, p.stderr
    one = json.loads((tmp_path / "one.json").read_text())
    p = labs(toy_course, "grade-all", str(tmp_path / "class"), "--lab", "07", "--out", str(tmp_path / "all"))
    assert p.returncode == 0, p.stderr
    row = json.loads((tmp_path / "all/students/frank/results.json").read_text())
    ag = autograder(files)
    if expect == "graded":
        assert one["extra_data"]["module"] == "hw/wrapper/toy.py"
        assert one["score"] == row["score"] == ag["score"] > 0
        assert "Graded hw/wrapper/toy.py" in ag["tests"][0]["output"]
    else:
        assert expect in one["output"] and expect in row["extra_data"]["status"] and expect in ag["output"]
        assert one["score"] == ag["score"] == 0 and row["score"] == 0.0


def test_results_totals_agree_gpu_tests_are_not_failed_and_leaderboard_names_are_unique():
    """results.json's score is the sum of its tests' scores (unrounded: no rounding drift,
    the same as grades.csv's and the gradebook's part subtotals); a test that needs a GPU
    this machine lacks is neutral (no status, max_score 0, its worth noted), never
    "failed"; a perf figure recorded by several cases is listed once per case."""
    from harness import records
    from harness.grading import GradeResult, TestResult
    third = 10 / 3
    t = lambda name, part, score, outcome="passed", perf=(): TestResult(
        name=name, nodeid=name, part=part, max_score=third, score=score, outcome=outcome, perf=list(perf))
    tests = [t(f"test_x[{i}]", "A", third, perf=[{"name": "speed", "ratio": 1.0 + i}]) for i in range(3)] \
        + [t("test_gpu", "B", 0.0, outcome="skipped")]
    res = GradeResult("07", "s", 1, tests, 1.0).to_gradescope()
    assert res["score"] == round(sum(x["score"] for x in res["tests"]), 4) == sum(records.part_scores(res).values())
    gpu = res["tests"][-1]
    assert "status" not in gpu and gpu["max_score"] == 0 and gpu["extra_data"]["not_run_points"] == third
    assert [e["name"] for e in res["leaderboard"]] == ["speed [0]", "speed [1]", "speed [2]"]
    check_results_schema(res)


# --- the Gradescope bridge: GPU tests forwarded to the course server ---------------------

def _bridge_server(course_root, tmp_path):
    """The course server on a free loopback port with one embedded dispatcher (threads);
    returns (url, bridge token, stop)."""
    import socket
    import threading
    import time

    import uvicorn

    from harness import manifest
    from harness.server import app as server_app, runner, service

    course = manifest.load(course_root)
    url = f"sqlite:///{tmp_path / 'server.db'}"
    app = server_app.create_app(course, url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    with app.state.sessions() as s:
        token = service.add_account(s, "gradescope", "bridge", b"k", now=time.time())
    dispatcher = runner.Dispatcher(url, course, "test-gpu-host", poll_s=0.2)
    threading.Thread(target=dispatcher.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)

    def stop():
        dispatcher.stop.set()
        server.should_exit = True
    return f"http://127.0.0.1:{port}", token, stop, app


def _autograder_with_server(toy_course, tmp_path, server_url, token):
    z = tmp_path / "ag-server.zip"
    p = labs(toy_course, "gradescope", "build", "--lab", "07", "--out", str(z), "--server", server_url,
             "--server-token", token)
    assert p.returncode == 0, p.stderr
    assert "graded on the course server" in p.stdout
    root = tmp_path / "ag"
    with zipfile.ZipFile(z) as zf:
        assert json.loads(zf.read("server.json")) == {"url": server_url, "token": token}
        zf.extractall(root / "source")
    (root / "submission/labs/07").mkdir(parents=True)
    (root / "submission/labs/07/toy.py").write_text(TOY_SOLUTION)
    (root / "submission_metadata.json").write_text(json.dumps({"users": [{"name": "Ada L", "email": "ada@uni.edu"}]}))
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "LABS_PYTHON": sys.executable}
    env.pop("LABS_COURSE", None)
    p = subprocess.run(["bash", str(root / "source/run_autograder")], cwd=root, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads((root / "results/results.json").read_text())
    check_results_schema(r)
    return r, root


def test_gradescope_forwards_the_module_to_the_course_server_and_reports_its_grade(toy_course, tmp_path):
    from sqlalchemy import select

    from harness.server import db
    url, token, stop, app = _bridge_server(toy_course, tmp_path)
    try:
        r, root = _autograder_with_server(toy_course, tmp_path, url, token)
    finally:
        stop()
    check = r["tests"][0]
    assert "Graded on the course's GPU runners (cpu)" in check["output"], check["output"]
    assert r["score"] == pytest.approx(6.5) and len(r["tests"]) == 5
    with app.state.sessions() as s:  # the student Gradescope named, one submission, graded once
        acc = s.scalar(select(db.Account).where(db.Account.email == "ada@uni.edu"))
        assert acc is not None and acc.role == "student" and acc.name == "Ada L"
        subs = s.scalars(select(db.Submission).where(db.Submission.account_id == acc.id)).all()
        assert len(subs) == 1 and len(subs[0].jobs) == 1 and subs[0].jobs[0].result.runner == "test-gpu-host"


def test_gradescope_says_why_the_gpu_tests_were_not_run(toy_course, tmp_path, autograder):
    r = autograder({"labs/07/toy.py": TOY_SOLUTION})  # no server in the zip
    assert "The GPU tests (1.5 points) were not run: Gradescope has no GPU and this autograder forwards to no " \
           "course server" in r["tests"][0]["output"]
    import socket
    with socket.socket() as s:  # a server that is not there: the local grade stands, with the reason
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    r, _ = _autograder_with_server(toy_course, tmp_path, dead, "tok")
    assert r["score"] == pytest.approx(6.5)
    assert "The GPU tests were not run: the course server" in r["tests"][0]["output"]
    assert "could not be reached" in r["tests"][0]["output"]


def test_bridge_routes_need_the_bridge_token(toy_course, tmp_path):
    import httpx
    url, token, stop, _ = _bridge_server(toy_course, tmp_path)
    try:
        files = {"file": ("07.tar.gz", b"x")}
        assert httpx.post(f"{url}/api/bridge/submissions", data={"lab": "07", "email": "a@b"}, files=files,
                          headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/api/bridge/submissions/x", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/api/bridge/submissions/nope",
                         headers={"Authorization": f"Bearer {token}"}).status_code == 404
    finally:
        stop()
