"""The worker's view of the disk is an allow-list, its uid is the grading's own, and a
submission's module is read safely (harness.sandbox.isolation, grading.find_module).

Tests that need namespaces skip on a host without them, except in CI (``CI=true``),
where they fail: CI must exercise the sandbox."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from harness import classroom, grading, impl as _impl
from harness.sandbox import isolation
from harness.sandbox import worker as sandbox

from .conftest import ROOT, course

TOY = textwrap.dedent('''
    import importlib, os

    def read(path):
        """A listing or the first bytes of ``path``; None when it cannot be read."""
        try:
            if os.path.isdir(path):
                return sorted(os.listdir(path))
            with open(path, "rb") as f:
                return f.read(100).decode(errors="replace")
        except OSError:
            return None

    def importable(name):
        try:
            importlib.import_module(name)
            return True
        except ImportError:
            return False

    def touch(path):
        with open(path, "w") as f:
            f.write("left by an earlier worker")
        return True

    def exists(path):
        return os.path.exists(path)

    def whoami():
        return os.getuid()

    def tensor_op():
        import torch
        return torch.arange(6.0).reshape(2, 3) @ torch.ones(3)
''')
MARK = "labs-isolation-test-mark"


def need_namespaces():
    if isolation.isolation_prefix():
        return
    if os.environ.get("CI") == "true":
        pytest.fail("no namespaces (unshare) on this CI host: the sandbox's view cannot be tested")
    pytest.skip("no namespaces (unshare) on this host")


def toy_sandbox(tmp_path: Path) -> sandbox.Sandbox:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "toy.py"
    path.write_text(TOY)
    hide = [ROOT / "graders", ROOT / "solutions", ROOT / "tests"]  # what the plugin passes
    cfg = sandbox.WorkerConfig(module_source=TOY, module_filename="toy.py", hide=[str(p) for p in hide],
                               call_timeout_s=60)
    return sandbox.Sandbox(cfg, path)


def remote(sb: sandbox.Sandbox):
    sb.ensure()
    sb.begin_test()
    return sandbox.RemoteModule(sb, sb.module_path, "toy")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A package directory holding a (non-editable) ``harness`` with an oracle, as an image may."""
    site = tmp_path_factory.mktemp("image") / "site-packages"
    (site / "harness").mkdir(parents=True)
    (site / "harness" / "oracles.py").write_text("ANSWER = 42\n")
    return site


@pytest.fixture(scope="module")
def toy_sb(tmp_path_factory, installed):
    with pytest.MonkeyPatch.context() as mp:
        real = isolation.package_dirs
        mp.setattr(isolation, "package_dirs", lambda: real() + [str(installed)])
        sb = toy_sandbox(tmp_path_factory.mktemp("toy"))
        sb.ensure()
    yield sb
    sb.close()


@pytest.fixture
def toy(toy_sb):
    return remote(toy_sb)


def test_the_course_and_its_neighbours_are_not_in_the_view(toy):
    need_namespaces()
    with tempfile.TemporaryDirectory(dir=ROOT.parent, prefix=".labs-sibling-") as sibling:
        Path(sibling, "secret.txt").write_text("another copy of the course")
        for path in (ROOT / ".git" / "HEAD", ROOT / ".git", ROOT / "solutions", ROOT / "graders",
                     ROOT / "tests", ROOT / "harness" / "oracles.py", ROOT / "labs.yaml",
                     Path(sibling) / "secret.txt", Path(sibling)):
            assert toy.read(str(path)) is None, f"the worker can read {path}"
    listing = toy.read(str(ROOT))  # at most the venv, when it lives in the course
    assert listing is None or set(listing) <= {".venv"}, listing
    assert toy.read(sys.prefix) is not None, "the interpreter's prefix must be visible"


def test_an_installed_harness_is_masked(toy, installed):
    need_namespaces()
    assert toy.read(str(installed)) is not None, "the package directory is part of the view"
    assert toy.read(str(installed / "harness" / "oracles.py")) is None


def test_the_worker_facing_harness_is_importable(toy):
    for name in ("harness.sandbox.probes", "harness.alloc", "harness.bench", "harness.impl"):
        assert toy.importable(name), f"the worker cannot import {name}"


def test_grader_side_modules_cannot_be_imported(toy):
    need_namespaces()
    for name in ("harness.oracles", "harness.testing", "harness.toolkit", "harness.grading", "harness.cli", "harness.plugin",
                 "harness.sandbox.worker", "harness.sandbox.calls", "harness.sandbox.ranks"):
        assert not toy.importable(name), f"the worker imports {name}"


def test_torch_works_in_the_worker(toy):
    out = toy.tensor_op()
    assert out.tolist() == [3.0, 12.0]


def test_run_lock_and_tmp_are_private_to_each_worker(tmp_path):
    need_namespaces()
    first = toy_sandbox(tmp_path / "a")
    try:
        w = remote(first)
        for d in ("/run/lock", "/tmp", "/dev/shm", "/var/tmp"):
            assert w.touch(f"{d}/{MARK}")
            assert not os.path.exists(f"{d}/{MARK}"), f"the worker wrote into the host's {d}"
    finally:
        first.close()
    second = toy_sandbox(tmp_path / "b")
    try:
        w = remote(second)
        for d in ("/run/lock", "/tmp", "/dev/shm", "/var/tmp"):
            assert not w.exists(f"{d}/{MARK}"), f"{d} kept a file from an earlier worker"
    finally:
        second.close()


def test_the_worker_runs_as_this_gradings_own_uid(toy):
    drop = isolation.worker_uid()
    if os.geteuid() != 0:
        assert drop is None
        return
    assert drop == isolation.worker_uid(), "every worker of one grading shares one uid"
    uid, gid, name = drop
    assert uid >= isolation.UID_BASE and name not in ("student", "nobody")
    if isolation.isolation_prefix():  # without namespaces it may stay root (see isolate)
        assert toy.whoami() == uid


# --- a module is read safely ---------------------------------------------------------------------

LAB = course().lab("03")


def test_a_symlinked_module_is_refused(tmp_path):
    sub = tmp_path / "sub"
    (sub / "03").mkdir(parents=True)
    (sub / "03" / LAB.filename).symlink_to(ROOT / "solutions" / "03" / LAB.filename)
    with pytest.raises(_impl.ImplError, match="symbolic link"):
        grading.find_module(sub, LAB)
    # grade-all: a row with 0 and the reason, before any grader runs
    row = classroom.grade_row(classroom.Submission("mallory", sub), LAB, course())
    assert row.status.startswith("no module:") and "symbolic link" in row.status, row.status
    assert row.results["score"] == 0 and not row.retry


def test_a_module_through_a_linked_folder_or_too_big_is_refused(tmp_path):
    outside = tmp_path / "outside" / "03"
    outside.mkdir(parents=True)
    (outside / LAB.filename).write_text("x = 1\n")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "03").symlink_to(outside, target_is_directory=True)
    with pytest.raises(_impl.ImplError, match="outside the submission"):
        grading.read_module(sub / "03" / LAB.filename, sub)
    big = tmp_path / "big" / "03"
    big.mkdir(parents=True)
    (big / LAB.filename).write_bytes(b"#" * (grading.MAX_MODULE_BYTES + 1))
    with pytest.raises(_impl.ImplError, match="larger than 1 MiB"):
        grading.read_module(big / LAB.filename, big.parent)
    ok = tmp_path / "ok" / "03"
    ok.mkdir(parents=True)
    (ok / LAB.filename).write_text("x = 1\n")
    assert grading.read_module(ok / LAB.filename, ok.parent) == b"x = 1\n"


# --- a venv under a 0700 home, the course under /tmp ---------------------------------------------

def test_grading_works_with_the_venv_under_a_private_home_and_the_course_in_tmp():
    """`labs grade solutions --lab 03` from a copy of the course under /tmp, with a venv
    inside a 0700 directory (it reuses this venv's packages through a .pth file)."""
    need_namespaces()
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    with tempfile.TemporaryDirectory(prefix="labs-course-", dir="/tmp") as tmp_course, \
            tempfile.TemporaryDirectory(prefix="labs-home-", dir="/tmp") as home:
        for rel in filter(None, files):
            src, dest = ROOT / rel, Path(tmp_course) / rel
            if src.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
        os.chmod(home, 0o700)
        venv = Path(home) / "venv"
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        site = next(venv.glob("lib/python*/site-packages"))
        (site / "reuse.pth").write_text("\n".join(isolation.package_dirs()) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LABS_") and k != "PYTHONPATH"}
        out = Path(home) / "result.json"
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "harness", "grade", "solutions", "--lab", "03",
                               "--json", str(out), "--sandbox", "process"], cwd=tmp_course, env={**env, "HOME": home},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        result = json.loads(out.read_text())
    tests = result["tests"]  # parts A and B check values: all pass (C's speed depends on the machine)
    assert not [t for t in tests if "could not start" in t["output"]], "the sandbox could not start"
    correctness = [t for t in tests if t["name"].startswith(("A: ", "B: "))]
    failed = [f"{t['name']}: {t['output'][:300]}" for t in correctness if t.get("status", "passed") != "passed"]
    assert correctness and not failed, "\n".join(failed)
