"""The GPU check: grade every reference whose lab has GPU tests on this machine, and
write what the GPU tests measured.

    python scripts/gpu_check.py [--lab NN ...] [--out DIR] [--sandbox docker|process]

It says where it grades and on what: in the course's CUDA grading image
(``--sandbox docker``: the default where a Docker engine holds ``labs.yaml``'s
``images.gpu`` and hands containers GPUs), or in this machine's own Python
(``--sandbox process``: a GPU machine without Docker, the course's pure-Python
dependencies installed from the lock), with the torch, CUDA and Triton versions
there; versions other than the lock's are named, since figures taken on them may
differ from the image's. A lab this environment cannot grade (no usable Triton: the
graders record it as an infrastructure failure, never a student's 0) is reported
with the reason and the check goes on to the next lab.

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
import sys
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


def main(argv: list[str] | None = None) -> int:
    course = manifest.load(ROOT)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", action="append", help="a lab number (repeatable; default: every lab with GPU tests)")
    ap.add_argument("--out", type=Path, default=None, help="folder for gpu-check.json (default: $OUT, else "
                                                           ".labs-staff/gpu-check)")
    ap.add_argument("--sandbox", choices=grading.SANDBOXES, default=None,
                    help="docker: the CUDA grading image; process: this machine's Python (default: docker "
                         "where the image and a GPU runtime are there)")
    args = ap.parse_args(argv)
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
    print(f"gpu check: wrote {out / 'gpu-check.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
