"""Grading containers: build the course images and grade one submission in one.

Two images, built from ONE lock (``docker/requirements.lock``, which ``make
setup`` installs from too): ``labs.yaml`` ``images.cpu`` (``docker/Dockerfile.cpu``,
torch 2.13.0 CPU build) and ``images.gpu`` (``docker/Dockerfile.cuda``, torch
2.13.0 CUDA build); triton 3.7.1 in both. An image holds the locked environment, the harness
(installed as a package), ``labs.yaml``, the lab stubs (they define the
contract) and the hidden graders, which only root may read; never the
solutions, never a submission. Student code runs as the unprivileged
``student`` user (uid 10001, ``STUDENT_UID``) created in the image.

Build (``labs image build [--gpu] [--base-image IMG]``, ``build_image``):
the base image is used when it is present locally or can be pulled; else
(no registry reachable, as in CI) a Debian bookworm base with Python 3.11 is
made with ``debootstrap`` + ``docker import`` (``make_base_image``) and used
instead. The build context is written to a temporary folder: ``docker/``, the
course files, the torch wheel fetched by the host's pip (the CPU build is not
on PyPI) and the host's CA bundle for pip when it sets one. The build uses
the host network (CI's engine runs with ``--bridge=none``).

Grade (``run``, called by ``harness.grading.run(..., sandbox="docker")``):
the same pytest command as the in-process path, run by ``python -m
harness.grading`` inside the image as root (the trusted grader), with no
network, the lab's CPU/memory/pids limits, a read-only root file system, the
staged submission mounted read-only at ``IMPL_MOUNT`` and a results folder
mounted at ``/results``, where the run writes JSON only. The wall-clock limit
is enforced inside (the in-process path's timeout, which keeps what was graded)
and, as a backstop, from outside: the container is killed ``GRACE_S`` later.
The container is always removed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import manifest
from .errors import GradingError, LabsError

IMPL_MOUNT = "/labs-submission"   # the staged submission, read-only
RESULTS_MOUNT = "/results"        # JSON written by the run inside
COURSE_IN_IMAGE = "/opt/course"
STUDENT_UID = 10001
DEFAULT_BASE = {"cpu": "python:3.11-slim", "cuda": "nvidia/cuda:13.0.1-base-ubuntu24.04"}
FALLBACK_BASE = "ai-infra-labs-base:bookworm"  # made by debootstrap when no base can be had
DIGEST_LABEL = "ai-infra-labs.course-digest"
FLAVOR_LABEL = "ai-infra-labs.flavor"
DOCKER_DIR = Path(__file__).resolve().parents[1] / "docker"
# what the image holds from the course tree (solutions/ and tests/ never)
COURSE_FILES = ("labs.yaml", "pyproject.toml", "harness", "labs", "graders")
GRACE_S = 120.0


class ContainerError(LabsError):
    """The engine or the image is not usable; the message is one line for staff."""


# --- the engine ------------------------------------------------------------

def engine(ping_timeout_s: float = 10.0, timeout_s: float = 600.0):
    """A ``docker.DockerClient`` that answered a ping within ``ping_timeout_s``
    (its later calls may take ``timeout_s``: a busy engine is slow to remove
    big images); ContainerError otherwise."""
    try:
        import docker
    except ImportError:  # pragma: no cover - a dependency in pyproject
        raise ContainerError("the Docker SDK is not installed (pip install docker)") from None
    try:
        client = docker.from_env(timeout=int(ping_timeout_s))
        client.ping()
        client.api.timeout = int(timeout_s)
        return client
    except Exception as e:  # DockerException, requests errors: the socket is missing or mute
        where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise ContainerError(f"no Docker engine answers at {where} ({type(e).__name__})") from None


def engine_available() -> bool:
    try:
        engine(ping_timeout_s=3)
        return True
    except ContainerError:
        return False


# --- what the image holds ----------------------------------------------------

def _course_files(root: Path):
    """(relative path, file) for every course file the image holds, sorted."""
    out = []
    for name in COURSE_FILES:
        p = root / name
        if p.is_file():
            out.append((name, p))
        elif p.is_dir():
            out += [(str(f.relative_to(root)), f) for f in p.rglob("*")
                    if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    return sorted(out)


def course_digest(root: Path) -> str:
    """sha256 over the course files an image holds (names and contents): an image
    whose label differs was built from another version of the graders or harness."""
    h = hashlib.sha256()
    for rel, f in _course_files(Path(root)):
        h.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def image_name(course: manifest.Course, gpu: bool = False) -> str:
    return course.images.gpu if gpu else course.images.cpu


def choose_sandbox(course: manifest.Course, gpu: bool = False) -> tuple[str, str]:
    """The default sandbox for a front end: ``("docker", "")`` when an engine
    answers and holds this course's image, else ``("process", why)``."""
    try:
        client = engine(ping_timeout_s=3)
    except ContainerError as e:
        return "process", f"{e}; grading in a local process (--sandbox process)"
    name = image_name(course, gpu)
    try:
        img = client.images.get(name)
    except Exception:
        return "process", (f"no image {name} (staff: `labs image build{' --gpu' if gpu else ''}`); "
                           "grading in a local process (--sandbox process)")
    if (img.labels or {}).get(DIGEST_LABEL) != course_digest(course.root):
        return "process", (f"image {name} was built from another version of this course (rebuild: "
                           f"`labs image build`); grading in a local process (--sandbox process)")
    return "docker", ""


# --- building ---------------------------------------------------------------

@dataclass
class BuiltImage:
    tag: str
    base: str
    size_bytes: int
    build_s: float
    notes: list
    versions: dict  # what the image's own Python imports: torch, its CUDA, triton, the harness


# run by the built image's Python (``check_image``): the versions it grades on
VERSIONS_SCRIPT = ("import json, sys, torch, triton, harness.grading; print(json.dumps({'torch': torch.__version__, "
                   "'cuda': torch.version.cuda, 'triton': triton.__version__, 'python': sys.version.split()[0], "
                   "'device': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")


def _has_image(client, name: str) -> bool:
    try:
        client.images.get(name)
        return True
    except Exception:
        return False


def _debian_mirror() -> str:
    """``$LABS_DEBIAN_MIRROR``, else the first Debian URI apt uses here, else deb.debian.org."""
    if os.environ.get("LABS_DEBIAN_MIRROR"):
        return os.environ["LABS_DEBIAN_MIRROR"]
    for src in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("debian.sources"))]:
        try:
            for line in src.read_text().splitlines():
                words = line.split()
                for w in words:
                    if w.startswith("http") and w.rstrip("/").endswith("/debian"):
                        return w
        except OSError:
            continue
    return "http://deb.debian.org/debian"


def make_base_image(client, tag: str = FALLBACK_BASE, log: Callable[[str], None] = print) -> str:
    """Make a Debian bookworm base (Python 3.11 with venv, CA certificates) with
    ``debootstrap --variant=minbase`` and ``docker import`` it as ``tag``.
    Needs root and the ``debootstrap`` program (apt-get install debootstrap)."""
    if shutil.which("debootstrap") is None:
        raise ContainerError("no base image and no debootstrap to make one (apt-get install debootstrap, "
                             "or pass --base-image IMG that is present locally)")
    if os.geteuid() != 0:
        raise ContainerError("debootstrap needs root to make the base image (or pass --base-image IMG)")
    mirror = _debian_mirror()
    with tempfile.TemporaryDirectory(prefix="labs-debootstrap-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"making base image {tag}: debootstrap bookworm from {mirror} (a few minutes)")
        t0 = time.monotonic()
        p = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                            "bookworm", str(rootfs), mirror], capture_output=True, text=True)
        if p.returncode != 0:
            raise ContainerError(f"debootstrap failed (exit {p.returncode}): {(p.stdout + p.stderr)[-800:]}")
        for junk in ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/locale",
                     "usr/share/info", "var/log"):
            d = rootfs / junk
            if d.is_dir():
                for child in d.iterdir():
                    shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        tarball = Path(tmp) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "--exclude=./proc/*", "--exclude=./sys/*",
                        "--exclude=./dev/*", "-cf", str(tarball), "."], check=True)
        repo, _, version = tag.rpartition(":")
        client.api.import_image_from_file(str(tarball), repository=repo, tag=version,
                                          changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                                   'CMD ["/bin/bash"]'])
        log(f"made base image {tag} in {time.monotonic() - t0:.0f} s")
    return tag


def resolve_base(client, base_image: str | None, flavor: str, log: Callable[[str], None] = print) -> tuple[str, list]:
    """The base to build on: ``base_image`` (default ``DEFAULT_BASE[flavor]``)
    when present or pullable; else, for the default, the debootstrap base."""
    want = base_image or DEFAULT_BASE[flavor]
    if _has_image(client, want):
        return want, []
    try:
        log(f"pulling base image {want}")
        client.images.pull(want)
        return want, []
    except Exception as e:
        why = str(e).splitlines()[0][:200]
    if base_image:  # the caller named it: never replace it silently
        raise ContainerError(f"base image {want} is not present and could not be pulled ({why})")
    note = f"base image {want} is not present and could not be pulled; built on {FALLBACK_BASE} (debootstrap)"
    log(note)
    if not _has_image(client, FALLBACK_BASE):
        make_base_image(client, FALLBACK_BASE, log)
    return FALLBACK_BASE, [note]


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def write_context(course: manifest.Course, flavor: str, ctx: Path, log: Callable[[str], None] = print) -> list:
    """Write the build context into ``ctx``; returns notes."""
    notes = []
    (ctx / "docker").mkdir(parents=True)
    for f in ("Dockerfile.cpu", "Dockerfile.cuda", "install.sh", "requirements.lock", "torch-cpu.txt", "torch-cuda.txt"):
        shutil.copy2(DOCKER_DIR / f, ctx / "docker" / f)
    for rel, f in _course_files(course.root):
        _link_or_copy(f, ctx / "course" / rel)
    wheels = ctx / "wheels"
    wheels.mkdir()
    # the torch wheel as the host's pip finds it (a local wheel directory, a
    # mirror, PyPI); inside the build, pip installs it with --no-index. The CUDA
    # build of the same version is PyPI's: a host that holds the CPU wheel (the +cpu
    # build of that version) would hand it over, so the build fetches that one itself.
    if flavor == "cuda":
        return notes + _copy_ca(ctx)
    p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "-d", str(wheels), "-r", str(DOCKER_DIR / f"torch-{flavor}.txt")],
                       capture_output=True, text=True)
    if p.returncode != 0:
        notes.append("the host's pip could not fetch the torch wheel; the build fetches it from the index: "
                     + (p.stderr.strip().splitlines() or ["?"])[-1][:200])
        log(notes[-1])
    return notes + _copy_ca(ctx)


def _copy_ca(ctx: Path) -> list:
    """The host's CA bundle for pip, when it sets one, as ``ctx/ca.crt``; returns no notes."""
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        ca = os.environ.get(var)
        if ca and Path(ca).is_file():
            shutil.copyfile(ca, ctx / "ca.crt")
            break
    return []


def check_image(client, tag: str, flavor: str, gpus: bool = False) -> dict:
    """Run the image's Python once (no network; ``gpus``: with the host's GPUs): it must
    import torch, triton and the harness, and a CUDA image's torch must be a CUDA build
    (``torch.version.cuda``), a CPU image's a CPU one. Returns the versions and the CUDA
    device the container sees (None without one); raises ContainerError."""
    import docker
    gpu = {"device_requests": [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]} if gpus else {}
    try:
        out = client.containers.run(tag, ["python", "-c", VERSIONS_SCRIPT], remove=True, network_disabled=True,
                                    **gpu)
        versions = json.loads(out.decode().strip().splitlines()[-1])
    except Exception as e:
        raise ContainerError(f"image {tag} was built but its Python cannot import torch, triton and the "
                             f"harness: {type(e).__name__}: {str(e)[-500:]}") from None
    if flavor == "cuda" and not versions.get("cuda"):
        raise ContainerError(f"image {tag} holds a CPU build of torch ({versions['torch']}): the CUDA image needs "
                             f"the CUDA build (docker/torch-cuda.txt, from PyPI)")
    if flavor == "cpu" and versions.get("cuda"):
        raise ContainerError(f"image {tag} holds a CUDA build of torch ({versions['torch']}): the CPU image needs "
                             f"the CPU build (docker/torch-cpu.txt)")
    return versions


def build_image(course: manifest.Course, *, gpu: bool = False, base_image: str | None = None,
                tag: str | None = None, log: Callable[[str], None] = print) -> BuiltImage:
    """Build the course's CPU (or, ``gpu=True``, CUDA) grading image; see the module docstring."""
    client = engine()
    flavor = "cuda" if gpu else "cpu"
    tag = tag or image_name(course, gpu)
    t0 = time.monotonic()
    base, notes = resolve_base(client, base_image, flavor, log)
    before = {i.id for i in client.images.list(filters={"dangling": True})}
    with tempfile.TemporaryDirectory(prefix="labs-image-", dir="/var/tmp" if os.access("/var/tmp", os.W_OK) else None) as tmp:
        ctx = Path(tmp)
        notes += write_context(course, flavor, ctx, log)
        log(f"building {tag} on {base} (docker/Dockerfile.{flavor})")
        tail: list[str] = []
        stream = client.api.build(path=str(ctx), dockerfile=f"docker/Dockerfile.{flavor}", tag=tag, rm=True,
                                  forcerm=True, decode=True, network_mode="host", buildargs={"BASE_IMAGE": base},
                                  labels={DIGEST_LABEL: course_digest(course.root), FLAVOR_LABEL: flavor})
        for chunk in stream:
            if "error" in chunk:
                raise ContainerError(f"building {tag} failed: {chunk['error'].strip()}\n" + "".join(tail[-20:]))
            line = chunk.get("stream", "")
            if line.strip():
                tail.append(line)
                if line.startswith("Step "):
                    log(line.strip())
    # the classic builder leaves the build stage's images dangling (and so, once
    # retagged, the previous image): remove those, never what dangled before
    for _ in range(5):
        ours = [i.id for i in client.images.list(filters={"dangling": True}) if i.id not in before]
        for image_id in ours:
            try:
                client.images.remove(image_id)
            except Exception:
                before.add(image_id)  # still in use (a container): leave it
        if not ours:
            break
    versions = check_image(client, tag, flavor)
    size = client.images.get(tag).attrs["Size"]
    return BuiltImage(tag=tag, base=base, size_bytes=size, build_s=time.monotonic() - t0, notes=notes,
                      versions=versions)


# --- grading -----------------------------------------------------------------

def _gpu_runtime() -> bool:
    """Whether this host can hand GPUs to containers (the NVIDIA container toolkit)."""
    return any(shutil.which(p) for p in ("nvidia-container-cli", "nvidia-container-runtime-hook"))


def run(course: manifest.Course, lab: manifest.Lab, impl_root: Path, results: Path, seed: int,
        timeout_s: float | None = None, *, gpu: bool | None = None,
        kill_after_s: float | None = None) -> tuple[dict, str]:
    """Run the lab's graders on ``impl_root`` inside the course image.

    Same contract as ``harness.grading.run``: returns ``(raw results, note)``,
    raises ``GradingError`` when grading cannot run (no engine, no image, the
    graders broken). ``gpu=None`` asks for GPUs when the GPU image exists and
    the host has the NVIDIA container toolkit. The container is killed after
    ``kill_after_s`` (default: the wall-clock limit + ``GRACE_S``) if the limit
    inside did not end the run; what was graded by then is kept."""

    try:
        client = engine()
    except ContainerError as e:
        raise GradingError(f"{e}; grade with --sandbox process, or start the engine") from None
    if gpu is None:
        gpu = _gpu_runtime() and _has_image(client, course.images.gpu)
    name = image_name(course, gpu)
    try:
        image = client.images.get(name)
    except Exception:
        raise GradingError(f"grading image {name} not found; staff: run `labs image build{' --gpu' if gpu else ''}`") from None
    note_stale = ""
    if (image.labels or {}).get(DIGEST_LABEL) != course_digest(course.root):
        note_stale = (f"image {name} was built from another version of the graders or harness; "
                      "it graded with its own (rebuild: `labs image build`)")
    limits = lab.limits
    wall = float(timeout_s or limits.timeout_s)
    kill_after_s = wall + GRACE_S if kill_after_s is None else kill_after_s
    out_dir = Path(tempfile.mkdtemp(prefix="container-results-", dir=results.parent))
    impl_root = Path(impl_root).resolve()
    kwargs = dict(
        # the seed travels in the environment: PID 1's command line is readable by every
        # user in the container (no PID namespace of its own), its environment only by root
        command=["python", "-m", "harness.grading", lab.number, str(wall)],
        network_mode="none", read_only=True, working_dir=COURSE_IN_IMAGE,
        tmpfs={"/tmp": "rw,exec,nosuid,size=2g"}, shm_size="512m",
        mem_limit=f"{limits.memory_mb}m", memswap_limit=f"{limits.memory_mb}m",
        nano_cpus=int(min(limits.cpus, os.cpu_count() or 1) * 1e9), pids_limit=limits.pids,
        cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
        security_opt=["no-new-privileges"],
        volumes={str(impl_root): {"bind": IMPL_MOUNT, "mode": "ro"},
                 str(out_dir): {"bind": RESULTS_MOUNT, "mode": "rw"}},
        environment={"LABS_RESULTS_OWNER": f"{os.getuid()}:{os.getgid()}", "PYTHONDONTWRITEBYTECODE": "1",
                     "LABS_SEED": str(seed)},
        labels={"ai-infra-labs.lab": lab.number, "ai-infra-labs.seed": str(seed)}, detach=True)
    if gpu:
        import docker
        kwargs["device_requests"] = [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    container = client.containers.create(image.id, **kwargs)
    killed, status = False, None
    try:
        container.start()
        try:
            status = container.wait(timeout=kill_after_s)["StatusCode"]
        except Exception:  # requests' ReadTimeout / ConnectionError: the backstop
            killed = True
            try:
                container.kill()
            except Exception:
                pass
        logs = container.logs(tail=40).decode(errors="replace")
    finally:
        try:
            container.remove(force=True)
        except Exception:
            pass
    raw, note = _read_results(out_dir, kill_after_s, killed, status, logs)
    raw = json.loads(json.dumps(raw).replace(IMPL_MOUNT, str(impl_root)))  # host paths in messages
    if note_stale:
        note = f"{note}; {note_stale}" if note else note_stale
    return raw, note


def _read_results(out_dir: Path, kill_after_s: float, killed: bool, status, logs: str) -> tuple[dict, str]:
    """The run's JSON: ``outcome.json`` (written by the run inside when it
    finished), else the results plugin's ``results.json`` (the run was killed)."""

    outcome, partial = out_dir / "outcome.json", out_dir / "results.json"
    try:
        if outcome.is_file():
            data = json.loads(outcome.read_text())
            if "error" in data:
                raise GradingError(data["error"])
            return data["raw"], data["note"]
        if partial.is_file():
            raw = json.loads(partial.read_text())
        else:
            raw = None
    except (OSError, ValueError) as e:
        raise GradingError(f"could not read the grading container's results ({e})") from None
    if killed:
        why = f"the grading container exceeded its {kill_after_s:.0f} s limit and was stopped"
    else:
        why = f"the grading container ended early (exit {status})"
    if raw is None or not raw.get("tests"):
        raise GradingError(f"{why} before any test was collected: {logs[-1500:]}")
    if raw["errors"]:
        raise GradingError("graders failed to collect: " + raw["errors"][0][-1500:])
    return raw, why
