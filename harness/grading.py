"""Grade one submission of one lab with the hidden graders: the grading layer's pipeline.

The pipeline is an ordered list of small steps (nbgrader's converters style):

0. ``take``    a submission's module, found and read once (``find_module``: the
               one rule ``impl.locate``, no links, at most ``MAX_MODULE_BYTES``),
               from a folder or an archive (``archives.unpack``): a ``Module``;
1. ``stage``   write only ``NN/<module>.py`` into a fresh trusted tree; the
               other files of its folder are listed as ignored;
2. ``run``     run ``pytest graders/NN --impl <staged>`` in a separate process
               with a secret seed (``grading_seed``: the course secret and the
               submission's bytes), a wall-clock limit and a per-test limit;
               the results plugin rewrites its JSON after every test, so a
               crash or timeout keeps what was graded;
3. ``score``   turn outcomes into points: a part's points are shared by its
               tests by weight; perf tests are scaled by ``labs.yaml``
               thresholds; GPU tests that could not run score 0, tagged
               ``skipped``, and are left out of ``max_score_runnable``;
4. ``record``  a ``records.GradeResult`` (``grade``, ``grade_module``), or for one
               submission whatever happens a ``records.Graded`` (``grade_one``:
               what ``labs grade-all`` and the course server carry); Gradescope's
               ``results.json`` is its export.

Grading "ran" whenever step 2 produced results, whatever the score; it
*fails* (``GradingError``) when the graders themselves are broken or missing,
and (``InfraFailure``, "grading failed: <reason>") when the run's results are
no grade through no fault of the submission: a test recorded ``infra`` (the
sandbox could not start) or the grader run ended early without reaching its
time limit (the trusted grader crashed). An infrastructure failure is never
a student's 0: ``grade_one`` records it as ``Status.INFRA_ERROR``, with no score.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import io
import json
import os
import secrets
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import archives, container, files, forkserver, impl as _impl, manifest as _manifest
from .errors import GradingError, InfraFailure
from .manifest import Course, Lab, LabPaths
from .records import GradeResult, Graded, Status, TestResult



# --- the grading seed ------------------------------------------------------

SECRET_ENV = "LABS_COURSE_SECRET"
SECRET_FILE = ".labs-staff/course-secret"  # under the course root; git-ignored, never released


def course_secret(course: Course) -> bytes | None:
    """The course's grading secret: ``$LABS_COURSE_SECRET`` when set, else the file
    ``SECRET_FILE`` under the course root, created on first use (32 random bytes, hex,
    mode 0600, written atomically so concurrent graders agree). ``None`` when the file
    cannot be written (a read-only course): each run then draws a fresh seed."""
    env = os.environ.get(SECRET_ENV, "")
    if env:
        return env.encode()
    path = course.root / SECRET_FILE
    try:
        return path.read_bytes().strip() or None
    except FileNotFoundError:
        pass
    except OSError:
        return None
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        files.write_atomic(path, secrets.token_hex(32) + "\n", exclusive=True)  # another grader's first: theirs
        return path.read_bytes().strip() or None
    except OSError:
        return None


def graders_of(course: Course, lab: Lab) -> Path:
    """The hidden graders of ``lab`` (``graders/NN/``). Raises GradingError: in a student
    checkout (no ``graders/`` at all) one that says where grading happens, else one that
    names the missing folder."""
    graders = course.paths(lab).graders
    if graders.is_dir():
        return graders
    if not graders.parent.is_dir():
        raise GradingError(f"lab {lab.number}'s hidden graders are not in a student checkout",
                           hint=f"`labs test {lab.number}` runs the visible tests; your course grades the "
                                f"submission you hand in with the hidden ones")
    raise GradingError(f"no hidden graders for lab {lab.number} ({graders})", hint="check graders/ and labs.yaml")


def grading_seed(secret: bytes | None, lab: Lab, module: bytes) -> int:
    """The 32-bit seed of a graded run: HMAC-SHA256 (RFC 2104) keyed by the course
    ``secret`` over the lab number and the submission's module bytes. The same
    submission always gets the same hidden inputs (a regrade changes a score only when
    the submission or the graders changed); any changed byte gets fresh inputs, and
    without the secret nobody can compute them in advance, so a first submission that
    carries its inputs out through feedback does not help a second. ``secret=None``:
    a fresh random seed."""
    if secret is None:
        return secrets.randbits(32)
    mac = hmac.new(secret, lab.number.encode() + b"\0" + module, hashlib.sha256).digest()
    return int.from_bytes(mac[:4], "big")


# --- step 0: take the module ------------------------------------------------

@dataclass(frozen=True)
class Module:
    """A submission's lab module, found and read once: what the grader stages, the seed
    is drawn from and the course server stores."""
    data: bytes
    path: str = ""                 # where it was found, relative to the submission
    ignored: tuple[str, ...] = ()  # the other files of its folder: not graded

    @property
    def fingerprint(self) -> str:
        """sha256 of the module's bytes: the same module submitted again is the same."""
        return hashlib.sha256(self.data).hexdigest()


def find_module(submission: Path, lab: Lab) -> Module:
    """The lab's module in the folder ``submission``: found by ``impl.locate`` (the one
    rule), read by ``read_module`` (no link, nothing outside, not too large). Raises
    ImplError saying why there is none."""
    src = _impl.locate(submission, lab)
    data = read_module(src, submission)
    ignored = tuple(sorted(str(p.relative_to(src.parent)) for p in src.parent.rglob("*")
                           if p.is_file() and p != src and "__pycache__" not in p.parts))
    return Module(data, src.relative_to(submission).as_posix(), ignored)


def take(source: Path, lab: Lab, workdir: Path, max_bytes: int = archives.DEFAULT_MAX_UNPACKED_MB << 20) -> Module:
    """The module of a submission: a folder, or an archive unpacked into ``workdir``
    (``archives.unpack``'s checks, at most ``max_bytes``). Raises UnpackError or
    ImplError saying why there is none."""
    root = archives.unpack(source, workdir / "unpacked", max_bytes) if source.is_file() else source
    return find_module(root, lab)


MAX_MODULE_BYTES = 1 << 20


def read_module(src: Path, root: Path) -> bytes:
    """The bytes of ``src``, a submission's module file under ``root``, read without
    following a link (``O_NOFOLLOW``). Raises ImplError saying why when it is a symbolic
    link, not a regular file, lies outside ``root`` (through a linked folder), or is
    over ``MAX_MODULE_BYTES``: a graded module is the student's own, plain, small file,
    never something a link points at (a reference solution, a secret)."""
    name = f"{src.parent.name}/{src.name}"
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _impl.ImplError(f"{name} is a symbolic link: refused (submit the file itself)") from None
        raise _impl.ImplError(f"{name} cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _impl.ImplError(f"{name} is not a regular file: refused")
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")  # the file actually opened
        except OSError:
            real = os.path.realpath(src)
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) != base:
            raise _impl.ImplError(f"{name} lies outside the submission folder (a linked folder?): refused")
        data = f.read(MAX_MODULE_BYTES + 1)
    if len(data) > MAX_MODULE_BYTES:
        raise _impl.ImplError(f"{name} is larger than {MAX_MODULE_BYTES >> 20} MiB: refused")
    return data


def pack_module(path: Path, lab: Lab) -> bytes:
    """A gzipped tar holding only ``NN/<module>.py``, read from ``path`` with
    ``read_module``'s checks: what ``labs submit`` uploads to the course server (nothing
    else of a checkout leaves the student's machine)."""
    data = read_module(path, path.parent)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(LabPaths.of(lab).in_impl("").as_posix())
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# --- step 1: stage -------------------------------------------------------------

def stage(module: Module | None, lab: Lab, workdir: Path) -> Path:
    """``workdir/impl``, the trusted tree the graders run on: ``NN/<module>.py`` holding
    ``module``'s bytes, or nothing without a module (every test then fails naming why)."""
    impl_root = workdir / "impl"
    staged = LabPaths.of(lab).in_impl(impl_root)
    staged.parent.mkdir(parents=True)
    if module is not None:
        staged.write_bytes(module.data)
    return impl_root


# --- step 2: run -----------------------------------------------------------

SANDBOXES = ("docker", "process")


def run(course: Course, lab: Lab, impl_root: Path, results: Path, seed: int,
        timeout_s: float | None = None, sandbox: str = "process", select: str | None = None) -> tuple[dict, str]:
    """Run the lab's graders on ``impl_root``: in a child process group
    (``sandbox="process"``), or the same command inside the course's grading
    image (``"docker"``, ``harness.container.run``: no network, resource
    limits, the submission mounted read-only, results returned as JSON).

    ``select``: a pytest ``-k`` expression that keeps only some grader tests (a regrade
    of one test, the framework's own tests); the scores of a selection are not a grade.
    Returns ``(raw results, note)``; note is empty unless the run ended early.
    Raises GradingError when the graders are missing or fail to collect."""
    if sandbox == "docker" and select is not None:
        raise ValueError("select runs in the process sandbox only")
    if sandbox == "docker":
        return container.run(course, lab, impl_root, results, seed, timeout_s)
    if sandbox != "process":
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    graders = graders_of(course, lab)
    timeout_s = timeout_s or lab.limits.timeout_s
    argv = [str(graders), "--impl", str(impl_root), "--sandbox", "worker", "--labs-results", str(results),
            "--rootdir", str(course.root), "-q", "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib",
            f"--timeout={lab.limits.test_timeout_s}"]
    if select is not None:
        argv += ["-k", select]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "LABS_COURSE": str(course.root), "LABS_SEED": str(seed)}
    returncode, out, timed_out = forkserver.run(argv, cwd=course.root, env=env, timeout=timeout_s)
    note = stopped = ""
    if timed_out:
        note = stopped = f"the grader run exceeded its {timeout_s:.0f} s limit and was stopped"
    if not results.exists():
        raise GradingError(f"the grader run produced no results (exit {returncode}): {out[-1500:]}")
    raw = json.loads(results.read_text())
    if raw["errors"]:
        raise GradingError("graders failed to collect: " + raw["errors"][0][-1500:])
    if not raw["tests"]:
        raise GradingError(f"no grader tests collected in {graders}")
    if not note and not raw["finished"]:
        note = f"the grader run ended early (exit code {returncode})"
    raw["stopped"] = stopped  # a record for grade(): stopped at its limit, not crashed
    return raw, note


def infra_failure(raw: dict, note: str = "") -> str:
    """Why ``raw`` (a grader run's results) is no grade through no fault of the
    submission, or ``""``: a test recorded ``infra``, or the run ended early
    without being stopped at its time limit (``raw["stopped"]``)."""
    for t in raw["tests"]:
        if t.get("infra"):
            return f"{t['nodeid']}: {t['infra']}"
    if not raw["finished"] and not raw.get("stopped"):
        return note or "the grader run ended early"
    return ""


# --- step 3: score ---------------------------------------------------------

def score(raw: dict, lab: Lab, note: str = "", partial: bool = False) -> list[TestResult]:
    """Points per test from ``labs.yaml`` parts and the tests' weights (``partial``: a
    selection of the tests, where a part may have none)."""
    tests = raw["tests"]
    for t in tests:
        if t["part"] not in lab.parts:
            raise GradingError(f"grader test {t['nodeid']} has part {t['part']!r}; "
                               f"lab {lab.number} parts are {', '.join(lab.parts)}")
    weight = {p: sum(t["weight"] for t in tests if t["part"] == p) for p in lab.parts}
    for p, w in weight.items():
        if w == 0 and not partial:
            raise GradingError(f"lab {lab.number} part {p} has {lab.parts[p].points} points but no grader test")
    out = []
    for t in tests:
        max_score = lab.parts[t["part"]].points * t["weight"] / weight[t["part"]] if t["weight"] else 0.0
        bonus = lab.parts[t["part"]].bonus
        outcome, message, tags = t["outcome"], t["message"], [f"part {t['part']}"] + (["bonus"] if bonus else [])
        frac = 1.0 if outcome == "passed" else 0.0
        if outcome == "pending":
            outcome, message = "not run", f"not run: {note or 'the grader run ended before this test'}"
        if outcome == "skipped":
            tags.append("skipped")
            message = f"skipped: {message.removeprefix('Skipped: ')}"
        if t["gpu"]:
            tags.append("gpu")
        for p in t["perf"]:
            threshold = lab.perf.get(p["name"])
            if t["perf"] and threshold is not None and outcome == "passed":
                frac *= threshold.credit(p["ratio"])
                lo, hi = p.get("ratio_lo"), p.get("ratio_hi")
                interval = f" (interval {lo:.3f}-{hi:.3f})" if isinstance(lo, float) and isinstance(hi, float) else ""
                message = (f"{p['name']}: {p['ratio']:.3f}x the baseline's time{interval} (baseline: {threshold.baseline}); full credit at "
                           f"<= {threshold.full_credit}x, none at >= {threshold.zero_credit}x, "
                           f"{threshold.bands} equal bands between, each worth the credit at its middle")
        out.append(TestResult(name=t["name"], nodeid=t["nodeid"], part=t["part"], max_score=max_score,
                              score=max_score * frac, outcome=outcome, output=message,
                              duration_s=t["duration"], tags=tags, perf=t["perf"], bonus=bonus,
                              impl_error=t.get("impl_error") or ""))
    return out


# --- the pipeline ----------------------------------------------------------

def grade(submission: Path | str, lab: Lab, course: Course, *, seed: int | None = None,
          timeout_s: float | None = None, sandbox: str = "process", select: str | None = None) -> GradeResult:
    """Grade the code at ``submission`` (a checkout, a directory with ``NN/<module>.py``,
    an upload: the module is found by ``find_module``) for ``lab``: ``grade_module``.
    A missing, ambiguous or refused module is a note (every test fails naming it), not
    an error. Raises FileNotFoundError when ``submission`` is not a directory."""
    submission = Path(submission).resolve()
    if not submission.is_dir():
        raise FileNotFoundError(f"submission {submission} is not a directory")
    try:
        module, notes = find_module(submission, lab), []
    except _impl.ImplError as e:
        module, notes = None, [str(e)]
    return grade_module(module, lab, course, submission=str(submission), notes=notes, seed=seed,
                        timeout_s=timeout_s, sandbox=sandbox, select=select)


def grade_module(module: Module | None, lab: Lab, course: Course, *, submission: str, notes: list[str] = (),
                 seed: int | None = None, timeout_s: float | None = None, sandbox: str = "process",
                 select: str | None = None) -> GradeResult:
    """Grade ``module`` (None: there is none, ``notes`` say why) for ``lab``; ``submission``
    names it in the result and in messages (never the temporary copy). ``sandbox`` is
    where the graders run: ``"process"`` (a local child process) or ``"docker"`` (the
    course's grading image; see ``run``); ``select``: only the grader tests a pytest
    ``-k`` expression keeps (see ``run``).

    ``seed`` defaults to ``grading_seed`` of the course secret and the module (kept in
    the result and printed by ``labs grade`` so staff can replay a disputed grade; never
    in Gradescope's results.json). Raises GradingError when grading cannot run
    (InfraFailure when the infrastructure failed: see ``infra_failure``)."""
    if sandbox != "docker":  # the image holds its own graders; here first: a student checkout has none
        graders_of(course, lab)  # (and then no secret is made)
    notes = list(notes)
    if module is not None and module.ignored:
        notes.append(f"graded only {LabPaths.of(lab).in_impl('')}; ignored {len(module.ignored)} other file(s) "
                     f"in its folder")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="labs-grade-") as tmp:
        work = Path(tmp)
        impl_root = stage(module, lab, work)
        if seed is None:
            seed = grading_seed(course_secret(course), lab, module.data if module is not None else b"")
        raw, note = run(course, lab, impl_root, work / "results.json", seed, timeout_s, sandbox, select)
    reason = infra_failure(raw, note)
    if reason:
        raise InfraFailure(reason.replace(str(impl_root), submission))
    if note:
        notes.append(note)
    tests = score(raw, lab, note, partial=select is not None)
    for t in tests:  # name the submission, not the temporary copy, in messages
        t.output = t.output.replace(str(impl_root), submission)
    return GradeResult(lab=lab.number, submission=submission, seed=seed, tests=tests,
                       duration_s=time.monotonic() - t0, notes=notes,
                       ignored=list(module.ignored) if module is not None else [],
                       module=module.path if module is not None else "", stopped=note if raw.get("stopped") else "")


def grade_one(source: Path | Module, lab: Lab, course: Course, *, label: str | None = None,
              timeout_s: float | None = None, sandbox: str | None = None,
              max_bytes: int = archives.DEFAULT_MAX_UNPACKED_MB << 20, seed: int | None = None) -> Graded:
    """Grade one submission, whatever happens, into its ``Graded`` record: ``source`` is a
    folder or an archive (``take``), or a ``Module`` taken before (the course server's
    stored one). ``label`` names it in messages (default: the folder, ``<archive name>``,
    ``<submission>``). Never raises: the student's error (an unpack error, no module),
    a timeout and an infrastructure failure (the sandbox could not start, the graders
    are broken, a harness bug) are each a record with its ``Status``."""
    t0 = time.monotonic()
    try:
        graded = _grade_one(source, lab, course, label=label, timeout_s=timeout_s, sandbox=sandbox,
                            max_bytes=max_bytes, seed=seed)
    except Exception as e:  # a harness failure: not the submission's fault, graded again
        graded = Graded(lab.number, f"grading error: {type(e).__name__}: {e}", Status.INFRA_ERROR, lab.points,
                        scored=False)
    graded.duration_s = time.monotonic() - t0
    return graded


def _grade_one(source: Path | Module, lab: Lab, course: Course, *, label, timeout_s, sandbox, max_bytes,
               seed) -> Graded:
    refused = lambda status: Graded(lab.number, status, Status.STUDENT_ERROR, lab.points)
    failed = lambda status: Graded(lab.number, status, Status.INFRA_ERROR, lab.points, scored=False)
    with tempfile.TemporaryDirectory(prefix=f"labs-one-{lab.number}-") as tmp:
        if isinstance(source, Module):
            module, label = source, label or "<submission>"
        else:
            label = label or (f"<{source.name}>" if source.is_file() else str(source))
            try:
                module = take(source, lab, Path(tmp), max_bytes)
            except archives.UnpackError as e:
                return refused(f"unpack error: {source.name}: {e}")
            except _impl.ImplError as e:  # none, two equally deep, a link (to a reference, a secret), a huge file
                return refused(f"no module: {str(e).replace(tmp, label)}")
        kwargs = {"sandbox": sandbox} if sandbox is not None else {}
        try:
            result = grade_module(module, lab, course, submission=label, seed=seed, timeout_s=timeout_s, **kwargs)
        except InfraFailure as e:  # not the student's fault: no score, graded again
            return failed(f"infra_error: {e.reason}")
        except GradingError as e:
            return failed(f"grading error: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    return Graded.of(result, lab.points)


def gpu_points(course: Course, lab: Lab) -> float:
    """Points of ``lab`` (bonus parts aside) that only a GPU can earn: its grader tests
    marked ``gpu``, weighted as ``grading.score`` does. Without graders (a student
    checkout): labs.yaml's ``gpu_points``, which ``labs release`` writes. Raises
    GradingError when the graders fail to collect (never a silent 0). One ``pytest --collect-only`` of every lab's graders, cached in
    ``.labs-staff/gpu-points.json`` by the graders' and labs.yaml's bytes."""
    root = course.root
    graders = sorted(p for p in (root / "graders").rglob("*.py") if "__pycache__" not in p.parts) \
        if (root / "graders").is_dir() else []
    if not course.paths(lab).graders.is_dir():
        return course.gpu_points.get(lab.number, 0.0)
    key = hashlib.sha256((root / _manifest.MANIFEST).read_bytes())
    for p in graders:
        key.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes())
    cache = root / _manifest.STAFF_DIR / "gpu-points.json"
    try:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key.hexdigest():
            return cached["points"].get(lab.number, 0.0)
    except (OSError, ValueError, AttributeError):
        pass
    points = {}
    with tempfile.TemporaryDirectory(prefix="labs-collect-") as tmp:
        out = Path(tmp) / "collected.json"
        cmd = [sys.executable, "-m", "pytest", str(root / "graders"), "--collect-only", "-q", "--labs-results",
               str(out), "--rootdir", str(root), "-p", "no:cacheprovider", "-o", "addopts=--import-mode=importlib"]
        env = {**os.environ, "LABS_COURSE": str(root), "LABS_PROGRESS": "off"}
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        try:
            raw = json.loads(out.read_text())
        except (OSError, ValueError):
            raise GradingError("cannot count the points that need a GPU: collecting graders/ wrote no results: "
                               + " ".join((p.stdout + p.stderr).split()[-30:]),
                               hint="`pytest graders --collect-only` shows why") from None
    for num, spec in course.labs.items():
        tests = [t for t in raw["tests"] if f"/{LabPaths.of(spec).graders.as_posix()}/" in "/" + t["nodeid"]]
        try:
            scored = score({"tests": tests}, spec)
        except GradingError:
            continue
        points[num] = round(sum(t.max_score for t in scored if "gpu" in t.tags and not t.bonus), 1)
    try:
        cache.parent.mkdir(mode=0o700, exist_ok=True)
        files.write_json(cache, {"key": key.hexdigest(), "points": points})
    except OSError:
        pass
    return points.get(lab.number, 0.0)


# --- inside the container ------------------------------------------------------

def _inside(argv: list[str]) -> int:
    """``python -m harness.grading LAB WALL_S`` with ``LABS_SEED`` in the environment,
    run by ``container.run`` in the image: the in-process grading path, its outcome
    written to /results as JSON."""
    number, wall = argv[0], float(argv[1])
    seed = int(os.environ.pop("LABS_SEED"))
    out = Path(container.RESULTS_MOUNT)
    try:
        course = _manifest.load(container.COURSE_IN_IMAGE)
        lab = course.lab(number)
        raw, note = run(course, lab, Path(container.IMPL_MOUNT), out / "results.json", seed, timeout_s=wall,
                        sandbox="process")
        data = {"raw": raw, "note": note}
    except (GradingError, _manifest.ManifestError, KeyError) as e:
        data = {"error": str(e).strip("'\"")}
    files.write_json(out / "outcome.json", data)
    owner = os.environ.get("LABS_RESULTS_OWNER", "")
    if owner and os.geteuid() == 0:  # let a non-root host user read what root wrote
        uid, gid = (int(x) for x in owner.split(":"))
        for f in out.iterdir():
            os.chown(f, uid, gid)
    return 0


if __name__ == "__main__":
    sys.exit(_inside(sys.argv[1:]))
