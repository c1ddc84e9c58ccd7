"""The GPU check: grade every reference whose lab has GPU tests on this machine, and
write what the GPU tests measured.

    python scripts/gpu_check.py [--lab NN ...] [--out DIR] [--sandbox docker|process]
                                [--calibrate 03,04,06] [--pool 20] [--budget-s 480]

It says where it grades and on what: in the course's CUDA grading image
(``--sandbox docker``: the default where a Docker engine holds ``labs.yaml``'s
``images.gpu`` and hands containers GPUs), or in this machine's own Python
(``--sandbox process``: a GPU machine without Docker, the course's pure-Python
dependencies installed from the lock), with the torch, CUDA and Triton versions
there; versions other than the lock's are named, since figures taken on them may
differ from the image's. A lab this environment cannot grade (no usable Triton: the
graders record it as an infrastructure failure, never a student's 0) is reported
with the reason and the check goes on to the next lab.

Then ``labs calibrate`` for the ``--calibrate`` labs (the reference's perf ratios on
this GPU model and the thresholds they suggest), and ``--pool`` lab 04 submissions
(the reference, the stub and the course's mutants, round robin) through the course
server's embedded runner on one GPU (``labs serve --runner local --gpus 0``), timed:
seconds per submission and submissions per hour, the figures a capacity model needs.
Each phase stops when ``--budget-s`` (all phases together) runs out and says so.

Writes ``DIR/gpu-check.json`` (default DIR: ``$OUT`` when set, else
``.labs-staff/gpu-check``): per lab the reference's score and, per GPU test, its
outcome, points, headline and perf figures (time ratios against the baselines timed
in the same run, bus bandwidth). Exit status: 0 when every GPU test ran and passed,
1 when one failed or could not run, 2 when this machine has no CUDA device.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness import container, grading, manifest  # noqa: E402


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _pin(path: str, name: str) -> str:
    """The version a pip requirements file pins ``name`` to (``name==V``, comments ignored)."""
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit(f"gpu check: {path} pins no {name}")


def environment(sandbox: str, course: manifest.Course) -> dict:
    """Where the check grades and the versions there (this Python's, or the image's)."""
    import torch
    want = {"torch": _pin("docker/torch-cuda.txt", "torch"), "triton": _pin("docker/requirements.lock", "triton")}
    env = {"sandbox": sandbox}
    if sandbox == "docker":  # the image's versions and the device its container sees, not this Python's
        env["where"] = f"the course's CUDA grading image {course.images.gpu}"
        env.update(container.check_image(container.engine(), course.images.gpu, "cuda",
                                         gpus=container._gpu_runtime()))
    else:
        env["where"] = f"this machine's Python ({sys.executable})"
        env.update(torch=torch.__version__, cuda=torch.version.cuda, triton=_version("triton"),
                   python=sys.version.split()[0],
                   device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    env["differs_from_lock"] = {k: f"{env[k]} here, {v} in the lock" for k, v in want.items()
                                if env[k].split("+")[0] != v}
    return env


def check_lab(course: manifest.Course, number: str, sandbox: str) -> dict:
    lab = course.lab(number)
    try:
        r = grading.grade(ROOT / "solutions", lab, course, sandbox=sandbox)
    except grading.GradingError as e:  # the environment cannot grade (e.g. no usable Triton): say why
        return {"error": str(e), "gpu_tests": []}
    gpu = [t for t in r.tests if "gpu" in t.tags]
    return {"score": r.score, "max_score": r.max_score, "max_score_runnable": r.max_score_runnable,
            "duration_s": round(r.duration_s, 1),
            "gpu_tests": [{"name": t.name, "part": t.part, "outcome": t.outcome, "score": t.score,
                           "max_score": t.max_score, "headline": (t.output.splitlines() or [""])[0][:400],
                           "perf": t.perf} for t in gpu]}


def calibrate_labs(course: manifest.Course, numbers: list[str], gpu_model: str) -> dict:
    from harness import calibrate
    out = {}
    for number in numbers:
        try:
            out[number] = calibrate.calibrate(course, course.lab(number), gpu_model)
        except grading.GradingError as e:
            out[number] = {"error": str(e)[:500]}
        for key, row in out[number].get("perf", {}).items():
            print(f"  calibrate lab {number} {key}: reference ratio "
                  + (f"{row['ratio']:.3f}, suggested full/zero {row['suggested_full_credit']}/"
                     f"{row['suggested_zero_credit']}" if row["ratio"] is not None else "not run"))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pool_run(course: manifest.Course, lab_number: str, n: int, gpus: str, deadline: float) -> dict:
    """``n`` submissions of ``lab_number`` through ``labs serve --runner local --gpus GPUS``
    (a fresh SQLite database in a temporary folder): the reference, the stub and every
    mutant in tests/mutants/NN, round robin, one student each; waits until all are graded
    or ``deadline`` (time.monotonic()) passes. Returns the timing figures."""
    import httpx
    from harness import impl as _impl
    lab = course.lab(lab_number)
    root = Path(course.root)
    sources = [root / "solutions" / lab.number / lab.filename, root / "labs" / lab.number / lab.filename]
    sources += sorted(p for p in (root / "tests" / "mutants" / lab.number).glob("*.py")
                      if "MUTATE" not in p.read_text())  # full modules; edit-style mutants need the test helper
    with tempfile.TemporaryDirectory(prefix="labs-gpu-pool-") as tmp:
        url, port = f"sqlite:///{tmp}/server.db", _free_port()
        labs_cmd = [sys.executable, "-m", "harness", "--course", str(course.root)]
        roster = Path(tmp) / "roster.csv"
        roster.write_text("name\n" + "".join(f"student{i:02d}\n" for i in range(n)))
        subprocess.run(labs_cmd + ["roster", "import", str(roster), "--db", url, "--tokens", f"{tmp}/tokens.csv"],
                       check=True, capture_output=True)
        tokens = [line.split(",")[1] for line in Path(f"{tmp}/tokens.csv").read_text().splitlines()[1:]]
        log = open(Path(tmp) / "server.log", "w")
        server = subprocess.Popen(labs_cmd + ["serve", "--db", url, "--port", str(port), "--runner", "local",
                                              "--gpus", gpus], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            while time.monotonic() < deadline:
                try:
                    httpx.get(f"{base}/healthz", timeout=2)
                    break
                except httpx.HTTPError:
                    time.sleep(0.5)
            t0 = time.monotonic()
            ids = []
            for i, token in enumerate(tokens):
                src = sources[i % len(sources)]
                d = Path(tmp) / f"sub{i}" / lab.number
                d.mkdir(parents=True)
                (d / lab.filename).write_bytes(src.read_bytes() + f"\n# submission {i}\n".encode())
                blob = grading.pack_module(_impl.locate(d.parent, lab), lab)
                r = httpx.post(f"{base}/api/submissions", data={"lab": lab.number},
                               files={"file": (f"{lab.number}.tar.gz", blob)},
                               headers={"Authorization": f"Bearer {token}"}, timeout=60)
                r.raise_for_status()
                ids.append((token, r.json()["id"], src.relative_to(root).as_posix()))
            done: dict[str, dict] = {}
            while len(done) < len(ids) and time.monotonic() < deadline:
                for token, sid, what in ids:
                    if sid not in done:
                        v = httpx.get(f"{base}/api/submissions/{sid}", headers={"Authorization": f"Bearer {token}"},
                                      timeout=30).json()
                        if v["state"] in ("done", "failed"):
                            done[sid] = {"source": what, "state": v["state"], **{k: v.get("result", {}).get(k)
                                         for k in ("score", "max_score", "duration_s", "status")}}
                time.sleep(1.0)
            wall = time.monotonic() - t0
        finally:
            server.terminate()
            server.wait(timeout=60)
            log.close()
    per = [d["duration_s"] for d in done.values() if d.get("duration_s")]
    return {"submitted": len(ids), "graded": len(done), "wall_s": round(wall, 1), "gpus": gpus,
            "per_submission_s": round(sum(per) / len(per), 2) if per else None,
            "submissions_per_hour": round(3600 * len(done) / wall, 1) if wall else None,
            "stopped_by_budget": len(done) < len(ids), "results": list(done.values())}


def main(argv: list[str] | None = None) -> int:
    course = manifest.load(ROOT)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", action="append", help="a lab number (repeatable; default: every lab with GPU tests)")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu-check.json (default: $OUT, else "
                                                           ".labs-staff/gpu-check)")
    ap.add_argument("--sandbox", choices=grading.SANDBOXES, default=None,
                    help="docker: the CUDA grading image; process: this machine's Python (default: docker "
                         "where the image and a GPU runtime are there)")
    ap.add_argument("--calibrate", default="03,04,06", help="labs to calibrate (comma-separated; '' for none)")
    ap.add_argument("--pool", type=int, default=20, help="lab 04 submissions through the embedded runner (0: none)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="seconds for every phase together")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    sandbox = args.sandbox or ("docker" if container._gpu_runtime()
                               and container.choose_sandbox(course, gpu=True)[0] == "docker" else "process")
    try:
        env = environment(sandbox, course)
    except container.ContainerError as e:
        print(f"gpu check: {e}")
        return 1
    print(f"gpu check: grading in {env['where']}: torch {env['torch']} (CUDA {env['cuda'] or 'none'}), "
          f"triton {env['triton']}, device {env['device'] or 'none'}")
    for k, v in env["differs_from_lock"].items():
        print(f"gpu check: note: {k} {v}: figures may differ from the grading image's")
    if not env["device"]:
        print(f"gpu check: {env['where']} sees no CUDA device (torch.cuda.is_available() is False): "
              f"nothing to check")
        return 2
    labs = args.lab or [n for n, lab in sorted(course.labs.items()) if grading.gpu_points(course, lab)]
    out = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else
                       course.staff_output(None, "gpu-check", "--out"))
    out.mkdir(parents=True, exist_ok=True)
    report = {"environment": env, "labs": {}}
    ok = True
    for number in labs:
        if time.monotonic() > deadline:
            print(f"gpu check: the {args.budget_s:g} s budget ran out before lab {number}")
            report.setdefault("not_reached", []).append(number)
            continue
        report["labs"][number] = res = check_lab(course, number, sandbox)
        for t in res["gpu_tests"]:
            ok &= t["outcome"] == "passed"
            print(f"  lab {number} {t['outcome']:>7} {t['score']:5.2f}/{t['max_score']:5.2f} {t['name']}"
                  + (f": {t['headline'][:120]}" if t["outcome"] != "passed" else ""))
        if "error" in res:
            ok = False
            print(f"lab {number}: grading failed: {res['error'][:300]}")
        else:
            print(f"lab {number}: reference {res['score']:g} / {res['max_score']:g} ({res['duration_s']} s)")
        (out / "gpu-check.json").write_text(json.dumps(report, indent=2))  # after each lab: a cut run keeps some
    cal = [x for x in args.calibrate.split(",") if x.strip()]
    if cal and time.monotonic() < deadline:
        report["calibrate"] = calibrate_labs(course, cal, env["device"])
        (out / "gpu-check.json").write_text(json.dumps(report, indent=2))
    if args.pool and time.monotonic() < deadline:
        report["pool"] = pool = pool_run(course, "04", args.pool, "0", deadline)
        print(f"gpu check: pool: {pool['graded']}/{pool['submitted']} lab 04 submissions graded in {pool['wall_s']} s "
              f"on one GPU: {pool['per_submission_s']} s each, {pool['submissions_per_hour']} per hour"
              + (" (stopped by the budget)" if pool["stopped_by_budget"] else ""))
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2))
    print(f"gpu check: wrote {out / 'gpu-check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
