"""Grading in the course's container image (harness/container.py, docker/).

Tests marked ``docker`` need a Docker engine and the CPU grading image. They
reuse the image when it exists (CI builds it once, in .ci/run) and build it
once per session otherwise. Without an engine they skip here, and FAIL under
CI (env ``CI`` set): a CI run must never pass by skipping them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness import container, grading, manifest

ROOT = Path(__file__).resolve().parents[1]
COURSE = manifest.load(ROOT)


# --- without an engine ---------------------------------------------------------

def _pins(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==")
            out[name.strip().lower().replace("_", "-")] = version.strip()
    return out


def test_lock_pins_every_installed_project_dependency_and_one_torch():
    import re
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins((ROOT / "docker/requirements.lock").read_text())
    extras = project["optional-dependencies"]  # those that `make setup` and the images install
    wanted = project["dependencies"] + extras["triton"] + extras["dev"]
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in wanted}
    missing = sorted(names - set(pins) - {"torch"})
    assert not missing, f"docker/requirements.lock has no pin for {missing}: add them (the images and make setup use it)"
    assert extras["triton"] == [f"triton=={pins['triton']}"], "pyproject's triton extra and the lock disagree"
    cpu, cuda = (_pins((ROOT / f"docker/torch-{f}.txt").read_text()) for f in ("cpu", "cuda"))
    assert cpu == {"torch": "2.13.0+cpu"} and cuda == {"torch": "2.13.0"}, \
        "one torch version for every flavour, the CPU build pinned as such (docker/torch-*.txt)"


CUDA_USER_SPACE = re.compile(r"^(nvidia-.*|cuda-(toolkit|bindings|pathfinder|python)|nvidia)$")


def _install_set(torch_file: str, *, pypi: bool) -> dict:
    """What pip would install for the course's runtime (torch from ``torch_file``, the
    project's dependencies and the triton extra, under the lock): ``{name: version}``.
    ``pypi``: resolve against PyPI alone (the CUDA image's build: no local +cpu wheel)."""
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["triton"]
    cmd = [sys.executable, "-m", "pip"] + (["--isolated"] if pypi else []) + [
        "install", "--dry-run", "--ignore-installed", "--quiet", "--report", "-",
        "-c", str(ROOT / "docker/requirements.lock"), "-r", str(ROOT / "docker" / torch_file), *reqs]
    if pypi:
        cmd += ["--index-url", "https://pypi.org/simple"]
        cert = os.environ.get("PIP_CERT")
        cmd += ["--cert", cert] if cert else []
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"pip could not resolve the {torch_file} install set:\n{p.stderr[-3000:]}"
    report = json.loads(p.stdout)
    return {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}


def test_cpu_and_cuda_install_sets_differ_only_in_cuda_user_space_packages():
    """One lock (issue: the CUDA image on the same torch): pip resolves the CPU install
    (`make setup`, the CPU image: the +cpu wheel) and the CUDA image's install (PyPI's
    wheel of the same torch) under docker/requirements.lock; they differ only in the CUDA
    user-space packages the CUDA wheel pins itself, and torch's local +cpu label."""
    cpu = _install_set("torch-cpu.txt", pypi=False)
    cuda = _install_set("torch-cuda.txt", pypi=True)
    assert cpu["torch"] == "2.13.0+cpu" and cuda["torch"] == "2.13.0", (cpu["torch"], cuda["torch"])
    assert cpu["triton"] == cuda["triton"] == _pins((ROOT / "docker/requirements.lock").read_text())["triton"]
    only_cuda = sorted(set(cuda) - set(cpu))
    assert only_cuda and all(CUDA_USER_SPACE.match(n) for n in only_cuda), f"not CUDA user space: {only_cuda}"
    assert not set(cpu) - set(cuda), f"only in the CPU set: {sorted(set(cpu) - set(cuda))}"
    differ = {n: (cpu[n], cuda[n]) for n in cpu if n != "torch" and cpu[n] != cuda[n]}
    assert not differ, f"the two install sets pin these differently: {differ}"


def test_gpu_check_says_where_and_on_what_it_grades_and_that_a_cpu_machine_has_nothing_to_check():
    p = subprocess.run([sys.executable, str(ROOT / "scripts/gpu_check.py"), "--sandbox", "process"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    first = p.stdout.splitlines()[0]
    assert first.startswith("gpu check: grading in this machine's Python") and "torch 2.13.0+cpu (CUDA none)" in first
    assert "triton 3.7.1" in first and "nothing to check" in p.stdout and "note:" not in p.stdout


def test_unknown_sandbox_is_refused(tmp_path):
    lab = COURSE.lab("04")
    with pytest.raises(ValueError, match="sandbox must be one of docker, process"):
        grading.run(COURSE, lab, tmp_path, tmp_path / "r.json", 1, sandbox="vm")


def test_grade_without_an_engine_notes_it_and_grades_in_process(toy_course, tmp_path):
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    p = subprocess.run([sys.executable, "-m", "harness", "grade", "solutions", "--lab", "07", "--json",
                        str(tmp_path / "r.json")], cwd=toy_course, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "labs: note: no Docker engine answers" in p.stderr and "grading in a local process" in p.stderr
    assert json.loads((tmp_path / "r.json").read_text())["score"] > 0
    p = subprocess.run([sys.executable, "-m", "harness", "grade", "solutions", "--lab", "07", "--sandbox", "docker"],
                       cwd=toy_course, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stderr.startswith("labs: error: no Docker engine answers"), p.stderr


# --- with an engine and the image ------------------------------------------------

@pytest.fixture(scope="session")
def client():
    try:
        return container.engine()
    except container.ContainerError as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e}: CI must run the container tests (.ci/run starts the engine)", pytrace=False)
        pytest.skip(f"{e} (start one with docker/start-engine.sh)")


@pytest.fixture(scope="session")
def image(client):
    """The CPU grading image: reused when present, else built once (a lock file
    keeps xdist workers from building it twice)."""
    from filelock import FileLock
    name = COURSE.images.cpu
    with FileLock(os.path.join(tempfile.gettempdir(), "ai-infra-labs-image.lock")):
        try:
            return client.images.get(name)
        except Exception:
            pass
        built = container.build_image(COURSE, log=lambda m: print(m, file=sys.stderr))
        return client.images.get(built.tag)


def _labs_with_reference():
    return [n for n, lab in sorted(COURSE.labs.items())
            if (ROOT / "graders" / n).is_dir() and (ROOT / "solutions" / n / lab.filename).is_file()
            and (ROOT / "labs" / n / lab.filename).is_file()]


def _sh(client, image, script: str, user: str = "10001") -> str:
    out = client.containers.run(image.id, ["python", "-c", script], user=user, network_mode="none", remove=True,
                                stdout=True, stderr=True)
    return out.decode()


@pytest.mark.docker
def test_student_uid_reads_stubs_and_worker_harness_but_no_graders_solutions_or_oracles(client, image):
    out = _sh(client, image, r"""
import os, pwd, pathlib
print("user", pwd.getpwuid(os.getuid()).pw_name, os.getuid())
for p in ["/opt/course/graders", "/opt/course/graders/04"]:
    try:
        os.listdir(p); print("LISTED", p)
    except PermissionError:
        print("denied", p)
try:
    open("/opt/course/graders/04/conftest.py").read(); print("READ grader")
except PermissionError:
    print("denied grader file")
print("stub", len(open("/opt/course/labs/04/flash_attention.py").read()) > 0)
import harness.sandbox, harness.impl, harness.alloc
print("harness ok")
for name in ("harness.grading", "harness.oracles", "harness.testing", "harness.toolkit"):
    try:
        __import__(name); print("IMPORTED", name)
    except (PermissionError, ImportError):
        print("denied", name)
""")
    assert "user student 10001" in out
    assert "denied /opt/course/graders" in out and "LISTED" not in out and "READ" not in out
    assert "stub True" in out and "harness ok" in out  # what a worker stages: the allow-listed modules
    assert "IMPORTED" not in out, out  # grader-side modules are root-only in the image
    # as root: the graders are there (mode 0700 / 0600), the solutions nowhere
    out = _sh(client, image, r"""
import os, pathlib, stat
g = pathlib.Path("/opt/course/graders")
print("graders", sorted(p.name for p in g.iterdir()))
bad = [str(p) for p in [g, *g.rglob("*")] if p.stat().st_mode & 0o077]
print("group/other bits", bad)
hits = [str(p) for top in ("/opt", "/usr", "/tmp", "/root", "/home") for p in pathlib.Path(top).rglob("solutions")]
print("solutions", hits)
""", user="0")
    assert "'04'" in out and "group/other bits []" in out and "solutions []" in out, out


# labs whose stub is graded in the container too: multi-rank (01: its W ranks fail under the
# container's pids and memory limits) and Triton (04); every lab's stub scores 0 in the process
# sandbox (tests/test_labs.py), and a stub costs a container run as long as the reference's
STUB_IN_CONTAINER = ("01", "04")


@pytest.mark.docker
@pytest.mark.parametrize("number", _labs_with_reference())
def test_reference_scores_max_runnable_and_stub_zero_in_the_container(image, number):
    lab = COURSE.lab(number)
    ref = grading.grade(ROOT / "solutions", lab, COURSE, sandbox="docker")
    failed = [f"{t.name}: {t.outcome}: {t.output[:300]}" for t in ref.tests if t.runnable and t.outcome != "passed"]
    assert not failed and ref.score == pytest.approx(ref.max_score_runnable + ref.bonus_runnable), \
        "\n".join(failed + ref.notes)
    if number not in STUB_IN_CONTAINER:
        return
    stub = grading.grade(ROOT / "labs", lab, COURSE, sandbox="docker")
    assert stub.score == 0 and len(stub.tests) == len(ref.tests)
    assert all(t.outcome in ("failed", "error", "not_run") for t in stub.tests)
    assert "/labs-submission" not in json.dumps(stub.to_json())  # messages name the host's paths


SLEEPER = "import time\ntime.sleep(10 ** 6)  # never returns\n"


def _submission(tmp_path: Path, source: str) -> Path:
    lab = COURSE.lab("04")
    sub = tmp_path / "submission"
    (sub / "04").mkdir(parents=True)
    (sub / "04" / lab.filename).write_text(source)
    return sub


def _left_behind(client, seed: int) -> list:
    return client.containers.list(all=True, filters={"label": f"ai-infra-labs.seed={seed}"})


@pytest.mark.docker
def test_submission_that_sleeps_forever_is_stopped_by_the_timeout_and_gets_a_row(client, image, tmp_path):
    lab = COURSE.lab("04")
    t0 = time.monotonic()
    r = grading.grade(_submission(tmp_path, SLEEPER), lab, COURSE, seed=1234567, timeout_s=45, sandbox="docker")
    assert time.monotonic() - t0 < 45 + 60
    assert r.score == 0 and r.tests, "every grader test still has a row"
    assert any("exceeded its 45 s limit" in n for n in r.notes), r.notes
    not_run = [t for t in r.tests if t.outcome == "not run"]
    assert not_run and all("exceeded its 45 s limit" in t.output for t in not_run)
    assert not _left_behind(client, 1234567), "the container is removed"


@pytest.mark.docker
def test_backstop_kills_a_container_that_outlives_its_limit(client, image, tmp_path):
    lab = COURSE.lab("04")
    work = tmp_path / "work"
    work.mkdir()
    impl_root = grading.stage(grading.find_module(_submission(tmp_path, SLEEPER), lab), lab, work)
    t0 = time.monotonic()
    raw, note = container.run(COURSE, lab, impl_root, work / "results.json", 7654321, timeout_s=900,
                              kill_after_s=50)
    assert time.monotonic() - t0 < 50 + 30
    assert "exceeded its 50 s limit and was stopped" in note
    tests = grading.score(raw, lab, note)
    # the backstop stops the run; a test that began before it failed on the import's own time limit (the
    # sleeper waits: the call watch gives up on it after call_timeout_s, which on a loaded box can come first)
    assert tests and all(t.outcome == "not run" or t.impl_error == "timeout" for t in tests
                         if t.outcome != "not_run")
    assert not _left_behind(client, 7654321)


NET_PROBE = '''\
import os, socket
try:
    socket.create_connection(("pypi.org", 443), timeout=5).close()
    got = "CONNECTED"
except OSError as e:
    got = f"no connection ({type(e).__name__})"
raise RuntimeError(f"netprobe: {got}; interfaces {sorted(os.listdir('/sys/class/net'))}")
'''


@pytest.mark.docker
def test_submission_gets_no_network_in_the_container(image, tmp_path):
    r = grading.grade(_submission(tmp_path, NET_PROBE), COURSE.lab("04"), COURSE, sandbox="docker", timeout_s=300)
    out = "\n".join(t.output for t in r.tests)
    assert "netprobe: no connection" in out and "CONNECTED" not in out, out[:2000]
    assert "interfaces ['lo']" in out
    assert r.score == 0


@pytest.mark.docker
def test_missing_image_is_a_one_line_error_naming_labs_image_build(client, toy_course, tmp_path):
    yaml = toy_course / "labs.yaml"
    yaml.write_text(yaml.read_text() + "images: {cpu: 'ai-infra-labs:no-such-image', gpu: 'ai-infra-labs:no-such-gpu'}\n")
    p = subprocess.run([sys.executable, "-m", "harness", "grade", "solutions", "--lab", "07", "--sandbox", "docker"],
                       cwd=toy_course, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1
    assert p.stderr.splitlines()[0] == ("labs: error: grading image ai-infra-labs:no-such-image not found; "
                                        "staff: run `labs image build`"), p.stderr
    p = subprocess.run([sys.executable, "-m", "harness", "grade", "solutions", "--lab", "07"],
                       cwd=toy_course, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "no image ai-infra-labs:no-such-image" in p.stderr
