"""Issue 34.6: "not verified here" is its own status. On a device model the perf
thresholds were not calibrated on (`perf_calibrated_on` in labs.yaml; the model faked
with LABS_GPU_MODEL), the course server's real grading pipeline grades correctness and
reports the perf test `not_run` with its reason, as the GPU test on a host without one:
in the API, `labs status` and the submission page (headless Chromium), never a
failure and never a pass."""
from __future__ import annotations

import os

import pytest

if not os.environ.get("CI"):
    pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from harness import manifest  # noqa: E402
from harness.cli import submit as submit_cli  # noqa: E402
from harness.server import app as app_mod, runner, service  # noqa: E402
from tests.conftest import TOY_SOLUTION  # noqa: E402
from tests.test_server_api import db_url, postgres  # noqa: E402,F401  (fixtures)
from tests.test_server_pages import Browser, self_contained  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def test_perf_on_an_uncalibrated_model_is_not_run_everywhere(toy_course, tmp_path, monkeypatch, capsys, db_url):
    yaml_path = toy_course / "labs.yaml"
    yaml_path.write_text(yaml_path.read_text().replace(
        "labs:\n", f"perf_calibrated_on: [{H100}]\nsubmissions: {{hidden_results: always}}\nlabs:\n", 1))
    course = manifest.load(toy_course)
    url = db_url
    app = app_mod.create_app(course, url, reap_every_s=3600)
    client = TestClient(app)
    with app.state.sessions() as s:
        token = service.add_account(s, "alice", "student", b"k", now=service.clock())
    h = {"Authorization": f"Bearer {token}"}

    def graded_on(model: str, i: int) -> dict:
        monkeypatch.setenv("LABS_GPU_MODEL", model)
        (tmp_path / f"m{i}").mkdir()
        (tmp_path / f"m{i}/toy.py").write_text(TOY_SOLUTION + f"# {i}\n")
        r = client.post("/api/submissions", data={"lab": "07"}, headers=h, files={
            "file": ("07.tar.gz", service.pack_module(tmp_path / f"m{i}/toy.py", course.lab("07")))})
        assert runner.Dispatcher(url, course, "runner-cpu-0").once()
        return client.get(f"/api/submissions/{r.json()['id']}", headers=h).json()

    view = graded_on("NVIDIA L4", 0)
    tests = {t["name"]: t for t in view["result"]["tests"]}
    speed, gpu = tests["B: test_speed"], tests["A: test_on_gpu"]
    assert speed["status"] == "not_run" and speed["score"] == 0 and speed["not_run_points"] == 4
    assert "perf thresholds are not calibrated on NVIDIA L4" in speed["not_run_reason"]
    assert gpu["status"] == "not_run" and "needs a CUDA GPU" in gpu["not_run_reason"]
    assert {tests[n]["status"] for n in ("A: test_adds", "A: test_default")} == {"passed"}  # correctness graded
    assert view["result"]["max_score_runnable"] == pytest.approx(6 - gpu["not_run_points"])

    monkeypatch.setenv("COLUMNS", "300")  # rich's tables: one line per row
    submit_cli._print(view)
    out = capsys.readouterr().out
    assert "not_run (4 points)" in out and "not verified here: perf thresholds are not calibrated" in out

    client.post("/login", data={"token": token})
    r = client.get(f"/submissions/{view['id']}")
    self_contained(r.text)
    page = tmp_path / "sub.html"
    page.write_text(r.text, encoding="utf-8")
    dom = Browser(tmp_path / "chromium").dom(page.as_uri())
    rows = {row[0]: row for row in next(t for t in dom.tables if t[0][0] == "Test")[1:]}
    assert rows["B: test_speed"][1] == "not_run (4 points)"
    assert rows["B: test_speed"][2].startswith("not verified here: perf thresholds are not calibrated on NVIDIA L4")

    calibrated = graded_on(H100, 1)  # on the calibrated model the perf test is graded (a ratio of 2.0: half credit)
    speed = next(t for t in calibrated["result"]["tests"] if t["name"] == "B: test_speed")
    assert speed["status"] in ("passed", "failed") and speed["score"] == pytest.approx(2.0)
