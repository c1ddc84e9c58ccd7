"""Gradescope: ``labs gradescope build --lab NN`` writes the autograder zip.

The zip (Gradescope unpacks it into ``/autograder/source``) holds::

    setup.sh          installs the course's locked environment (torch 2.13.0 CPU,
                      docker/requirements.lock as constraints), then the harness
    run_autograder    runs `labs grade /autograder/submission --lab NN --json ...`
                      (the module found by ``harness.impl.locate``, the rule of
                      every command), then `labs gradescope finalize` writes results.json
    labs.yaml, pyproject.toml, harness/, graders/NN/, labs/NN/<stub>, docker/*.txt|lock
    .labs-staff/course-secret   the course's grading secret (``grading.course_secret``):
                      a regrade of the same file gets the same hidden inputs
    server.json       only with ``--server``: the course server's URL and the course's
                      bridge token (an account of role ``bridge``, never a student's)

never ``solutions/`` or other labs' graders. ``finalize`` turns ``labs grade``'s
Gradescope JSON into the one Gradescope reads: every hidden grader test gets
the visibility given at build time (``after_published`` by default), a visible
"Submission check" line says which file was graded, perf figures stay in
``leaderboard``, and when grading itself failed results.json still appears,
with the reason (Gradescope shows nothing useful for a missing file).

Gradescope's workers have no GPU. With ``server.json`` in the zip, ``run_autograder``
also forwards the same module to the course server (``forward``: the student named by
Gradescope's ``submission_metadata.json``), waits for its GPU runners' grade, and
``finalize`` reports that grade (every test, GPU ones included) instead of the local
one; when the server does not answer in time the local grade stands and the output
says why the GPU tests were not run. Without a server it says so plainly too.

``AUTOGRADER_ROOT`` (default ``/autograder``) and ``LABS_PYTHON`` (default
``/autograder/venv/bin/python``, else ``python3``) let staff run
``run_autograder`` locally against a folder laid out like ``/autograder``.
"""
from __future__ import annotations

import json
import stat
import time
import zipfile
from pathlib import Path

import httpx


from . import files, grading, impl as _impl
from .manifest import Course, Lab, LabPaths

HARNESS_DIR = Path(__file__).resolve().parent
VISIBILITIES = ("hidden", "after_due_date", "after_published", "visible")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SERVER_FILE = "server.json"
FORWARD_WAIT_S = 1200.0  # how long the autograder waits for the GPU runners (Gradescope's own limit is higher)

SETUP_SH = """\
#!/usr/bin/env bash
# Gradescope setup for lab {number} ({title}), written by `labs gradescope build`.
# One locked environment: torch {torch} (CPU build), then the harness with every
# other package pinned by docker/requirements.lock.
set -euxo pipefail
cd /autograder/source
if ! python3 -m venv --help >/dev/null 2>&1; then
  apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-pip
fi
python3 -m venv /autograder/venv
PIP="/autograder/venv/bin/python -m pip"
$PIP install --upgrade pip
LOCK=""
[ -f docker/requirements.lock ] && LOCK="-c docker/requirements.lock"
$PIP install $LOCK --index-url {torch_index} --extra-index-url https://pypi.org/simple "torch=={torch}"
$PIP install $LOCK "/autograder/source{extras}"
/autograder/venv/bin/python -m harness --course /autograder/source list
# the installed harness's grader-side modules (oracles, testing, grading, front ends): root only; the
# sandboxed worker imports a staged copy of its own side (harness/sandbox/isolation.py, worker_files())
/autograder/venv/bin/python - <<'PY'
import os, harness
from harness.sandbox.isolation import worker_files
top, keep = os.path.dirname(harness.__file__), set(worker_files())
for root, _, files in os.walk(top):
    for f in files:
        if os.path.relpath(os.path.join(root, f), top) not in keep:
            os.chmod(os.path.join(root, f), 0o600)
PY
"""

RUN_AUTOGRADER = """\
#!/usr/bin/env bash
# Gradescope autograder for lab {number} ({title}), written by `labs gradescope build`.
# Grades the submission's {module} with the hidden graders; writes results/results.json.
# A local dry run: AUTOGRADER_ROOT=DIR (holding source/ and submission/) LABS_PYTHON=python3 ./run_autograder
set -uo pipefail
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
SRC="$ROOT/source"
SUB="$ROOT/submission"
RESULTS="$ROOT/results"
LAB={number}
if [ -z "${{LABS_PYTHON:-}}" ]; then
  if [ -x "$ROOT/venv/bin/python" ]; then LABS_PYTHON="$ROOT/venv/bin/python"; else LABS_PYTHON=python3; fi
fi
export PYTHONPATH="$SRC${{PYTHONPATH:+:$PYTHONPATH}}" LABS_PROGRESS=off
mkdir -p "$RESULTS"
# 0. the hidden graders and the course are root's alone before any student code runs: a worker that
# could read them (no namespaces here) refuses to start, and the run reports an infrastructure failure
chmod -R go= "$SRC"
# 1. grade the upload with the hidden graders (the Gradescope container is the sandbox);
# `labs grade` finds the module by the one rule (harness.impl.locate): labs/NN/, NN/, the
# top level, else the only shallowest one anywhere
"$LABS_PYTHON" -m harness --course "$SRC" grade "$SUB" --lab "$LAB" --sandbox process \\
    --json "$RESULTS/labs-grade.json" >"$RESULTS/labs-grade.log" 2>&1
STATUS=$?
# 1b. the GPU tests: where the zip names a course server, its GPU runners grade the same module
if [ -f "$SRC/{server_file}" ]; then
  "$LABS_PYTHON" -m harness --course "$SRC" gradescope forward "$SUB" --lab "$LAB" \\
      --metadata "$ROOT/submission_metadata.json" --out "$RESULTS/server-results.json" \\
      >>"$RESULTS/labs-grade.log" 2>&1
fi

# 2. Gradescope's results.json: visibility, leaderboard, and the reason when grading failed
exec "$LABS_PYTHON" -m harness --course "$SRC" gradescope finalize "$RESULTS/labs-grade.json" \\
    "$RESULTS/results.json" --status "$STATUS" --log "$RESULTS/labs-grade.log" \\
    --lab "$LAB" --visibility {visibility} --server-results "$RESULTS/server-results.json"
"""


def _payload(course: Course, lab: Lab) -> dict[str, Path]:
    """Archive name -> file on disk: the course files the autograder needs."""
    root = course.root
    # the harness running this command (the course may keep its framework elsewhere)
    framework = HARNESS_DIR.parent
    files: dict[str, Path] = {"labs.yaml": root / "labs.yaml"}
    skip = lambda p: "__pycache__" in p.parts or p.suffix == ".pyc" or p.name.startswith(".")
    paths = course.paths(lab)
    for base, top in ((HARNESS_DIR, HARNESS_DIR.parent), (paths.graders, root)):
        for p in sorted(base.rglob("*")):
            if p.is_file() and not skip(p.relative_to(top)):
                files[p.relative_to(top).as_posix()] = p
    if paths.stub.is_file():  # the contract: names and signatures a submission must keep
        files[paths.relative.stub.as_posix()] = paths.stub
    for base in (root, framework):  # the package definition and the lock: the course's, else the framework's
        if (base / "pyproject.toml").is_file() and "pyproject.toml" not in files:
            files["pyproject.toml"] = base / "pyproject.toml"
        if (base / "docker").is_dir() and not any(n.startswith("docker/") for n in files):
            for p in sorted((base / "docker").glob("*")):
                if p.is_file() and (p.suffix in (".txt", ".lock")):
                    files[f"docker/{p.name}"] = p
    return files


def _torch_pin(course: Course) -> str:
    for pin in (course.root / "docker" / "torch-cpu.txt", HARNESS_DIR.parent / "docker" / "torch-cpu.txt"):
        if not pin.is_file():
            continue
        for line in pin.read_text().splitlines():
            line = line.strip()
            if line.startswith("torch=="):
                return line.split("==", 1)[1]
    return "2.13.0+cpu"


def build_zip(course: Course, lab: Lab, out: Path, visibility: str = "after_published", *,
              server: str | None = None, server_token: str | None = None) -> list[str]:
    """Write the autograder zip for ``lab`` to ``out``; returns the archive's names. With
    ``server`` (the course server's URL) and ``server_token`` (a ``bridge`` account's
    token), the autograder forwards each submission there for its GPU tests."""
    if bool(server) != bool(server_token):
        raise ValueError("server and server_token go together (labs account add NAME --role bridge)")
    graders = course.paths(lab).graders
    if not graders.is_dir():
        raise FileNotFoundError(f"no hidden graders for lab {lab.number} ({graders})")
    if visibility not in VISIBILITIES:
        raise ValueError(f"visibility must be one of {', '.join(VISIBILITIES)}, got {visibility!r}")
    fmt = dict(number=lab.number, title=lab.title, module=lab.filename, visibility=visibility,
               torch=_torch_pin(course), torch_index=TORCH_CPU_INDEX,
               extras="[triton]" if "triton" in lab.requires else "", server_file=SERVER_FILE)
    scripts = {"setup.sh": SETUP_SH.format(**fmt), "run_autograder": RUN_AUTOGRADER.format(**fmt)}
    names = []
    with files.atomic_open(out, "wb", perms=files.SHARED) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in scripts.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | 0o755) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text)
            names.append(name)
        for name, path in _payload(course, lab).items():
            zf.write(path, name)
            names.append(name)
        if server:
            zf.writestr(SERVER_FILE, json.dumps({"url": server.rstrip("/"), "token": server_token}))
            names.append(SERVER_FILE)
        secret = grading.course_secret(course)  # regrades on Gradescope get the same hidden inputs
        if secret is not None:
            zf.writestr(grading.SECRET_FILE, secret + b"\n")
            names.append(grading.SECRET_FILE)
    return names


def forward(course: Course, submission: Path, lab: Lab, metadata: Path | None, out: Path, *,
            wait_s: float = FORWARD_WAIT_S, poll_s: float = 5.0) -> dict:
    """Send ``submission``'s module (``grading.pack_module``) to the course server named
    by the zip's ``server.json``, for the student in Gradescope's ``metadata``, and wait
    up to ``wait_s`` seconds for the GPU runners' grade. Writes ``out``: ``{"results":
    results.json, "gpu_model", "id"}`` when graded, else ``{"error": why}``; never raises
    (the local grade stands). Returns what it wrote."""
    def done(payload: dict) -> dict:
        files.write_json(out, payload)
        return payload

    cfg = json.loads((course.root / SERVER_FILE).read_text())
    users = (json.loads(metadata.read_text()).get("users") or [{}]) if metadata and metadata.is_file() else [{}]
    student, email = users[0].get("name", ""), users[0].get("email", "")
    try:
        blob = grading.pack_module(_impl.locate(submission, lab), lab)
    except (_impl.ImplError, OSError) as e:
        return done({"error": f"nothing to forward: {e}"})
    headers = {"Authorization": f"Bearer {cfg['token']}"}
    try:
        r = httpx.post(f"{cfg['url']}/api/bridge/submissions", headers=headers, timeout=60,
                       data={"lab": lab.number, "student": student, "email": email},
                       files={"file": (f"{lab.number}.tar.gz", blob, "application/gzip")})
        if r.status_code >= 400:
            return done({"error": f"the course server refused it ({r.status_code}: {r.text[:300]})"})
        sub_id = r.json()["id"]
        deadline = time.monotonic() + wait_s
        while True:
            v = httpx.get(f"{cfg['url']}/api/bridge/submissions/{sub_id}", headers=headers, timeout=60).json()
            if v["results"] is not None:
                return done({"id": sub_id, "results": v["results"], "gpu_model": v["gpu_model"]})
            if v["state"] in ("failed", "cancelled"):
                return done({"id": sub_id, "error": f"the course server could not grade it ({v['state']}: "
                                                    f"{v['error'][:300]})"})
            if time.monotonic() > deadline:
                return done({"id": sub_id, "error": f"the course server did not grade it within {wait_s:.0f} s "
                                                    f"(still {v['state']}; staff see it there)"})
            time.sleep(poll_s)
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return done({"error": f"the course server {cfg['url']} could not be reached ({type(e).__name__}: {e})"})


def finalize(raw_path: Path, out_path: Path, *, status: int, log: str, lab: Lab, visibility: str,
             server_results: Path | None = None, gpu_points: float = 0.0) -> dict:
    """Gradescope's results.json from ``labs grade --json`` output (see the module
    docstring); ``server_results``: what ``forward`` wrote, when the zip names a server.
    ``gpu_points``: the lab's points that need a GPU (the note when none graded them)."""
    raw, note = None, ""
    forwarded = json.loads(server_results.read_text()) if server_results and server_results.is_file() else None
    if forwarded and forwarded.get("results"):
        raw = forwarded["results"]
        note = (f"Graded on the course's GPU runners ({forwarded.get('gpu_model')}), course server submission "
                f"{forwarded['id']}: every test, GPU ones included.")
    elif status == 0 and raw_path.is_file():
        try:
            raw = json.loads(raw_path.read_text())
        except ValueError:
            raw = None
        if forwarded:
            note = f"The GPU tests were not run: {forwarded['error']}. The tests that need no GPU are graded here."
        elif gpu_points:
            note = (f"The GPU tests ({gpu_points:g} points) were not run: Gradescope has no GPU and this autograder "
                    f"forwards to no course server.")
    if raw is None:
        reason = next((l for l in log.splitlines() if l.startswith("labs: error:")), "") or log.strip()[-2000:]
        res = {"score": 0.0, "output": f"The autograder could not grade this submission: {reason}\n"
                                       "Course staff have been notified by this message; please ask them.",
               "visibility": "visible", "stdout_visibility": "hidden", "tests": [],
               "extra_data": {"lab": lab.number, "grading_failed": True}}
        files.write_json(out_path, res)
        return res
    res = dict(raw)
    module = res.get("extra_data", {}).get("module", "")  # the file `labs grade` graded (impl.locate)
    for t in res["tests"]:
        t["visibility"] = visibility
    if module:
        check = (f"Graded {module} as {LabPaths.of(lab).stub}; "
                 f"{len(res['tests'])} hidden tests, results shown {visibility.replace('_', ' ')}.")
        passed = "passed"
    else:
        check = (f"No {lab.filename} in your upload: submit {LabPaths.of(lab).stub} "
                 f"(or the file alone). Every test scores 0.")
        passed = "failed"
    if note:
        check = f"{check} {note}"
    res["tests"] = [{"name": "Submission check", "score": 0.0, "max_score": 0.0, "status": passed,
                     "output": check, "visibility": "visible", "tags": []}] + res["tests"]
    res["visibility"] = "visible"
    res.setdefault("leaderboard", [])
    files.write_json(out_path, res)
    return res
